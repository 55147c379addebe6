"""Aggregation formulas (:mod:`lit_asyncfl.functional.aggregation`) against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from lit_asyncfl.functional import (
    mix,
    weighted_average,
)


def test_mix_is_the_convex_combination_and_exact_at_one():
    w = torch.tensor([1.0, -2.0, 3.0])
    wi = torch.tensor([3.0, 2.0, 3.0])
    assert torch.allclose(mix(w, wi, 0.25), torch.tensor([1.5, -1.0, 3.0]))
    client = torch.randn(1000)
    assert torch.equal(mix(torch.randn(1000), client, 1.0), client)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        mix(w, wi, 1.5)


def test_weighted_average_normalises_weights():
    a, b = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 4.0])
    # (3*a + 1*b) / 4 = [1.5, 1.0]
    assert torch.allclose(weighted_average([a, b], [3.0, 1.0]), torch.tensor([1.5, 1.0]))
    single = torch.randn(100)
    assert torch.equal(weighted_average([single], [37.0]), single)
    with pytest.raises(ValueError, match="positive"):
        weighted_average([a, b], [0.0, 0.0])
