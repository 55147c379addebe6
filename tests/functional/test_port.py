"""PORT's formulas (lit_asyncfl.functional.port) by hand."""

from __future__ import annotations

import pytest
import torch

from lit_asyncfl.functional.port import port_similarity, port_staleness_factor, port_weight


@pytest.mark.parametrize("staleness, bound, expected", [(0, 10, 1.0), (5, 10, 10 / 15), (10, 10, 0.5), (3, 1, 0.25)])
def test_port_staleness_factor_by_hand(staleness, bound, expected):
    assert port_staleness_factor(staleness, bound) == pytest.approx(expected)


def test_port_similarity_and_weight_by_hand():
    g = torch.tensor([3.0, 4.0])
    assert port_similarity(g, torch.tensor([3.0, 4.0])) == pytest.approx(1.0)
    assert port_similarity(g, torch.tensor([-4.0, 3.0])) == pytest.approx(0.5)  # orthogonal
    assert port_similarity(g, torch.tensor([0.0, 5.0])) == pytest.approx((1 + 0.8) / 2)
    assert port_similarity(g, torch.zeros(2)) == pytest.approx(0.5)  # eps-guarded zero vector: cosine 0
    assert port_weight(0.9, 0.5, similarity_weight=1.0, staleness_weight=3.0) == pytest.approx(0.9 + 1.5)
    with pytest.raises(ValueError, match="staleness must be >= 0, got -1"):
        port_staleness_factor(-1, 10)
