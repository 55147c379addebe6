"""A client job's life in the simulator: dispatched, asked for a fresh model mid-training, lost (offline, crashed,
failed) or cancelled. Part of :class:`~lit_asyncfl.core.simulator.Simulator` (a base class of it)."""

from __future__ import annotations

import logging
import math

import numpy as np
from torch import Tensor

from lit_asyncfl.checks import check_int
from lit_asyncfl.core.client_state import ClientStateError
from lit_asyncfl.core.job_work import samples_before_step
from lit_asyncfl.core.seeding import derive_seed
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data.shards import steps_per_epoch

log = logging.getLogger("lit_asyncfl")

JOB_EVENTS = ("arrival", "request", "drop")
#: The event kinds the simulator handles itself (a scheduler's events must be named otherwise).
#: Salt of the per-job crash draws (a stream keyed by the job: drawing never shifts the simulator's own stream).
CRASH_STREAM = 0xC4A54


class ClientJobError(RuntimeError):
    """A client job raised; the simulation stopped at the event boundary before the job's event."""


def _is_storage_error(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is a failure of the run's client state storage (a full disk)."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, ClientStateError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class JobLifecycle:
    """The simulator's jobs from dispatch to their arrival, loss or cancellation (a base class of
    :class:`~lit_asyncfl.core.simulator.Simulator`, whose constructor sets the state these methods use)."""

    def dispatch(self, client: int, timing: JobTiming | None = None, local_steps: int | None = None) -> ClientJob:
        """Send the current global model to an idle client and schedule its request or arrival.

        Args:
            client: An idle client.
            timing: The job's durations when the scheduler models them itself (e.g. ASFL's per-round bandwidths
                and shared distribution latency); ``None``: drawn from the device model.
            local_steps: The job's own number of local optimizer steps (FedCompass assigns one per client): the
                job runs that many steps, mid-epoch if need be, and its compute time is that of the samples those
                steps process (:func:`samples_before_step`); ``None``: ``local_epochs`` whole epochs.
        """
        client, now = int(client), self.now
        if self.busy[client]:
            raise RuntimeError(f"client {client} is already training")
        if not self._always_online and not self.availability.is_online(client, now):
            raise RuntimeError(f"client {client} is offline at virtual time {now}")
        n = int(self.num_samples[client])
        per_epoch = steps_per_epoch(n, self.batch_size, self.drop_last)
        if local_steps is None:
            epochs, steps = self.local_epochs, self.local_epochs * per_epoch
            work = (per_epoch * self.batch_size if self.drop_last else n) * self.local_epochs
        else:
            check_int("local_steps", local_steps, 1)
            if per_epoch < 1:
                raise ValueError(f"client {client} has no full batch (n={n}, batch_size={self.batch_size}, "
                                 "drop_last=True): it cannot run local_steps; allowed: drop_last=False")  # fmt: skip
            epochs, steps = -(-int(local_steps) // per_epoch), int(local_steps)
            work = samples_before_step(n, self.batch_size, steps, self.drop_last)
        job_id = self.next_job_id
        self.next_job_id += 1
        if timing is None:
            timing = self.device_model.job_timing(self.profiles, client, work, self.model_bytes, self.rng)
        job = ClientJob(
            job_id=job_id,
            client=client,
            base_version=self.server.version,
            dispatch_time=now,
            timing=timing,
            seed=derive_seed(self.seed, client, job_id),
            local_epochs=epochs,
            num_steps=steps,
            local_steps=None if local_steps is None else steps,
        )
        steps = [k for cb in self.client_callbacks if (k := cb.request_step(job)) is not None]  # ask every one
        if steps:
            step = min(steps)  # one request per job: the earliest asked for
            if not 1 <= step <= job.num_steps:
                raise ValueError(f"request_step must be in [1, {job.num_steps}] for client {client}, got {step}")
            job.request_step = step
            job.request_fraction = samples_before_step(n, self.batch_size, step, self.drop_last) / work
        else:
            job.arrival_time = now + timing.total
        if not self._always_online:
            self._plan_drop(job, now)
        self.busy[client] = True
        self.in_flight[job_id] = job
        self._hold_snapshot(job.base_version, self.server.weights)
        self.server.stats.bytes_down += self.model_bytes
        if not self._will_train(job):  # lost before its request or arrival: only its loss is on the clock
            self.queue.push(job.drop_time, "drop", job_id=job_id)
        elif steps:
            self.executor.submit(job, self.snapshots[job.base_version])
            self.queue.push(job.request_time, "request", job_id=job_id)
        else:
            self.executor.submit(job, self.snapshots[job.base_version])
            self.queue.push(job.arrival_time, "arrival", job_id=job_id)
        return job

    def _plan_drop(self, job: ClientJob, now: float) -> None:
        """When the job will be lost, if at all: its device goes offline, or it crashes (at a point drawn uniformly
        over its planned duration — download, compute, upload; not a mid-training request's extra download — from a
        stream keyed by the job)."""
        offline = self.availability.next_offline(job.client, now)
        if offline < math.inf:
            job.drop_time, job.drop_reason = offline, "offline"
        if self.availability.crash_probability > 0:
            coin, where = np.random.default_rng([self.seed, CRASH_STREAM, job.job_id]).random(2)
            crash = now + float(where) * job.timing.total
            if float(coin) < self.availability.crash_probability and crash < job.drop_time:
                job.drop_time, job.drop_reason = crash, "crash"

    @staticmethod
    def _will_train(job: ClientJob) -> bool:
        """Whether the job reaches its next event (its request, or its arrival) before it is lost: only then is it
        computed (a job lost earlier is never trained, so nothing learns from it)."""
        if job.request_step is not None and math.isnan(job.arrival_time):  # before its request
            return job.drop_time >= job.request_time
        return job.drop_time >= job.arrival_time

    def cancel(self, job_id: int) -> ClientJob:
        """Abandon a job (e.g. ASFL's deprecated devices): in flight, its arrival never happens and its client is
        idle; arrived but waiting for the server (held), its update is dropped."""
        if job_id in self.waiting:
            job, _ = self.waiting.pop(job_id)
            self.cancelled += 1
            return job
        job = self.in_flight.pop(job_id)
        self.queue.remove(lambda e: e.kind in JOB_EVENTS and e.data.get("job_id") == job_id)
        self.ready.pop(job_id, None)
        self.executor.cancel(job_id)
        self.busy[job.client] = False
        self._release_snapshot(job.base_version)
        self.cancelled += 1
        return job

    def _request(self, job_id: int) -> None:
        """A device asks for the global model current now; it gets it only if newer than its start model.

        The executor learns from the job's merge here (``executor.request``), at the request's virtual time,
        because what the device learns from it (e.g. FedASMU's reward) may update shared state that later
        dispatches read; the rest of the job is consumed at its arrival (an error after the merge fails the job
        there). A job that will be lost before its update arrives is not computed: nothing learns from it.
        """
        job = self.in_flight[job_id]
        server = self.server
        newer = server.version > job.base_version
        extra_download = job.timing.download if newer else 0.0
        remaining = job.timing.compute * (1.0 - job.request_fraction)
        arrival = self.now + extra_download + remaining + job.timing.upload
        if job.drop_time < arrival:
            job.arrival_time = arrival
            self.executor.cancel(job_id)
            self.queue.push(job.drop_time, "drop", job_id=job_id)
            return
        fresh = (server.weights, server.version) if newer else None
        if self._job_result(job, fresh, request=True) is None:  # first: a failure leaves the state untouched
            return
        if newer:
            job.fresh_version = server.version
            server.stats.bytes_down += self.model_bytes
        job.arrival_time = arrival
        self.queue.push(job.arrival_time, "arrival", job_id=job_id)

    def _job_result(
        self, job: ClientJob, fresh: tuple[Tensor, int] | None = None, request: bool = False
    ) -> ClientUpdate | bool | None:
        """The job's update from the executor (``request``: its request's part, the merge, then ``True``); on an
        exception in the job, raise :class:`ClientJobError` or (with ``on_client_error="drop"``) drop the job and
        return ``None``."""
        try:  # (client callbacks learn from a job in on_train_end, which a job that raises never reaches)
            if request:
                self.executor.request(job.job_id, fresh)
                return True
            return self.executor.result(job.job_id, fresh=fresh)
        except Exception as error:
            if _is_storage_error(error):  # the run's disk, not the client: never dropped, never blamed on it
                raise
            if self.on_client_error == "raise":
                raise ClientJobError(
                    f"the job {job.job_id} of client {job.client} (from version {job.base_version}) raised "
                    f"{type(error).__name__}: {error}; the run stopped before this event (set "
                    "on_client_error='drop' to drop failing jobs and go on)"
                ) from error
            log.warning("lit_asyncfl: dropped job %d of client %d: %s: %s", job.job_id, job.client,
                        type(error).__name__, error)  # fmt: skip
            self.drop(job.job_id, "client_error")
            return None

    def drop(self, job_id: int, reason: str) -> ClientJob:
        """End an in-flight job without an update (its device failed or went away): counted in :attr:`dropped`
        under ``reason``, its device idle again, its start model released; client callbacks' ``on_job_dropped``
        and the scheduler's ``on_drop`` are told. Counts towards the stalled arrivals (no progress)."""
        self.queue.remove(lambda e: e.kind in JOB_EVENTS and e.data.get("job_id") == job_id)
        return self._lose(job_id, reason)

    def _lose(self, job_id: int, reason: str) -> ClientJob:
        """:meth:`drop` without looking for the job's events (at its own ``drop`` event, the only one it has)."""
        job = self.in_flight.pop(job_id)
        self.ready.pop(job_id, None)
        self.executor.cancel(job_id)
        self.busy[job.client] = False
        self._release_snapshot(job.base_version)
        self.dropped[reason] += 1
        self.stalled_arrivals += 1
        for cb in self.client_callbacks:
            cb.on_job_dropped(job, reason)
        self.scheduler.on_drop(self, job, reason)
        return job
