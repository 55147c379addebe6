"""ASO-Fed's formulas (lit_asyncfl.functional.asofed) by hand."""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncfl.functional.asofed import asofed_correction, asofed_step_size


def test_asofed_correction_over_three_jobs_by_hand():
    beta = 0.25
    s1, s2, s3 = torch.tensor([4.0, -2.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 3.0])
    z1, h1 = asofed_correction(s1, None, None, beta)
    assert torch.equal(z1, s1) and torch.equal(h1, torch.zeros(2))  # first job: the pseudo-gradient itself
    z2, h2 = asofed_correction(s2, s1, h1, beta)
    assert torch.allclose(z2, torch.tensor([1 - 4.0, 1 + 2.0]))  # s2 - s1 + 0
    assert torch.allclose(h2, 0.75 * s1)  # beta * 0 + (1 - beta) * s1
    z3, h3 = asofed_correction(s3, s2, h2, beta)
    assert torch.allclose(z3, torch.tensor([0 - 1 + 3.0, 3 - 1 - 1.5]))
    assert torch.allclose(h3, 0.25 * 0.75 * s1 + 0.75 * s2)
    with pytest.raises(ValueError, match=r"ASO-Fed beta must be in \[0, 1\], got 1.5"):
        asofed_correction(s1, None, None, 1.5)


@pytest.mark.parametrize(
    "mean, base, expected",
    [(0.0, math.e, 1.0), (1.0, math.e, 1.0), (math.e, math.e, 1.0), (math.e**3, math.e, 3.0), (50.0, math.e,
     math.log(50.0)), (50.0, 10.0, math.log10(50.0)), (5.0, 10.0, 1.0), (10_000.0, 10.0, 4.0)],
)  # fmt: skip
def test_asofed_step_size_by_hand(mean, base, expected):
    assert asofed_step_size(mean, base) == pytest.approx(expected)
