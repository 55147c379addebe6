"""Periodic trigger (FedASMU, Alg. 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_count_or_fraction, check_number
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.schedulers.view import SchedulerView


class PeriodicTrigger(Scheduler):
    r"""Every ``period`` virtual seconds, start up to ``clients_per_trigger`` idle clients (:math:`m'`), as long as
    fewer than ``max_parallel`` are training.

    Args:
        period: Trigger period :math:`T` in virtual seconds (> 0).
        clients_per_trigger: Clients started per trigger, :math:`m'` (count or fraction).
        max_parallel: Most clients training at once (count or fraction; FedASMU uses 10% of m).

    Example:
        >>> s = PeriodicTrigger(period=10, clients_per_trigger=10, max_parallel=0.1)
        >>> s.setup(100)
        >>> s.per_trigger, s.limit
        (10, 10)
    """

    def __init__(
        self, period: float = 10.0, clients_per_trigger: int | float = 10, max_parallel: int | float = 0.1
    ) -> None:
        check_number("period", period, 0, open_min=True, unit=" virtual seconds")
        check_count_or_fraction("clients_per_trigger", clients_per_trigger)
        check_count_or_fraction("max_parallel", max_parallel)
        self.period = period
        self.clients_per_trigger = clients_per_trigger
        self.max_parallel = max_parallel
        self.per_trigger = self.limit = 0

    def setup(self, num_clients: int) -> None:
        self.per_trigger = resolve_count("clients_per_trigger", self.clients_per_trigger, num_clients)
        self.limit = resolve_count("max_parallel", self.max_parallel, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        sim.schedule(sim.now, "trigger")

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        room = min(self.per_trigger, self.limit - sim.num_training)
        for client in sim.sample_idle(room):
            sim.dispatch(client)
        sim.schedule(sim.now + self.period, "trigger")
