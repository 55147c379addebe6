"""Keep a fixed number of clients training at all times (FedAsync, FedBuff, FedADT)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_count_or_fraction
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.schedulers.view import SchedulerView

#: Clients training at once by default (FedAsync's 10%).
CONCURRENCY = 0.1


class KeepConcurrency(Scheduler):
    """Start ``concurrency`` random clients; whenever an update has been processed, start a random idle client.

    The client that just finished is idle again and may be drawn. Only online devices are drawn; when too few are
    online, the missing ones are started as devices come back online.

    Args:
        concurrency: Number of clients training at once (``int``), or a fraction of all clients (``float`` in
            ``(0, 1]``; FedADT's concurrency rate P = 20% is ``0.2``).

    Example:
        >>> s = KeepConcurrency(0.2)
        >>> s.setup(50)
        >>> s.count
        10
    """

    def __init__(self, concurrency: int | float = CONCURRENCY) -> None:
        check_count_or_fraction("concurrency", concurrency)  # validate early
        self.concurrency = concurrency
        self.count = 0

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("concurrency", self.concurrency, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        for client in sim.sample_idle(self.count):
            sim.dispatch(client)

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        self._refill(sim)

    def on_online(self, sim: SchedulerView) -> None:
        self._refill(sim)

    def _refill(self, sim: SchedulerView) -> None:
        for client in sim.sample_idle(self.count - sim.num_training):
            sim.dispatch(client)
