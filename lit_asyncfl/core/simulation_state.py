"""A simulation's checkpoint: everything needed to continue it exactly. Part of
:class:`~lit_asyncfl.core.simulator.Simulator` (a base class of it)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import torch

from lit_asyncfl.core.jobs import _is_storage_error
from lit_asyncfl.core.update import ClientJob, ClientUpdate


class SimulatorCheckpoint:
    """:meth:`state_dict` and :meth:`load_state_dict` of the simulator (a base class of
    :class:`~lit_asyncfl.core.simulator.Simulator`)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the simulation exactly (plain values and tensors only). The jobs past
        their request are settled first: their updates (or errors) are fetched from the executor and kept."""
        failed = self._settle_requests()
        return {
            "failed_after_request": failed,
            "server": self.server.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "client_callbacks": {cb.state_key: cb.state_dict() for cb in self.client_callbacks},
            "queue": self.queue.state_dict(),
            "busy": torch.from_numpy(self.busy.copy()),
            "in_flight": [job.state_dict() for job in self.in_flight.values()],
            "ready": {job_id: update.state_dict() for job_id, update in self.ready.items()},
            "waiting": [update.state_dict() for _, update in self.waiting.values()],
            "server_busy_until": self.server_busy_until,
            "holding": self.holding,
            "snapshots": dict(self.snapshots),
            "rng": self.rng.bit_generator.state,
            "next_job_id": self.next_job_id,
            "events_processed": self.events_processed,
            "stalled_arrivals": self.stalled_arrivals,
            "cancelled": self.cancelled,
            "dropped": dict(self.dropped),
            "wake_at": self.wake_at,
            **({} if self.client_state is None else {"client_state": self.client_state.state_dict()}),
        }

    def _settle_requests(self) -> dict[int, str]:
        """Wait for the update of every job past its request (learned from at its request event; the rest of it
        may still train on a worker) and keep it in ``ready``, as it goes into the checkpoint; a job that raised
        after its request fails at its arrival: its error, as text (the value of the checkpoint's
        ``failed_after_request``)."""
        failed = {}
        for job_id, job in self.in_flight.items():
            if job.request_step is None or math.isnan(job.arrival_time) or job_id in self.ready:
                continue
            if not self._will_train(job):  # lost before its arrival: never computed
                continue
            try:
                self.ready[job_id] = self.executor.result(job_id)
            except Exception as error:  # only the job's own error after its merge: anything else is no job's failure
                kept = getattr(self.executor, "failed_after_request", lambda _: None)(job_id)
                if kept is not error or _is_storage_error(error):
                    raise
                failed[job_id] = f"{type(error).__name__}: {error}"
        return failed

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (after :meth:`start` was *not* called)."""
        self.server.on_fit_start()
        for cb in self.client_callbacks:
            cb.on_fit_start(self.num_clients)
        self.server.load_state_dict(state["server"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.client_state is not None and "client_state" in state:
            self.client_state.load_state_dict(state["client_state"])
        for cb in self.client_callbacks:
            if cb.state_key in state["client_callbacks"]:
                cb.load_state_dict(state["client_callbacks"][cb.state_key])
        self.queue.load_state_dict(state["queue"])
        self.busy = state["busy"].numpy().copy()
        self.rng.bit_generator.state = state["rng"]
        self.next_job_id = int(state["next_job_id"])
        self.events_processed = int(state["events_processed"])
        self.stalled_arrivals = int(state["stalled_arrivals"])
        self.cancelled = int(state.get("cancelled", 0))
        self.dropped = Counter({str(k): int(v) for k, v in state.get("dropped", {}).items()})
        self.in_flight, self.snapshots, self._snapshot_refs = {}, {}, Counter()
        self.ready = {int(k): ClientUpdate.from_state_dict(v) for k, v in state["ready"].items()}
        waiting = [ClientUpdate.from_state_dict(u) for u in state["waiting"]]
        self.waiting = {u.job.job_id: (u.job, u) for u in waiting}
        self.server_busy_until = float(state["server_busy_until"])
        self.holding = bool(state.get("holding", False))
        self.wake_at = None if state.get("wake_at") is None else float(state["wake_at"])
        failed = {int(k): str(v) for k, v in state.get("failed_after_request", {}).items()}
        for job_state in sorted(state["in_flight"], key=lambda s: s["job_id"]):
            job = ClientJob.from_state_dict(job_state)
            self.in_flight[job.job_id] = job
            self._hold_snapshot(job.base_version, state["snapshots"][job.base_version])
            if job.job_id in failed:  # it raised after its request, before the checkpoint: it fails at its arrival
                error = RuntimeError(
                    f"before the checkpoint, after its request: {failed[job.job_id]} (this checkpoint holds the "
                    "failure: resume with on_client_error='drop' to drop the job, or from a checkpoint written "
                    "before its request to train it again)"
                )
                self.executor.submit_failed(job, self.snapshots[job.base_version], error)
            elif job.job_id not in self.ready and self._will_train(job):
                self.executor.submit(job, self.snapshots[job.base_version])
