"""FedHist's History-Aware Aggregation (HAA): staleness weights boosted by learned client utility."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from lit_asyncfl.checks import check_fraction, check_number
from lit_asyncfl.functional.history import client_utility, cosine, ema, history_aware_weight
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.gradient_history import GradientHistory

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

# Defaults that FedHist's preset repeats by name (its lambda and exponent cap are its own).
SIMILARITY_THRESHOLD = 0.0
EMA_RATE = 0.1


class HistoryAwareWeight(ServerCallback):
    r"""HAA (Eqs. 8-14): weight :math:`\hat p_i = (e/2)^{-\tau_i} + \lambda \overline{Util}(i)`, normalised by the
    aggregator (use :class:`~lit_asyncfl.server.DeltaAverage` with ``normalize=True``).

    After each round :math:`r > h` (the buffer is full), with :math:`v = r - h`: :math:`S` is every buffered
    local gradient computed from global version :math:`v` (whenever it arrived) and
    :math:`g_{pred} = \mathrm{mean}(S)`; each gradient aggregated in the round that consumed version :math:`v`
    (the oldest buffered round, computed from version :math:`v` or older) scores its client

    .. math:: Util = (\cos\langle g_{his}, g_{pred}\rangle - sim_{thr}) \, p_{his} \, |S|, \qquad
        \overline{Util} \leftarrow (1 - \gamma)\overline{Util} + \gamma \, Util

    with :math:`p_{his} = (e/2 - 1)^{-\tau}` on a reward (:math:`\cos \ge sim_{thr}`) and :math:`(e/2)^{-\tau}` on a
    penalty, the exponent capped at ``max_exponent``. Scoring is skipped when :math:`S` is empty.
    **Resolution**: the paper's buffer indexing (Eq. 10 vs Alg. 1) is off by one; this is the plain-terms
    reading of the two.

    Args:
        history: The shared :class:`~lit_asyncfl.server.gradient_history.GradientHistory` (placed before this).
        lam: Utility coefficient :math:`\lambda \ge 0`.
        similarity_threshold: :math:`sim_{thr}`.
        ema_rate: :math:`\gamma \in [0, 1]`.
        max_exponent: Cap of the staleness exponent (overflow guard).
        floor: Smallest unnormalised weight.

    Example:
        >>> HistoryAwareWeight(GradientHistory(5), lam=0.1).utility(3)
        0.0
    """

    def __init__(
        self,
        history: GradientHistory,
        lam: float = 0.1,
        similarity_threshold: float = SIMILARITY_THRESHOLD,
        ema_rate: float = EMA_RATE,
        max_exponent: float = 50.0,
        floor: float = 1e-6,
    ) -> None:
        check_number("lam", lam, 0)  # HAA's lambda
        check_fraction("ema_rate", ema_rate)
        check_number("similarity_threshold", similarity_threshold, -1, 1)
        check_number("max_exponent", max_exponent, 0)
        check_number("floor", floor, 0, open_min=True)
        self.history = history
        self.lam = lam
        self.similarity_threshold = similarity_threshold
        self.ema_rate = ema_rate
        self.max_exponent = max_exponent
        self.floor = floor
        self._utilities: dict[int, float] = {}

    def utility(self, client: int) -> float:
        """The client's average utility :math:`\\overline{Util}(i)` (0 until scored)."""
        return self._utilities.get(client, 0.0)

    def on_fit_start(self, server: Server) -> None:
        self._utilities = {}

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        staleness = update.staleness + 1  # FedHist's tau = t - o + 1
        return weight * history_aware_weight(staleness, self.utility(update.client), self.lam, self.floor)

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        r, h = server.version, self.history.length
        if h == 0 or r <= h or len(self.history.rounds) < h:
            return
        fresh = self.history.relatively_fresh(base_version=r - h)
        if not fresh:
            return
        prediction = torch.stack(fresh).mean(dim=0)
        for entry in self.history.rounds[0]["entries"]:  # the round that consumed version r - h
            similarity = cosine(entry["gradient"], prediction)
            util = client_utility(
                similarity, self.similarity_threshold, entry["staleness"], len(fresh), self.max_exponent
            )
            self._utilities[entry["client"]] = ema(self.utility(entry["client"]), util, self.ema_rate)

    def state_dict(self) -> dict[str, Any]:
        return {"utilities": dict(self._utilities)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._utilities = {int(c): float(u) for c, u in state["utilities"].items()}
