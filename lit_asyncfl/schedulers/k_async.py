"""K-asynchronous training (FedHist): everyone trains; each aggregation restarts the clients it consumed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_count_or_fraction
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Simulator
    from lit_asyncfl.core.update import ClientJob


class KAsync(Scheduler):
    """All clients train from the start; the server aggregates when ``k`` updates have arrived (set the
    aggregator's ``buffer_size`` to ``k``); then every idle client — the ``k`` just aggregated, and any whose
    update was rejected — restarts from the new model, while the others keep training (their staleness grows).

    Args:
        k: Updates per aggregation ``K`` (count, or fraction of the clients).

    Example:
        >>> s = KAsync(10)
        >>> s.setup(100)
        >>> s.count
        10
    """

    def __init__(self, k: int | float = 10) -> None:
        check_count_or_fraction("k", k)
        self.k = k
        self.count = 0

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("k", self.k, num_clients)

    def on_fit_start(self, sim: Simulator) -> None:
        for client in sim.sample_idle(sim.num_clients):
            sim.dispatch(client)

    def on_update(self, sim: Simulator, job: ClientJob, aggregated: bool) -> None:
        if aggregated or sim.num_training == 0:  # nobody left training: restart the waiting ones
            for client in sim.sample_idle(sim.num_clients):
                sim.dispatch(client)
