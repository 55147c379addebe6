"""Calibration formulas (lit_asyncfl.functional.calibration: FedFa's sliding window, CA2FL's calibrated update) by
hand."""

from __future__ import annotations

import pytest
import torch

from lit_asyncfl.functional.calibration import calibrated_update, calibration_residual, sliding_window_average


def test_sliding_window_average_by_hand():
    models = [torch.tensor([1.0, 0.0]), torch.tensor([2.0, 3.0]), torch.tensor([6.0, 3.0])]
    assert torch.allclose(sliding_window_average(models), torch.tensor([3.0, 2.0]))
    weighted = sliding_window_average(models, [1.0, 1.0, 2.0])  # (1 + 2 + 12) / 4, (0 + 3 + 6) / 4
    assert torch.allclose(weighted, torch.tensor([3.75, 2.25]))
    with pytest.raises(ValueError, match="window is empty"):
        sliding_window_average([])


def test_calibrated_update_by_hand():
    # h_t = [1, 0]; two buffered clients: residuals (Delta - h^i) = [2, 2] - [1, 1] and [0, -4] - 0
    residuals = [calibration_residual(torch.tensor([2.0, 2.0]), torch.tensor([1.0, 1.0])),
                 calibration_residual(torch.tensor([0.0, -4.0]), None)]  # fmt: skip
    assert torch.equal(residuals[0], torch.tensor([1.0, 1.0])) and torch.equal(residuals[1], torch.tensor([0.0, -4.0]))
    v = calibrated_update(torch.tensor([1.0, 0.0]), residuals)
    assert torch.allclose(v, torch.tensor([1.0 + 0.5, 0.0 - 1.5]))
    assert torch.allclose(calibrated_update(None, residuals), torch.tensor([0.5, -1.5]))  # h_1 = 0: FedBuff
