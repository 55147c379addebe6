"""Updates held per group until a scheduler releases the group (FedCompass's arrival groups)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_asyncfl.checks import check_bool, check_number
from lit_asyncfl.core.update import ClientUpdate
from lit_asyncfl.functional.compass import compass_update
from lit_asyncfl.server.aggregators import Aggregator

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server


# Defaults (FedCompass's), which its preset repeats by name.
ALPHA = 0.9
STALENESS_EXPONENT = 0.5
LATEST_PER_CLIENT = True


class GroupedDeltaStep(Aggregator):
    r"""Holds each accepted update under the key its scheduler routed it to, and aggregates what a scheduler
    releases: :math:`w \leftarrow w + \sum_i \frac{\alpha\, s(\tau_i)\, p_i}{N} \Delta_i`
    (:func:`~lit_asyncfl.functional.compass.compass_update`; :math:`p_i` the server callbacks' weight, 1 by
    default), with the staleness :math:`\tau_i = t - o_i` taken when the update is aggregated, not when it arrived.

    The scheduler calls :meth:`route` for an arriving update (in ``on_arrival``, before the server takes it); the
    update then waits under that key until :meth:`release` moves the keys' updates into the buffer, which the
    scheduler flushes (``sim.flush()``). An update never routed goes straight into the buffer. Everything held is
    checkpointed.

    With ``latest_per_client`` (the default, as APPFL's ``CompassScheduler``, whose buffers are dictionaries keyed by
    client), an aggregation takes one update per client, its newest job's: an older one released with it (a late
    update followed by a second late one, or by the client's update to the group being aggregated) is discarded,
    counted under the reason ``"superseded"``.

    Args:
        alpha: Mixing rate :math:`\alpha`.
        staleness_exponent: :math:`a` of :math:`s(\tau) = (\tau + 1)^{-a}`.
        latest_per_client: Aggregate only each client's newest released update (``False``: every one).

    Example:
        >>> agg = GroupedDeltaStep(alpha=0.9)
        >>> agg.buffer_size is None, agg.alpha
        (True, 0.9)
    """

    def __init__(
        self,
        alpha: float = ALPHA,
        staleness_exponent: float = STALENESS_EXPONENT,
        latest_per_client: bool = LATEST_PER_CLIENT,
    ) -> None:
        super().__init__(buffer_size=None)
        check_number("alpha", alpha, 0, open_min=True)
        check_number("staleness_exponent", staleness_exponent, 0)
        check_bool("latest_per_client", latest_per_client)
        self.alpha = alpha
        self.staleness_exponent = staleness_exponent
        self.latest_per_client = latest_per_client
        self.held: dict[str, list[tuple[ClientUpdate, float]]] = {}
        self.routes: dict[int, str] = {}

    def on_fit_start(self, server: Server) -> None:
        super().on_fit_start(server)
        self.held, self.routes = {}, {}

    def route(self, job_id: int, key: str) -> None:
        """Hold the update of job ``job_id``, when the server accepts it, under ``key``."""
        self.routes[int(job_id)] = str(key)

    def add(self, server: Server, update: ClientUpdate, weight: float) -> None:
        key = self.routes.pop(update.job.job_id, None)
        if key is None:
            super().add(server, update, weight)
            return
        if not weight >= 0:
            raise ValueError(f"aggregation weight must be >= 0, got {weight} for client {update.client}")
        self.held.setdefault(key, []).append((update, weight))

    def release(self, *keys: str, server: Server | None = None) -> int:
        """Move the updates held under ``keys`` (in that order) into the buffer; return how many.

        With ``latest_per_client``, only each client's newest update (highest job id) stays in the buffer; the others
        are counted in ``server.stats`` as discarded (``"superseded"``) when ``server`` is given.
        """
        moved = 0
        for key in keys:
            entries = self.held.pop(str(key), [])
            self.buffer.extend(entries)
            moved += len(entries)
        if self.latest_per_client:
            newest: dict[int, int] = {}
            for update, _ in self.buffer:
                newest[update.client] = max(newest.get(update.client, -1), update.job.job_id)
            kept = [(u, w) for u, w in self.buffer if u.job.job_id == newest[u.client]]
            superseded = len(self.buffer) - len(kept)
            self.buffer = kept
            if server is not None and superseded:
                server.stats.discarded += superseded
                server.stats.reasons["superseded"] = server.stats.reasons.get("superseded", 0) + superseded
        return moved

    def forget(self, job_id: int) -> None:
        """Drop the route of a job whose update will not be accepted (rejected by a callback)."""
        self.routes.pop(int(job_id), None)

    def aggregate(self, server: Server) -> Tensor:
        return self._accumulate(server, server.weights)

    def aggregate_step(self, server: Server) -> Tensor:
        return self._accumulate(server, server.weights.new_zeros(server.weights.shape))

    def _accumulate(self, server: Server, start: Tensor) -> Tensor:
        deltas = [u.delta * w for u, w in self.buffer]
        staleness = [server.version - u.base_version for u, _ in self.buffer]
        return compass_update(start, deltas, staleness, self.alpha, self.staleness_exponent, server.num_clients)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["held"] = {k: [(u.state_dict(), w) for u, w in v] for k, v in self.held.items()}
        state["routes"] = dict(self.routes)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.held = {
            str(k): [(ClientUpdate.from_state_dict(u), float(w)) for u, w in v] for k, v in state["held"].items()
        }
        self.routes = {int(k): str(v) for k, v in state["routes"].items()}
