"""FedCompass (Li et al., ICLR 2024): the Compass scheduler's speed estimate and step assignments, and its update.

Symbols: :math:`Q_{min}, Q_{max}` the bounds of a job's local steps, :math:`\\lambda` the latest-arrival factor,
:math:`\\hat v_i` client :math:`i`'s estimated time per local step, :math:`s(\\tau) = (\\tau + 1)^{-a}` the
staleness factor (:func:`~lit_asyncfl.functional.staleness.polynomial_staleness`, the authors' ``polynomial``),
:math:`\\alpha` the mixing rate, :math:`N` the number of clients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import Tensor

from lit_asyncfl.functional.staleness import polynomial_staleness


def speed_estimate(previous: float | None, elapsed: float, steps: int, momentum: float) -> float:
    r"""Time per local step :math:`\hat v_i \leftarrow (1 - m) \hat v_i + m \cdot elapsed / Q_i` (the first job's
    own rate when nothing was estimated yet).

    Example:
        >>> speed_estimate(None, 10.0, 5, 0.9), speed_estimate(2.0, 40.0, 10, 0.5)
        (2.0, 3.0)
    """
    rate = elapsed / steps
    return rate if previous is None else (1.0 - momentum) * previous + momentum * rate


def join_steps(remaining: float, speed: float, q_min: int, q_max: int) -> int | None:
    r"""Steps that bring a client to a group's expected arrival, :math:`\lfloor remaining / \hat v_i \rfloor`,
    when within :math:`[Q_{min}, Q_{max}]`; else ``None`` (it cannot join that group).

    Example:
        >>> join_steps(50.0, 2.0, 20, 100), join_steps(30.0, 2.0, 20, 100), join_steps(500.0, 2.0, 20, 100)
        (25, None, None)
    """
    steps = math.floor(remaining / speed)
    return steps if q_min <= steps <= q_max else None


def new_group_steps(
    now: float, speed: float, open_groups: Sequence[tuple[float, float]], q_min: int, q_max: int
) -> int:
    r"""Local steps of a client that opens a new group: for every group still open (its latest arrival
    :math:`T^{latest}_g > now`), the steps that bring the client to :math:`T^{latest}_g + \hat v^{fast}_g Q_{max}`
    (when the fastest member of that group could arrive again); the largest of those within :math:`Q_{max}`,
    raised to :math:`Q_{min}`; :math:`Q_{max}` when there is none.

    Args:
        now: Current time.
        speed: The client's time per step.
        open_groups: ``(latest_arrival, fastest_member_speed)`` of the groups still open.
        q_min: :math:`Q_{min}`.
        q_max: :math:`Q_{max}`.

    Example:
        >>> new_group_steps(0.0, 1.0, [(30.0, 0.5)], 20, 100)  # floor(30 + 0.5 * 100) = 80
        80
        >>> new_group_steps(0.0, 1.0, [(5.0, 0.1)], 20, 100), new_group_steps(0.0, 1.0, [], 20, 100)
        (20, 100)
    """
    assigned = -1
    for latest, fastest in open_groups:
        if now < latest:
            steps = math.floor((latest + fastest * q_max - now) / speed)
            if steps <= q_max:
                assigned = max(assigned, steps)
    if assigned < 0:
        return q_max
    return max(assigned, q_min)


def compass_update(
    weights: Tensor, deltas: Sequence[Tensor], staleness: Sequence[int], alpha: float, a: float, num_clients: int
) -> Tensor:
    r""":math:`w \leftarrow w + \sum_{i \in \mathcal{G}} \frac{\alpha\, s(\tau_i)}{N} \Delta_i` over the updates
    :math:`\mathcal{G}` aggregated together (an arrival group and the late updates buffered since).

    Example:
        >>> import torch
        >>> compass_update(torch.zeros(1), [torch.ones(1), torch.ones(1)], [0, 3], 0.9, 0.5, 3)
        tensor([0.4500])
    """
    out = weights.clone()
    for delta, tau in zip(deltas, staleness, strict=True):
        out.add_(delta, alpha=alpha * polynomial_staleness(tau, a) / num_clients)
    return out
