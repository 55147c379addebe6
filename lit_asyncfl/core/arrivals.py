"""Arrived updates waiting for the server, served in arrival order; the start models of in-flight jobs. Part of
:class:`~lit_asyncfl.core.simulator.Simulator` (a base class of it)."""

from __future__ import annotations

from torch import Tensor

from lit_asyncfl.core.update import ClientJob, ClientUpdate


class ArrivalQueue:
    """Serving arrived updates to the server, new versions, and the start-model snapshots (a base class of
    :class:`~lit_asyncfl.core.simulator.Simulator`, whose constructor sets the state these methods use)."""

    def hold_arrivals(self) -> None:
        """Let arriving updates wait, in arrival order, until :meth:`release_arrivals` (e.g. the rest of a round's
        arrivals once its quota is met: they belong to the next round)."""
        self.holding = True

    def release_arrivals(self) -> None:
        """Process the waiting updates right after the current event (no-op when not holding)."""
        if self.holding:
            self.holding = False
            self.queue.push(self.now, "resume")

    def _new_version(self) -> None:
        for observer in self.observers:
            observer.on_new_version(self)

    def flush(self) -> bool:
        """Aggregate what the server has buffered (synchronous round end)."""
        aggregated = self.server.flush()
        if aggregated:
            self.stalled_arrivals = 0  # progress, even when the arrivals were processed before this flush
            self._new_version()
        return aggregated

    def _arrival(self, job_id: int) -> None:
        job = self.in_flight[job_id]
        update = self.ready.pop(job_id) if job_id in self.ready else self._job_result(job)
        if update is None:
            return
        del self.in_flight[job_id]
        self.busy[job.client] = False
        self._release_snapshot(job.base_version)
        self.waiting[job_id] = (job, update)
        self._serve()

    def _serve(self) -> None:
        """Process waiting updates in arrival order while the server is free.

        An update whose callbacks need server compute (``processing_time`` > 0) occupies the server until a
        ``processed`` event; arrivals meanwhile wait, so the new version appears only when the work is done.
        """
        now = self.now  # (the time of the event being processed)
        while self.waiting and not self.holding and now >= self.server_busy_until:
            job_id, (job, update) = next(iter(self.waiting.items()))
            cost = self.server.processing_time(update)
            if cost > 0:
                self.server_busy_until = now + cost
                self.queue.push(self.server_busy_until, "processed", job_id=job_id)
                return
            del self.waiting[job_id]
            self._process(job, update)

    def _process(self, job: ClientJob, update: ClientUpdate) -> None:
        version = self.server.version
        if self._hears_arrivals:
            self.scheduler.on_arrival(self, update)
        aggregated = self.server.receive(update)
        if aggregated:
            self._new_version()
        for observer in self.observers:
            observer.on_update(self, update, aggregated)
        self.scheduler.on_update(self, job, aggregated)
        self.stalled_arrivals = 0 if self.server.version > version else self.stalled_arrivals + 1

    def _hold_snapshot(self, version: int, weights: Tensor) -> None:
        self.snapshots.setdefault(version, weights)
        self._snapshot_refs[version] += 1

    def _release_snapshot(self, version: int) -> None:
        self._snapshot_refs[version] -= 1
        if self._snapshot_refs[version] <= 0:
            del self._snapshot_refs[version]
            del self.snapshots[version]
