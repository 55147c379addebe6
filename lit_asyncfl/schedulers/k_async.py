"""K-asynchronous training (FedHist): everyone trains; each aggregation restarts the clients it consumed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.checks import check_count_or_fraction
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.schedulers.view import SchedulerView

#: Updates per aggregation by default (FedHist's K = 10).
K = 10


class KAsync(Scheduler):
    """All clients train from the start; the server aggregates when ``k`` updates have arrived (set the
    aggregator's ``buffer_size`` to ``k``); then every idle client — the ``k`` just aggregated, and any whose
    update was rejected — restarts from the new model, while the others keep training (their staleness grows).
    Only online devices train: a device offline when its restart was due restarts from the current model as soon as
    it is back online.

    Args:
        k: Updates per aggregation ``K`` (count, or fraction of the clients).

    Example:
        >>> s = KAsync(10)
        >>> s.setup(100)
        >>> s.count
        10
    """

    def __init__(self, k: int | float = K) -> None:
        check_count_or_fraction("k", k)
        self.k = k
        self.count = 0
        self.owed: set[int] = set()  # devices whose restart came while they were offline

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("k", self.k, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        self._restart(sim)

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        if aggregated or sim.num_training == 0:  # nobody left training: restart the waiting ones
            self._restart(sim)

    def _restart(self, sim: SchedulerView) -> None:
        for client in sim.sample_idle(sim.num_clients):
            sim.dispatch(client)
        self.owed = {int(c) for c in np.flatnonzero(~sim.busy)}  # idle still: offline now

    def on_online(self, sim: SchedulerView) -> None:
        for client in sorted(self.owed.intersection(sim.idle_online().tolist())):
            sim.dispatch(client)
            self.owed.discard(client)
        if self.owed:
            sim.wake_when_online()

    def state_dict(self) -> dict[str, Any]:
        return {"owed": sorted(self.owed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.owed = {int(c) for c in state.get("owed", [])}
