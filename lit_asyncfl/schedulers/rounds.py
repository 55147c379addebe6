"""Synchronous rounds (FedAvg, FedProx): sample clients, wait for all, aggregate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_asyncfl.checks import check_count_or_fraction
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Simulator
    from lit_asyncfl.core.update import ClientJob


class SynchronousRounds(Scheduler):
    """Each round, sample ``clients_per_round`` clients, dispatch them with the current model, and aggregate once
    every one of them has answered (accepted or rejected); the next round starts at that moment.

    Args:
        clients_per_round: Count, or fraction ``C`` of all clients (FedAvg's C).

    Example:
        >>> s = SynchronousRounds(0.1)
        >>> s.setup(100)
        >>> s.count
        10
    """

    def __init__(self, clients_per_round: int | float = 0.1) -> None:
        check_count_or_fraction("clients_per_round", clients_per_round)
        self.clients_per_round = clients_per_round
        self.count = 0
        self.waiting: set[int] = set()

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("clients_per_round", self.clients_per_round, num_clients)

    def on_fit_start(self, sim: Simulator) -> None:
        self.waiting = set()
        self._start_round(sim)

    def _start_round(self, sim: Simulator) -> None:
        clients = sim.sample_idle(self.count)
        self.waiting = {int(c) for c in clients}
        for client in clients:
            sim.dispatch(client)

    def on_update(self, sim: Simulator, job: ClientJob, aggregated: bool) -> None:
        self.waiting.discard(job.client)
        if not self.waiting:
            sim.flush()
            self._start_round(sim)

    def state_dict(self) -> dict[str, Any]:
        return {"waiting": sorted(self.waiting)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.waiting = set(state["waiting"])
