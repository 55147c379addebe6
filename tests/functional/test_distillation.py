"""Distillation formulas (lit_asyncfl.functional.distillation, FedADT): the loss by hand, the adaptive weight's
ramp."""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncfl.functional.distillation import adaptive_distillation_weight, distillation_loss
from lit_asyncfl.server.distillation import DistillationCorrection


def test_distillation_loss_equals_a_hand_computation():
    student = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 1.5]])
    teacher = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    y = torch.tensor([1, 2])
    a, temp = 0.3, 2.0

    def softmax(z):
        e = [math.exp(v) for v in z]
        return [v / sum(e) for v in e]

    kl = ce = 0.0
    for s_row, t_row, label in zip(student.tolist(), teacher.tolist(), y.tolist()):
        p = softmax([v / temp for v in t_row])
        q = softmax([v / temp for v in s_row])
        kl += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
        ce += -math.log(softmax(s_row)[label])
    expected = a * kl / 2 + (1 - a) * ce / 2  # both averaged over the batch of 2
    assert float(distillation_loss(student, teacher, y, a, temp)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("t", "expected"), [(0, 0.2), (500, 0.4), (1000, 0.6), (2000, 0.6)])
def test_adaptive_weight_at_0_half_full_and_twice_the_ramp(t, expected):
    assert adaptive_distillation_weight(t, 0.2, 0.6, 1000) == pytest.approx(expected)
    assert DistillationCorrection(weight_min=0.2, weight_max=0.6, ramp_versions=1000).weight(t) == pytest.approx(
        expected
    )
    assert DistillationCorrection(fixed_weight=0.6).weight(t) == 0.6
