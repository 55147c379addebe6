r"""Aggregation rules on flat weight vectors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def mix(global_weights: Tensor, client_weights: Tensor, alpha: float) -> Tensor:
    r"""Mix a client model into the global model (FedAsync, FedASMU Formula 1, FedADT).

    .. math:: w_{t+1} = (1 - \alpha) w_t + \alpha w_i

    Computed with :func:`torch.lerp`, which returns ``client_weights`` exactly when ``alpha = 1``.

    Example:
        >>> mix(torch.tensor([0.0, 2.0]), torch.tensor([4.0, 2.0]), 0.25)
        tensor([1., 2.])
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"mixing weight alpha must be in [0, 1], got {alpha}")
    return torch.lerp(global_weights, client_weights, alpha)


def weighted_average(tensors: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    r"""Weighted mean :math:`\sum_i p_i x_i` with :math:`p_i = w_i / \sum_j w_j`.

    The weights are normalised before multiplying, so a single tensor is returned exactly.

    Example:
        >>> weighted_average([torch.tensor([1.0]), torch.tensor([4.0])], [3, 1])
        tensor([1.7500])
    """
    if len(tensors) == 0 or len(tensors) != len(weights):
        raise ValueError(f"need one weight per tensor and at least one tensor, got {len(tensors)} and {len(weights)}")
    total = float(sum(weights))
    if not total > 0:
        raise ValueError(f"weights must sum to a positive number, got {list(weights)}")
    out = tensors[0] * (weights[0] / total)
    for tensor, weight in zip(tensors[1:], weights[1:]):
        out.add_(tensor, alpha=weight / total)
    return out
