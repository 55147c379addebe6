"""The job's ``self.log`` stand-in: its fast path for ``self.log(name, tensor)`` keeps Lightning's reductions and
refusals bit for bit."""

from __future__ import annotations

import math
import random
import struct

import pytest
import torch

from lit_asyncfl.loops.stand_in import JobLog, _Entry


def float32_weighted_mean(values: list[float], sizes: list[int]) -> float:
    """Lightning's ``_ResultMetric`` mean, written out: each value as a one-element mean, times its batch size,
    summed in float32, divided by the float32 sum of the batch sizes."""
    total, weight = None, torch.tensor(0.0)
    for value, size in zip(values, sizes):
        term = torch.tensor(value, dtype=torch.float32).mean() * size
        total = term if total is None else total + term
        weight = weight + size
    assert total is not None
    return float(total / weight)


def same_bits(a: float, b: float) -> bool:
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


def test_a_plain_log_reduces_bit_for_bit_as_lightning_also_zeros_infinities_and_tiny_values():
    rng = random.Random(0)
    special = [0.0, -0.0, math.inf, -math.inf, 1e-45, -1e-45, 3.4e38, -3.4e38, math.nan]
    for _ in range(2000):
        n = rng.randint(1, 4)
        values = [rng.choice(special) if rng.random() < 0.3 else rng.gauss(0, 1) * 10 ** rng.randint(-30, 30)
                  for _ in range(n)]  # fmt: skip
        sizes = [rng.randint(1, 64) for _ in range(n)]
        log = JobLog()
        for value, size in zip(values, sizes):
            log.batch = torch.zeros(size, 2)
            log.log("loss", torch.tensor(value, requires_grad=True) * 1.0)  # a loss with its graph
        assert same_bits(log.results()[0]["loss"], float32_weighted_mean(values, sizes)), (values, sizes)


def test_the_entry_fast_path_equals_the_general_one_on_negative_zero():
    fast, general = _Entry("mean"), _Entry("mean")
    fast.update(torch.tensor(-0.0), 3)
    general.update(torch.tensor([-0.0]), 3)  # one element but not 0-d: the general path
    assert same_bits(fast.compute(), general.compute()) and same_bits(fast.compute(), 0.0)


def test_plain_and_explicit_calls_share_their_checks():
    log = JobLog()
    log.batch = torch.zeros(2, 1)
    log.log("loss", torch.tensor(1.0), on_epoch=False, on_step=True)  # ignored by a job: the plain path
    with pytest.raises(ValueError, match="different reduce_fx"):
        log.log("loss", torch.tensor(1.0), reduce_fx="sum")
    log = JobLog()
    log.log("top", torch.tensor(1.0), reduce_fx="max")
    with pytest.raises(ValueError, match="different reduce_fx"):
        log.log("top", torch.tensor(2.0))  # a plain call after a max: refused as before
    with pytest.raises(ValueError, match="single element"):
        JobLog().log("vector", torch.ones(3))
    log = JobLog()
    log.batch = torch.zeros(4, 1)
    log.log("a", torch.tensor(2.0))
    log.log("a", torch.tensor(4.0), batch_size=2)  # an explicit batch size goes the general way into one entry
    assert log.results()[0] == {"a": pytest.approx((2 * 4 + 4 * 2) / 6)}


def test_a_mean_of_mixed_values_and_batch_sizes_reduces_bit_for_bit_as_lightning():
    rng = random.Random(1)
    special = [0.0, -0.0, math.inf, -math.inf, 1e-45, 3.4e38, math.nan]
    kinds = [lambda v: torch.tensor(v), lambda v: torch.tensor([v]), lambda v: torch.tensor(v, dtype=torch.float64)]
    for _ in range(2000):
        n = rng.randint(1, 5)
        values = [rng.choice(special) if rng.random() < 0.2 else rng.gauss(0, 1) * 10 ** rng.randint(-30, 30)
                  for _ in range(n)]  # fmt: skip
        tensors = [rng.choice(kinds)(value) for value in values]
        sizes = [rng.randint(1, 64) if rng.random() < 0.8 else rng.uniform(0.5, 9.5) for _ in range(n)]
        entry = _Entry("mean")
        total, weight = None, torch.tensor(0.0)
        for tensor, size in zip(tensors, sizes):
            entry.update(tensor, size)
            term = tensor.float().mean() * size  # Lightning's _ResultMetric, written out
            total = term if total is None else total + term
            weight = weight + size
        assert same_bits(entry.compute(), float(total / weight)), (tensors, sizes)
