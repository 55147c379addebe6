"""Reject updates whose size is an outlier against the recently aggregated ones."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.checks import check, check_int, check_number
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class UpdateNormBound(ServerCallback):
    r"""Reject an update whose delta norm :math:`\lVert w_i - w_{o} \rVert_2` exceeds ``k`` times the median norm
    of the last ``window`` aggregated updates (``reject_reasons["norm_outlier"]``).

    The server's default only rejects non-finite and mis-shaped updates: a finite but absurd update (a client whose
    weights blew up to 1e30, a buggy or malicious client) is otherwise aggregated and can destroy the model. This
    bound catches such outliers once ``min_history`` updates have been aggregated (before that, nothing is
    rejected by it); it learns only from updates the server aggregated. It is not a Byzantine-robust aggregator:
    many moderately scaled updates, or updates that are wrong in direction but not in size, pass. Put it first
    among the server callbacks so that no other callback sees (and learns from) a rejected update:
    ``algorithm.server_callbacks.insert(0, UpdateNormBound())``.

    Args:
        k: Reject above ``k`` times the running median norm (> 1).
        window: Number of recent aggregated norms the median is taken over.
        min_history: Aggregated norms needed before the bound applies.

    Example:
        >>> bound = UpdateNormBound(k=3.0, window=5, min_history=3)
        >>> bound.norms.extend([1.0, 2.0, 3.0])
        >>> bound.threshold()
        6.0
    """

    def __init__(self, k: float = 10.0, window: int = 100, min_history: int = 10) -> None:
        check_number("k", k, 1, open_min=True)
        check_int("window", window, 1)
        check_int("min_history", min_history, 1)
        check(min_history <= window, f"min_history must be <= window ({window}), got {min_history}")
        self.k, self.window, self.min_history = float(k), window, min_history
        self.norms: deque[float] = deque(maxlen=window)

    def on_fit_start(self, server: Server) -> None:
        self.norms.clear()

    def threshold(self) -> float:
        """The current bound (``inf`` until ``min_history`` norms are known)."""
        if len(self.norms) < self.min_history:
            return math.inf
        return self.k * float(np.median(np.asarray(self.norms)))

    def reject_update(self, server: Server, update: ClientUpdate) -> str | None:
        norm = float((update.weights.double() - update.base_weights.double()).norm())
        update.info["delta_norm"] = norm
        return "norm_outlier" if not norm <= self.threshold() else None

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        for update in updates:
            if "delta_norm" in update.info:
                self.norms.append(update.info["delta_norm"])

    def state_dict(self) -> dict[str, Any]:
        return {"norms": list(self.norms)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.norms = deque((float(n) for n in state["norms"]), maxlen=self.window)
