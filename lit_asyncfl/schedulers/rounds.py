"""Synchronous rounds (FedAvg, FedProx): sample clients, wait for all, aggregate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_asyncfl.checks import check_count_or_fraction, check_number
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.schedulers.view import SchedulerView


class SynchronousRounds(Scheduler):
    """Each round, sample ``clients_per_round`` clients, dispatch them with the current model, and aggregate once
    every one of them has answered (accepted or rejected); the next round starts at that moment.

    With devices that come and go (see :mod:`lit_asyncfl.availability`) a round samples among the devices online
    at its start (fewer when fewer are online; when none is, the round starts as soon as one is back). A member
    whose job is dropped (its device went offline or crashed) counts as answered without an update: the round
    aggregates the members that returned. With ``deadline``, members still training that long after the round
    started are dropped (reason ``"deadline"``) and the round aggregates who returned, as FedScale's and most
    deployments' rounds do.

    Args:
        clients_per_round: Count, or fraction ``C`` of all clients (FedAvg's C).
        deadline: Longest round, in virtual seconds after its start (``None``: wait for every member).

    Example:
        >>> s = SynchronousRounds(0.1)
        >>> s.setup(100)
        >>> s.count
        10
    """

    def __init__(self, clients_per_round: int | float = 0.1, deadline: float | None = None) -> None:
        check_count_or_fraction("clients_per_round", clients_per_round)
        check_number("deadline", deadline, 0, open_min=True, optional=True, unit=" virtual seconds")
        self.clients_per_round = clients_per_round
        self.deadline = deadline
        self.count = 0
        self.waiting: set[int] = set()
        self.round = 0

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("clients_per_round", self.clients_per_round, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        self.waiting, self.round = set(), 0
        self._start_round(sim)

    def _start_round(self, sim: SchedulerView) -> None:
        clients = sim.sample_idle(self.count)
        if len(clients) == 0:  # nobody online: on_online starts the round
            return
        self.round += 1
        self.waiting = {int(c) for c in clients}
        for client in clients:
            sim.dispatch(client)
        if self.deadline is not None:
            sim.schedule(sim.now + self.deadline, "round_deadline", round=self.round)

    def on_online(self, sim: SchedulerView) -> None:
        if not self.waiting:
            self._start_round(sim)

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        self.waiting.discard(job.client)
        if not self.waiting:
            sim.flush()
            self._start_round(sim)

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        if event.kind == "round_deadline" and event.data.get("round") == self.round:
            late = sorted(job.job_id for job in sim.in_flight.values() if job.client in self.waiting)
            for job_id in late:  # the last drop closes the round
                sim.drop(job_id, "deadline")

    def state_dict(self) -> dict[str, Any]:
        return {"waiting": sorted(self.waiting), "round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waiting = set(state["waiting"])
        self.round = int(state.get("round", 0))
