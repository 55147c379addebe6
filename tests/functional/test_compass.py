"""FedCompass's formulas (lit_asyncfl.functional.compass) against hand values."""

from __future__ import annotations

import math

import torch

from lit_asyncfl.functional.compass import compass_update, join_steps, new_group_steps, speed_estimate


def test_compass_formulas_by_hand():
    assert speed_estimate(None, 12.0, 4, 0.9) == 3.0
    assert math.isclose(speed_estimate(3.0, 20.0, 4, 0.9), 0.1 * 3.0 + 0.9 * 5.0)
    assert join_steps(41.0, 2.0, 20, 100) == 20 and join_steps(39.0, 2.0, 20, 100) is None
    assert join_steps(202.0, 2.0, 20, 100) is None and join_steps(200.0, 2.0, 20, 100) == 100
    # two open groups: (latest 10, fastest 0.2) -> floor((10 + 20 - 0) / 1) = 30; (latest 50, 0.1) -> 60: max 60
    assert new_group_steps(0.0, 1.0, [(10.0, 0.2), (50.0, 0.1)], 20, 100) == 60
    assert new_group_steps(0.0, 1.0, [(200.0, 1.0)], 20, 100) == 100  # beyond Q_max: none qualifies -> Q_max
    assert new_group_steps(20.0, 1.0, [(10.0, 0.2)], 20, 100) == 100  # the group is closed (latest passed)
    assert new_group_steps(0.0, 1.0, [(3.0, 0.05)], 20, 100) == 20  # 8 steps raised to Q_min
    deltas = [torch.tensor([4.0, 0.0]), torch.tensor([0.0, 4.0])]
    w = compass_update(torch.tensor([1.0, 1.0]), deltas, [0, 8], 0.5, 0.5, 4)
    assert torch.allclose(w, torch.tensor([1.0 + 0.5 * 4 / 4, 1.0 + 0.5 * (1 / 3) * 4 / 4]))
