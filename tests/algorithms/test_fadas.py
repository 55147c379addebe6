"""FADAS: whole runs replayed by hand from the recorded uploads (with and without bias correction)."""

from __future__ import annotations

import pytest
import torch
from builders import recorded_run

from lit_asyncfl.algorithms import FADAS


@pytest.mark.parametrize("bias_correction", [False, True], ids=["paper", "authors-code"])
def test_fadas_run_replayed_from_the_recorded_uploads(tmp_path, bias_correction):
    # eps = 1e-4: with 1e-8 a coordinate the clients barely move (|Delta| ~ 1e-9) gets a full-size step whose sign
    # is float32 rounding, and no replay could match it; the formula is the same
    m, lr, b1, b2, eps, tau_c = 2, 0.02, 0.9, 0.99, 1e-4, 1
    algo = FADAS(buffer_size=m, server_lr=lr, eps=eps, concurrency=5, bias_correction=bias_correction)
    record = recorded_run(tmp_path, algo, max_versions=10)
    assert [v["count"] for v in record.versions] == [m] * len(record.versions)
    weights = record.versions[0]["before"].clone()
    first = second = maximum = torch.zeros_like(weights)
    rates = []
    for t, version in enumerate(record.versions, start=1):
        buffered = record.uploads[(t - 1) * m : t * m]
        delta = sum(u["weights"] - u["base"] for u in buffered) / m  # Delta_t, from the uploads
        first = b1 * first + (1 - b1) * delta
        second = b2 * second + (1 - b2) * delta * delta
        maximum = torch.maximum(maximum, second)
        if bias_correction:
            direction = (first / (1 - b1**t)) / ((maximum / (1 - b2**t)).sqrt() + eps)
        else:
            direction = first / (maximum.sqrt() + eps)
        tau_max = max(u["staleness"] for u in buffered)
        rates.append(lr if tau_max <= tau_c else lr / tau_max)
        weights = weights + rates[-1] * direction
        # float32 rounding of the sum of deltas, amplified by 1/sqrt(v) on coordinates that barely move: 1e-3 of a step
        assert torch.allclose(version["after"], weights, rtol=0, atol=1e-3 * lr), t
    assert min(rates) < lr  # the delay adaptation was exercised
