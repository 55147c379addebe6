"""Keep a number of clients selected, training or buffered, and restart the ones left too far behind (PORT)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_count_or_fraction, check_int
from lit_asyncfl.schedulers.base import Scheduler, resolve_count

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.schedulers.view import SchedulerView

#: Clients selected at once by default (PORT's 30 of 100), which PORT's preset repeats by name.
CONCURRENCY = 0.3


class BufferedConcurrency(Scheduler):
    r"""Keep ``concurrency`` clients *selected* — training, or uploaded and waiting in the server's buffer — and,
    with ``max_staleness``, abandon the jobs an aggregation leaves too far behind.

    A client whose update is buffered holds its place until the aggregation (Plato's asynchronous server, on which
    PORT was built, selects new clients only to replace aggregated ones); an update that is not buffered (rejected)
    frees its place at once. After each aggregation, every job still training whose staleness :math:`t - o` with
    respect to the model :math:`w_t` that aggregation started from exceeds ``max_staleness`` is cancelled
    (:meth:`~lit_asyncfl.core.simulator.Simulator.cancel`, counted in ``cancelled``; its work is lost) and its device
    restarts at once from the new global model (if online); the free places are then filled with random idle online
    clients.

    Args:
        concurrency: Clients selected at once (count, or fraction of all clients); at least the aggregator's
            ``buffer_size``, or no aggregation could ever happen (refused at fit start).
        max_staleness: Staleness beyond which a job still training is abandoned and restarted (``None``: never).

    Example:
        >>> s = BufferedConcurrency(0.3, max_staleness=10)
        >>> s.setup(100)
        >>> s.count
        30
    """

    def __init__(self, concurrency: int | float = CONCURRENCY, max_staleness: int | None = None) -> None:
        check_count_or_fraction("concurrency", concurrency)
        check_int("max_staleness", max_staleness, 0, optional=True)
        self.concurrency = concurrency
        self.max_staleness = max_staleness
        self.count = 0
        #: Jobs abandoned for staleness so far.
        self.abandoned = 0

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("concurrency", self.concurrency, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        buffer_size = sim.server.aggregator.buffer_size
        if buffer_size is not None and buffer_size > self.count:
            raise ValueError(f"concurrency={self.concurrency} selects {self.count} clients, fewer than the "
                             f"aggregator's buffer_size={buffer_size}; allowed: at least {buffer_size}")  # fmt: skip
        self.abandoned = 0
        self._refill(sim)

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        if aggregated and self.max_staleness is not None:
            start = sim.server.version - 1  # the version the aggregation's updates were weighed against
            stale = sorted(j.job_id for j in sim.in_flight.values() if start - j.base_version > self.max_staleness)
            clients = [sim.cancel(job_id).client for job_id in stale]
            self.abandoned += len(clients)
            for client in clients:  # the stragglers pull the latest model first
                if sim.availability.is_online(client, sim.now):
                    sim.dispatch(client)
        self._refill(sim)

    def on_online(self, sim: SchedulerView) -> None:
        self._refill(sim)

    def _refill(self, sim: SchedulerView) -> None:
        selected = sim.num_training + len(sim.server.aggregator.buffer)
        for client in sim.sample_idle(self.count - selected):
            sim.dispatch(client)

    def summary(self) -> dict[str, int]:
        return {"abandoned_for_staleness": self.abandoned} if self.max_staleness is not None else {}

    def state_dict(self) -> dict[str, int]:
        return {"abandoned": self.abandoned}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.abandoned = int(state.get("abandoned", 0))
