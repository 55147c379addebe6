"""Weight an update by its similarity to the last global step and by its staleness (PORT)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_asyncfl.checks import check_int, check_number
from lit_asyncfl.functional.port import port_similarity, port_staleness_factor, port_weight
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

# Defaults (the PORT authors' configuration), which PORT's preset repeats by name.
BOUND = 10
SIMILARITY_WEIGHT = 1.0
STALENESS_WEIGHT = 3.0


class SimilarityStalenessWeight(ServerCallback):
    r"""Multiply an update's weight by :math:`\omega_{sim} \frac{1 + \cos(g_t, w_i - w_t)}{2} + \omega_{st}
    \frac{b}{\tau_i + b}` (PORT, :mod:`lit_asyncfl.functional.port`).

    :math:`g_t = w_t - w_{t-1}` is the last global step, kept here (one model copy, checkpointed); as in the authors'
    code the similarity is 1 for an update of staleness :math:`\le 1` (its start model is :math:`w_t` or
    :math:`w_{t-1}`, so :math:`g_t` says nothing it missed) and before the first aggregation.

    Args:
        bound: Staleness bound :math:`b > 0` of the staleness factor.
        similarity_weight: :math:`\omega_{sim} \ge 0`.
        staleness_weight: :math:`\omega_{st} \ge 0` (the two may not both be 0).

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> cb = SimilarityStalenessWeight(bound=10, similarity_weight=1.0, staleness_weight=3.0)
        >>> cb.weight_update(None, SimpleNamespace(staleness=10), 2.0)  # 2 * (1 * 1 + 3 * 10 / 20)
        5.0
    """

    def __init__(
        self,
        bound: int = BOUND,
        similarity_weight: float = SIMILARITY_WEIGHT,
        staleness_weight: float = STALENESS_WEIGHT,
    ) -> None:
        check_int("staleness bound", bound, 1)
        check_number("similarity_weight", similarity_weight, 0)
        check_number("staleness_weight", staleness_weight, 0)
        if similarity_weight == 0 and staleness_weight == 0:
            raise ValueError("similarity_weight and staleness_weight are both 0: every weight would be 0; allowed: "
                             "at least one > 0")  # fmt: skip
        self.bound, self.similarity_weight, self.staleness_weight = bound, similarity_weight, staleness_weight
        self.last_step: Tensor | None = None

    def on_fit_start(self, server: Server) -> None:
        self.last_step = None

    def similarity(self, server: Server, update: ClientUpdate) -> float:
        """The update's similarity term (1 when the staleness is at most 1 or no global step was made yet)."""
        if update.staleness <= 1 or self.last_step is None:
            return 1.0
        n = server.param_numel  # directions of the parameters (the server averages the floating buffers)
        return port_similarity(self.last_step, update.weights[:n] - server.weights[:n])

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        factor = port_staleness_factor(update.staleness, self.bound)
        return weight * port_weight(self.similarity(server, update), factor, self.similarity_weight,
                                    self.staleness_weight)  # fmt: skip

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        n = server.param_numel
        self.last_step = server.weights[:n] - server.previous_weights[:n]

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = state["last_step"]
