"""Device selection for round-based schedulers: which idle devices receive the global model this round.

A selection sees the candidates (idle devices), how many to pick, and each device's expected latency this round;
it learns from every arrival (:meth:`Selection.observe`). Used by :class:`~lit_asyncfl.schedulers.SemiAsyncRounds`
(ASFL: utility; Oort: utility with a system penalty; FedCS: a latency deadline; SAFA: random).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_asyncfl.checks import check_number
from lit_asyncfl.functional.asfl import device_utility

#: :class:`OortSelection`'s system penalty exponent by default (Oort's 2), which Oort's preset repeats by name.
PENALTY = 2.0


class Selection:
    """Base class: pick ``count`` devices uniformly at random among the candidates."""

    def on_fit_start(self, num_clients: int) -> None:
        """Reset what was learnt about the devices."""

    def observe(self, client: int, num_samples: int, train_loss: float) -> None:
        """Learn from an arrival: the device's data size and mean per-sample training loss."""

    def select(
        self, candidates: np.ndarray, count: int, latency: np.ndarray, limit: float, rng: np.random.Generator
    ) -> np.ndarray:
        """Up to ``count`` of ``candidates`` (sorted).

        Args:
            candidates: Idle devices that may be selected.
            count: How many to select (``S``).
            latency: Every device's expected latency this round (distribution + computation + upload).
            limit: The average round latency limit :math:`T_{max} / K`.
            rng: The scheduler's random stream.
        """
        if len(candidates) <= count:
            return np.sort(candidates)
        return np.sort(rng.choice(candidates, size=count, replace=False))

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""


RandomSelection = Selection


class UtilitySelection(Selection):
    r"""The ``count`` devices of largest statistical utility :math:`U_i = n_i \sqrt{\overline{\ell_i}}` (ASFL Sec. 3.2),
    from each device's latest mean training loss; devices never seen are explored first (in random order).

    Example:
        >>> sel = UtilitySelection()
        >>> sel.on_fit_start(4)
        >>> sel.observe(0, 10, 1.0); sel.observe(1, 10, 4.0); sel.observe(2, 40, 0.25)
        >>> sel.select(np.arange(4), 2, np.zeros(4), 1.0, np.random.default_rng(0)).tolist()  # 3 unseen, then 1
        [1, 3]
    """

    def __init__(self) -> None:
        self.utility = np.zeros(0)
        self.seen = np.zeros(0, dtype=bool)

    def on_fit_start(self, num_clients: int) -> None:
        self.utility = np.zeros(num_clients)
        self.seen = np.zeros(num_clients, dtype=bool)

    def observe(self, client: int, num_samples: int, train_loss: float) -> None:
        if np.isfinite(train_loss):
            self.utility[client] = device_utility(num_samples, [train_loss])
            self.seen[client] = True

    def scores(self, latency: np.ndarray, limit: float) -> np.ndarray:
        """The utility used for ranking."""
        return self.utility

    def select(
        self, candidates: np.ndarray, count: int, latency: np.ndarray, limit: float, rng: np.random.Generator
    ) -> np.ndarray:
        candidates = np.asarray(candidates)
        unseen = rng.permutation(candidates[~self.seen[candidates]])
        seen = candidates[self.seen[candidates]]
        scores = self.scores(latency, limit)[seen]
        ranked = seen[np.lexsort((seen, -scores))]  # largest utility first, ties by index
        return np.sort(np.concatenate([unseen, ranked])[:count])

    def state_dict(self) -> dict[str, Any]:
        return {"utility": self.utility.tolist(), "seen": self.seen.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.utility = np.asarray(state["utility"], dtype=np.float64)
        self.seen = np.asarray(state["seen"], dtype=bool)


class OortSelection(UtilitySelection):
    r"""Oort's guided selection (Lai et al., OSDI 2021): statistical utility times a system penalty
    :math:`(T / t_i)^{\alpha}` for devices slower than the preferred round duration :math:`T` (``T_max / K``
    unless given); unexplored devices first.

    Args:
        penalty: The exponent :math:`\alpha` (Oort: 2).
        preferred_duration: :math:`T` in virtual seconds (``None``: the scheduler's :math:`T_{max} / K`).

    Example:
        >>> sel = OortSelection(penalty=2.0, preferred_duration=10.0)
        >>> sel.on_fit_start(2)
        >>> sel.observe(0, 100, 1.0); sel.observe(1, 100, 1.0)
        >>> sel.scores(np.array([5.0, 20.0]), limit=99.0).tolist()  # device 1 is twice too slow: x (1/2)^2
        [100.0, 25.0]
    """

    def __init__(self, penalty: float = PENALTY, preferred_duration: float | None = None) -> None:
        super().__init__()
        check_number("penalty", penalty, 0)
        check_number("preferred_duration", preferred_duration, 0, open_min=True, optional=True)
        self.penalty = penalty
        self.preferred_duration = preferred_duration

    def scores(self, latency: np.ndarray, limit: float) -> np.ndarray:
        preferred = self.preferred_duration if self.preferred_duration is not None else limit
        factor = np.where(latency > preferred, (preferred / np.maximum(latency, 1e-12)) ** self.penalty, 1.0)
        return self.utility * factor


class DeadlineSelection(Selection):
    """FedCS (Nishio and Yonetani, 2019) as ASFL compares with it: devices whose expected latency this round exceeds
    the average round limit :math:`T_{max} / K` are dropped; up to ``count`` of the others are chosen at random
    (when none fits, the fastest candidate alone).

    Example:
        >>> DeadlineSelection().select(np.arange(4), 3, np.array([5.0, 50.0, 8.0, 60.0]), 10.0,
        ...                            np.random.default_rng(0)).tolist()
        [0, 2]
    """

    def select(
        self, candidates: np.ndarray, count: int, latency: np.ndarray, limit: float, rng: np.random.Generator
    ) -> np.ndarray:
        candidates = np.asarray(candidates)
        if len(candidates) == 0:
            return candidates
        fits = candidates[latency[candidates] <= limit]
        if len(fits) == 0:
            return candidates[[int(np.argmin(latency[candidates]))]]
        return super().select(fits, count, latency, limit, rng)
