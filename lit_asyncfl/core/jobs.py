"""A client job's life in the simulator: dispatched, asked for a fresh model mid-training, arrived and served to the
server in arrival order (a new version), or lost (offline, crashed, failed) or cancelled; the start models of the
jobs in flight. Part of :class:`~lit_asyncfl.core.simulator.Simulator` (a base class of it)."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from lit_asyncfl.checks import check_int
from lit_asyncfl.core.client_state import ClientStateError
from lit_asyncfl.core.job_work import samples_before_step
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming, derive_seed
from lit_asyncfl.data.shards import steps_per_epoch
from lit_asyncfl.devices import DeviceModel, DeviceProfiles

log = logging.getLogger("lit_asyncfl")

#: The events of a job on the clock.
JOB_EVENTS = ("arrival", "request", "drop")
#: Salt of the per-job crash draws (a stream keyed by the job: drawing never shifts the simulator's own stream).
CRASH_STREAM = 0xC4A54


class ClientJobError(RuntimeError):
    """A client job raised; the simulation stopped at the event boundary before the job's event."""


class ExecutorError(RuntimeError):
    """A failure of the executor itself, not of a client job (the Ray workers cannot build the run's engine, or no
    trainer is left to compute a result): raised as it is, never dropped nor blamed on a client (see
    :meth:`JobLifecycle._client_error`)."""


def _is_storage_error(error: BaseException | None) -> bool:
    """Whether ``error`` (or what caused it) is a failure of the run's client state storage (a full disk)."""
    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, ClientStateError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


class JobLifecycle:
    """The simulator's jobs from dispatch to the server (or their loss or cancellation), and the start-model
    snapshots of the jobs in flight (a base class of :class:`~lit_asyncfl.core.simulator.Simulator`).

    Args:
        executor: Computes the jobs' updates (``submit``/``result``/``cancel``).
        device_model: Simulated device durations.
        num_samples: Number of training samples of each client.
        local_epochs: Local epochs ``E`` per job.
        batch_size: Local mini-batch size (to know how many steps a job takes).
        drop_last: Local epochs drop their last incomplete batch.
        model_bytes: Bytes of one model transfer.
        profiles: The clients' device profiles.
    """

    def __init__(
        self,
        executor: Any,
        device_model: DeviceModel,
        num_samples: Sequence[int],
        local_epochs: int,
        batch_size: int,
        drop_last: bool,
        model_bytes: int,
        profiles: DeviceProfiles,
    ) -> None:
        self.executor, self.device_model, self.profiles = executor, device_model, profiles
        self.num_clients = len(num_samples)
        self.num_samples = np.asarray(num_samples, dtype=np.int64)
        self.local_epochs, self.batch_size, self.drop_last = local_epochs, batch_size, drop_last
        self.model_bytes = model_bytes
        self.busy = np.zeros(self.num_clients, dtype=bool)
        self.in_flight: dict[int, ClientJob] = {}
        self.ready: dict[int, ClientUpdate] = {}  # updates of jobs past their request, settled for a checkpoint
        self.waiting: dict[int, tuple[ClientJob, ClientUpdate]] = {}  # arrived, waiting for the server
        #: Until when the server is busy with an update (see :meth:`_serve`); arrivals meanwhile wait.
        self.server_busy_until = 0.0
        #: Whether arrivals wait (:meth:`hold_arrivals`).
        self.holding = False
        #: The start model of each version some job in flight started from, and how many jobs did.
        self.snapshots: dict[int, Tensor] = {}
        self._snapshot_refs: Counter[int] = Counter()
        self.next_job_id = 0
        #: Updates in a row that arrived without producing a new global version.
        self.stalled_arrivals = 0
        self.cancelled = 0
        #: Jobs that ended without an update reaching the server, per reason (e.g. ``"client_error"``).
        self.dropped: Counter[str] = Counter()

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
        client, now = int(client), self.server.now
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
        arrival = self.server.now + extra_download + remaining + job.timing.upload
        if job.drop_time < arrival:
            job.arrival_time = arrival
            self.executor.cancel(job_id)
            self.queue.push(job.drop_time, "drop", job_id=job_id)
            return
        fresh = (server.weights, server.version) if newer else None
        if not self._learn_merge(job, fresh):  # first: a failure leaves the state untouched
            return
        if newer:
            job.fresh_version = server.version
            server.stats.bytes_down += self.model_bytes
        job.arrival_time = arrival
        self.queue.push(job.arrival_time, "arrival", job_id=job_id)

    def _job_result(self, job: ClientJob) -> ClientUpdate | None:
        """The job's update from the executor; ``None`` when the job raised and was dropped (see
        :meth:`_client_error`)."""
        try:  # (client callbacks learn from a job in on_train_end, which a job that raises never reaches)
            return self.executor.result(job.job_id)
        except Exception as error:
            self._client_error(job, error)
            return None

    def _learn_merge(self, job: ClientJob, fresh: tuple[Tensor, int] | None) -> bool:
        """The executor learns from the job's merge (its part up to the request, then the merge with ``fresh``);
        ``False`` when the job raised there and was dropped (see :meth:`_client_error`)."""
        try:
            self.executor.request(job.job_id, fresh)
        except Exception as error:
            self._client_error(job, error)
            return False
        return True

    def _client_error(self, job: ClientJob, error: Exception) -> None:
        """An exception in a job: raise :class:`ClientJobError`, or (``on_client_error="drop"``) drop the job. An
        error of the run's storage or of the executor itself (:class:`ExecutorError`) is raised as it is (never
        dropped, never blamed on the client)."""
        if _is_storage_error(error) or isinstance(error, ExecutorError):
            raise error
        if self.on_client_error == "raise":
            raise ClientJobError(
                f"the job {job.job_id} of client {job.client} (from version {job.base_version}) raised "
                f"{type(error).__name__}: {error}; the run stopped before this event (set "
                "on_client_error='drop' to drop failing jobs and go on)"
            ) from error
        log.warning("lit_asyncfl: dropped job %d of client %d: %s: %s", job.job_id, job.client,
                    type(error).__name__, error)  # fmt: skip
        self.drop(job.job_id, "client_error")

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

    # -- arrivals: served to the server in arrival order -------------------------------------------------------------
    def hold_arrivals(self) -> None:
        """Let arriving updates wait, in arrival order, until :meth:`release_arrivals` (e.g. the rest of a round's
        arrivals once its quota is met: they belong to the next round)."""
        self.holding = True

    def release_arrivals(self) -> None:
        """Process the waiting updates right after the current event (no-op when not holding)."""
        if self.holding:
            self.holding = False
            self.queue.push(self.server.now, "resume")

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
        now = self.server.now  # (the time of the event being processed)
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


#: The former base class serving arrivals (now part of :class:`JobLifecycle`).
ArrivalQueue = JobLifecycle
