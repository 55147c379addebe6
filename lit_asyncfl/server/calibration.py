"""Buffered aggregation calibrated by a cache of every client's latest update (CA2FL)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_asyncfl.checks import check_choice, check_number
from lit_asyncfl.functional.calibration import calibrated_update, calibration_residual
from lit_asyncfl.server.aggregators import BUFFER_SIZE, SERVER_LR, Aggregator
from lit_asyncfl.server.update_cache import CACHE_DTYPE, CACHE_DTYPES, ClientUpdateCache

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


#: Size of a full cache (one delta per client) above which :class:`CalibratedDeltaAverage` warns at fit start.
CACHE_WARN_BYTES = 8 * 2**30


class CalibratedDeltaAverage(Aggregator):
    r"""FedBuff's buffer of ``M`` deltas, calibrated by the server's cache of every client's latest delta.

    .. math:: x_{t+1} = x_t + \eta \Big( h_t + \frac{1}{M} \sum_{i \in \mathcal{S}_t} (p_i \Delta^i - h^i) \Big),
        \qquad h_{t+1} = \frac{1}{N} \sum_{j=1}^{N} h^j

    On each accepted arrival of client :math:`i` with delta :math:`\Delta^i = w_i - w_o` and weight :math:`p_i`
    (from the server callbacks; 1 in CA2FL) the residual :math:`p_i \Delta^i - h^i` is buffered and the cache entry
    becomes :math:`h^i \leftarrow p_i \Delta^i` (:math:`h^i = 0` before a client's first upload). When ``M``
    updates are buffered the model moves as above, with :math:`h_t` the cache mean over all :math:`N` clients as it
    was at the end of the previous aggregation (0 before the first); the new mean :math:`h_{t+1}` is then taken.
    A client arriving twice in one buffer is calibrated by its first upload of that buffer the second time (its
    latest upload at every arrival).

    The buffer's deltas enter the cache, and :math:`h_{t+1}` is taken, only once the server has applied the step
    (:meth:`on_aggregated`): a step the server refuses (non-finite, e.g. a finite upload whose delta overflows)
    leaves the cache and :math:`h_t` as they were, so no refused update calibrates later ones.

    Memory: the buffer (``M`` updates, their residuals and deltas), one cached delta per client ever seen (see
    :class:`~lit_asyncfl.server.update_cache.ClientUpdateCache`; ``cache_dtype="float16"`` halves it) and
    :math:`h_t`. The cache grows as clients upload; at fit start, when a full cache (``num_clients`` model copies)
    would exceed :data:`CACHE_WARN_BYTES`, a warning names the figure and ``cache_dtype``.

    Args:
        buffer_size: Updates :math:`M` per aggregation.
        server_lr: Global learning rate :math:`\eta > 0`.
        cache_dtype: Storage type of the cached deltas (``"float32"``, ``"float64"``, ``"bfloat16"``,
            ``"float16"``).

    Example:
        >>> agg = CalibratedDeltaAverage(buffer_size=10, server_lr=1.0)
        >>> agg.buffer_size, agg.cache.dtype
        (10, 'float32')
    """

    def __init__(
        self, buffer_size: int = BUFFER_SIZE, server_lr: float = SERVER_LR, cache_dtype: str = CACHE_DTYPE
    ) -> None:
        super().__init__(buffer_size)
        check_number("server_lr", server_lr, 0, open_min=True)
        check_choice("cache_dtype", cache_dtype, sorted(CACHE_DTYPES))
        self.server_lr = server_lr
        self.cache = ClientUpdateCache(cache_dtype)
        self.residuals: list[Tensor] = []
        #: The buffer's latest delta per client, entering the cache when the step is applied.
        self.staged: dict[int, Tensor] = {}
        self.cache_mean: Tensor | None = None
        self._aggregated: dict[int, Tensor] | None = None

    def on_fit_start(self, server: Server) -> None:
        super().on_fit_start(server)
        self.cache.clear()
        self.residuals, self.staged, self.cache_mean, self._aggregated = [], {}, None, None
        full = server.num_clients * server.weights.numel() * CACHE_DTYPES[self.cache.dtype].itemsize
        if full > CACHE_WARN_BYTES:
            warnings.warn(
                f"CA2FL caches one delta per client: num_clients={server.num_clients} x "
                f"{server.weights.numel()} parameters in {self.cache.dtype} take up to {full / 2**30:.1f} GiB as "
                "clients upload (cache_dtype='float16' or 'bfloat16' halves a float32 cache)",
                UserWarning,
                stacklevel=2,
            )

    def add(self, server: Server, update: ClientUpdate, weight: float) -> None:
        super().add(server, update, weight)
        self._aggregated = None  # a step aggregated but never applied: refused by the server
        delta = update.delta if weight == 1.0 else update.delta * weight
        cached = self.staged.get(update.client)
        self.residuals.append(calibration_residual(delta, self.cache.get(update.client) if cached is None else cached))
        self.staged[update.client] = delta

    def aggregate(self, server: Server) -> Tensor:
        return server.weights + self.aggregate_step(server)

    def aggregate_step(self, server: Server) -> Tensor:
        direction = calibrated_update(self.cache_mean, self.residuals)
        self._aggregated, self.staged, self.residuals = self.staged, {}, []
        return self.server_lr * direction

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        for client, delta in (self._aggregated or {}).items():
            self.cache.put(client, delta)
        self._aggregated = None
        self.cache_mean = self.cache.mean(server.num_clients)

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "cache": self.cache.state_dict(),
            "residuals": list(self.residuals),
            "staged": dict(self.staged),
            "cache_mean": self.cache_mean,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.cache.load_state_dict(state["cache"])
        self.residuals = list(state["residuals"])
        self.staged = {int(c): d for c, d in state.get("staged", {}).items()}  # absent before: cached at arrival
        self.cache_mean = state["cache_mean"]
        self._aggregated = None
