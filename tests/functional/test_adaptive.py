"""Adaptive server-optimizer formulas (lit_asyncfl.functional.adaptive: FADAS's AMSGrad direction and delay-adaptive
learning rate) by hand and against torch.optim.Adam."""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncfl.functional.adaptive import amsgrad_direction, delay_adaptive_lr


def test_amsgrad_direction_two_steps_by_hand():
    b1, b2, eps = 0.9, 0.99, 1e-8
    z = torch.zeros(1)
    first = amsgrad_direction(torch.tensor([0.2]), z, z, z, 1, b1, b2, eps)
    m1, v1 = 0.1 * 0.2, 0.01 * 0.04
    assert first.first_moment.item() == pytest.approx(m1) and first.second_moment.item() == pytest.approx(v1)
    assert first.direction.item() == pytest.approx(m1 / (math.sqrt(v1) + eps))
    second = amsgrad_direction(torch.tensor([0.01]), *first[1:], 2, b1, b2, eps)
    m2, v2 = 0.9 * m1 + 0.1 * 0.01, 0.99 * v1 + 0.01 * 1e-4
    assert second.second_moment.item() == pytest.approx(v2)
    assert second.max_second_moment.item() == pytest.approx(v1)  # v fell: AMSGrad keeps the maximum
    assert second.direction.item() == pytest.approx(m2 / (math.sqrt(v1) + eps))
    adam = amsgrad_direction(torch.tensor([0.01]), *first[1:], 2, b1, b2, eps, amsgrad=False)
    assert adam.direction.item() == pytest.approx(m2 / (math.sqrt(v2) + eps))  # FedAdam: v itself
    with pytest.raises(ValueError, match="step must be >= 1"):
        amsgrad_direction(torch.tensor([0.2]), z, z, z, 0)


@pytest.mark.parametrize("amsgrad", [True, False], ids=["amsgrad", "adam"])
def test_bias_corrected_direction_equals_torch_adam(amsgrad):
    """With bias corrections the step is torch.optim.Adam's on the gradient -Delta (an independent implementation)."""
    torch.manual_seed(0)
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    param = torch.nn.Parameter(torch.randn(5))
    optimizer = torch.optim.Adam([param], lr=lr, betas=(b1, b2), eps=eps, amsgrad=amsgrad)
    ours = param.detach().clone()
    m = v = v_hat = torch.zeros(5)
    for step in range(1, 8):
        delta = torch.randn(5) * (2.0 if step % 3 == 0 else 0.3)  # the second moment falls sometimes
        param.grad = -delta
        optimizer.step()
        d, m, v, v_hat = amsgrad_direction(delta, m, v, v_hat, step, b1, b2, eps, amsgrad, bias_correction=True)
        ours = ours + lr * d
        assert torch.allclose(ours, param.detach(), rtol=1e-6, atol=1e-7), step


@pytest.mark.parametrize(
    "lr, max_staleness, threshold, expected",
    [
        (0.01, 0, 1, 0.01),
        (0.01, 1, 1, 0.01),  # at the threshold: unchanged
        (0.01, 2, 1, 0.005),
        (0.01, 10, 1, 0.001),
        (0.01, 10, None, 0.01),  # no delay adaptation
        (1.0, 4, 0, 0.25),  # eta = 1: the paper's min(eta, 1 / tau) agrees
    ],
)
def test_delay_adaptive_lr_by_hand(lr, max_staleness, threshold, expected):
    assert delay_adaptive_lr(lr, max_staleness, threshold) == pytest.approx(expected)
