"""The event loop: dispatches, arrivals and triggers processed in virtual-time order."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.availability import AlwaysAvailable, Availability
from lit_asyncfl.checks import check_choice, check_int
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.client_state import ClientStateError
from lit_asyncfl.core.clock import Event, EventQueue
from lit_asyncfl.core.seeding import derive_seed
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data.shards import steps_per_epoch
from lit_asyncfl.devices import DeviceModel, DeviceProfiles
from lit_asyncfl.schedulers.base import Scheduler

log = logging.getLogger("lit_asyncfl")

#: What an exception in a client job does (see :class:`Simulator`).
ON_CLIENT_ERROR = ("raise", "drop")
#: The events that belong to one job (removed with it when it is cancelled or dropped).
JOB_EVENTS = ("arrival", "request", "drop")
#: The event kinds the simulator handles itself (a scheduler's events must be named otherwise).
SIMULATOR_EVENTS = (*JOB_EVENTS, "processed", "resume", "online")
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


def samples_before_step(num_samples: int, batch_size: int, step: int, drop_last: bool = False) -> int:
    """Training samples processed by the first ``step`` local steps (epochs of :func:`steps_per_epoch` steps).

    Example:
        >>> samples_before_step(25, 10, 3), samples_before_step(25, 10, 4), samples_before_step(25, 10, 6)
        (25, 35, 50)
        >>> samples_before_step(25, 10, 3, drop_last=True)  # epochs of 2 steps, 20 samples
        30
    """
    per_epoch = steps_per_epoch(num_samples, batch_size, drop_last)
    epoch_samples = per_epoch * batch_size if drop_last else num_samples
    epochs, within = divmod(step, per_epoch)
    return epochs * epoch_samples + min(within * batch_size, num_samples)


def sample_profiles(device_model: DeviceModel, num_clients: int, seed: int) -> DeviceProfiles:
    """The run's device profiles: drawn from a stream of their own, so partitions may depend on them."""
    return device_model.sample_profiles(num_clients, np.random.default_rng([seed, 0xDE71CE]))


class SimulationObserver:
    """What watches a simulation from outside (the trainer's run callbacks): told of new versions and metrics.

    Both hooks are called *inside* an event (the state is then mid-event; see ``Simulator.run``'s ``after_event``
    for the event boundaries).
    """

    def on_new_version(self, sim: Simulator) -> None:
        """The server has just made a new global version."""

    def on_log(self, sim: Simulator, metrics: dict[str, Any]) -> None:
        """The scheduler logged ``metrics`` at the current version (see :meth:`Simulator.log`)."""

    def on_update(self, sim: Simulator, update: ClientUpdate, aggregated: bool) -> None:
        """The server processed ``update`` (``aggregated``: whether it made a new version)."""


class Simulator:
    """Runs one federated simulation on a virtual clock.

    The simulator owns the event queue, which clients are training, and the start models of in-flight jobs.
    Schedulers call :meth:`dispatch`, :meth:`sample_idle`, :meth:`schedule` and :meth:`flush`. Local training is
    delegated to an executor (``submit`` at dispatch, ``result`` at the arrival event), so the order in which
    updates are *computed* never changes the order in which they are *consumed*.

    Args:
        server: The server holding the global model.
        scheduler: When and whom to dispatch.
        executor: Computes client updates (``submit``/``result``/``cancel``).
        device_model: Simulated device durations.
        num_samples: Number of training samples of each client.
        local_epochs: Local epochs ``E`` per job.
        batch_size: Local mini-batch size (to know how many steps a job takes).
        seed: Run seed (device profiles, client choice, per-job seeds).
        model_bytes: Bytes of one model transfer.
        client_callbacks: Client callbacks (their state is checkpointed with the simulation).
        profiles: The clients' device profiles, when drawn beforehand (see :func:`sample_profiles`).
        drop_last: Local epochs drop their last incomplete batch (fewer steps and samples per job).
        evaluator: Evaluates the current global model and returns its metrics (see :meth:`evaluate`).
        observers: Told of each new global version and of the metrics schedulers log.
        on_client_error: What an exception in a client job does: ``"raise"`` ends the run with a
            :class:`ClientJobError` raised at the event boundary before the failing event (nothing of that event
            is applied, so a checkpoint then resumes exactly); ``"drop"`` drops the job (counted in
            :attr:`dropped` under ``"client_error"``, its device idle again, the scheduler told through
            ``on_drop``) and the run goes on.
        availability: When each device is online (default: :class:`~lit_asyncfl.availability.AlwaysAvailable`).
            Only online idle devices are dispatched; a job whose device goes offline (or crashes) before its update
            arrives is dropped at that moment (:meth:`drop`, reason ``"offline"`` or ``"crash"``). A scheduler left
            short of online devices is woken through ``on_online`` when one comes back.
        client_state: The run's :class:`~lit_asyncfl.core.client_state.ClientStateStore` (per-client tensors of the
            client callbacks), checkpointed with the simulation; ``None`` when no callback keeps any.
    """

    def __init__(
        self,
        server: Server,
        scheduler: Scheduler,
        executor: Any,
        device_model: DeviceModel,
        num_samples: Sequence[int],
        local_epochs: int,
        batch_size: int,
        seed: int,
        model_bytes: int,
        client_callbacks: Sequence[ClientCallback] = (),
        profiles: DeviceProfiles | None = None,
        drop_last: bool = False,
        evaluator: Callable[[], dict[str, Any]] | None = None,
        observers: Sequence[SimulationObserver] = (),
        on_client_error: str = "raise",
        availability: Availability | None = None,
        client_state: Any = None,
    ) -> None:
        check_choice("on_client_error", on_client_error, ON_CLIENT_ERROR)
        self.client_state = client_state
        self.availability = availability if availability is not None else AlwaysAvailable()
        self.availability.setup(len(num_samples), seed)
        self.on_client_error = on_client_error
        self.server = server
        self.scheduler = scheduler
        self.executor = executor
        self.device_model = device_model
        self.num_clients = len(num_samples)
        self.num_samples = np.asarray(num_samples, dtype=np.int64)
        self.local_epochs = local_epochs
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.seed = seed
        self.model_bytes = model_bytes
        self.client_callbacks = list(client_callbacks)
        self.profiles = profiles if profiles is not None else sample_profiles(device_model, self.num_clients, seed)
        self.rng = np.random.default_rng([seed, 0x5C4ED])
        self.queue = EventQueue()
        self.busy = np.zeros(self.num_clients, dtype=bool)
        self.in_flight: dict[int, ClientJob] = {}
        self.ready: dict[int, ClientUpdate] = {}  # updates computed at a request event, waiting for arrival
        self.waiting: dict[int, tuple[ClientJob, ClientUpdate]] = {}  # arrived, waiting for the server
        self.server_busy_until = 0.0
        self.holding = False
        self.snapshots: dict[int, Tensor] = {}
        self._snapshot_refs: Counter[int] = Counter()
        self.next_job_id = 0
        self.events_processed = 0
        self.stalled_arrivals = 0
        self.cancelled = 0
        #: Jobs that ended without an update reaching the server, per reason (e.g. ``"client_error"``).
        self.dropped: Counter[str] = Counter()
        self.evaluator = evaluator
        self.observers = list(observers)
        #: Whether an event is being processed (the state is consistent, e.g. for a checkpoint, only between events).
        self.in_event = False
        #: When the scheduler will be woken because an offline idle device comes back (``None``: no wake pending).
        self.wake_at: float | None = None
        self._wakes = type(scheduler).on_online is not Scheduler.on_online  # only a scheduler that listens

    # -- time and state seen by schedulers -------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Current virtual time."""
        return self.server.now

    @property
    def num_training(self) -> int:
        """Number of clients currently training."""
        return len(self.in_flight)

    def idle_online(self) -> np.ndarray:
        """The clients that are idle and online now (ascending)."""
        return np.flatnonzero(~self.busy & self.availability.online(self.now))

    def sample_idle(self, k: int) -> np.ndarray:
        """Up to ``k`` distinct idle online clients drawn uniformly at random.

        When fewer than ``k`` are online and idle devices are offline, the scheduler is woken (``on_online``) when
        the first of them comes back.
        """
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        idle = self.idle_online()
        if len(idle) < k and len(idle) < self.num_clients - self.num_training:  # idle devices are offline
            self.wake_when_online()
        if len(idle) <= k:
            return idle
        return np.sort(self.rng.choice(idle, size=k, replace=False))

    def wake_when_online(self) -> None:
        """Call the scheduler's ``on_online`` when the first idle device now offline comes back online (once; an
        earlier pending wake-up stands)."""
        if not self._wakes:
            return
        offline = np.flatnonzero(~self.busy & ~self.availability.online(self.now))
        if len(offline) == 0:
            return
        time = self.availability.next_online(offline, self.now)
        if math.isinf(time) or (self.wake_at is not None and self.wake_at <= time):
            return
        if self.wake_at is not None:
            self.queue.remove(lambda e: e.kind == "online")
        self.wake_at = time
        self.queue.push(time, "online")

    def schedule(self, time: float, kind: str, **data: Any) -> Event:
        """Put a scheduler event on the clock (handed to the scheduler's ``on_event``; the simulator's own kinds,
        :data:`SIMULATOR_EVENTS`, are refused)."""
        if kind in SIMULATOR_EVENTS:
            raise ValueError(f"event kind {kind!r} is the simulator's own; allowed: any other, not {SIMULATOR_EVENTS}")
        return self.queue.push(time, kind, **data)

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
        client = int(client)
        if self.busy[client]:
            raise RuntimeError(f"client {client} is already training")
        if not self.availability.is_online(client, self.now):
            raise RuntimeError(f"client {client} is offline at virtual time {self.now}")
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
            dispatch_time=self.now,
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
            job.arrival_time = self.now + timing.total
        self._plan_drop(job)
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

    def _plan_drop(self, job: ClientJob) -> None:
        """When the job will be lost, if at all: its device goes offline, or it crashes (at a point drawn uniformly
        over its planned duration — download, compute, upload; not a mid-training request's extra download — from a
        stream keyed by the job)."""
        offline = self.availability.next_offline(job.client, self.now)
        if offline < math.inf:
            job.drop_time, job.drop_reason = offline, "offline"
        if self.availability.crash_probability > 0:
            coin, where = np.random.default_rng([self.seed, CRASH_STREAM, job.job_id]).random(2)
            crash = self.now + float(where) * job.timing.total
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

    def hold_arrivals(self) -> None:
        """Let arriving updates wait, in arrival order, until :meth:`release_arrivals` (e.g. the rest of a round's
        arrivals once its quota is met: they belong to the next round)."""
        self.holding = True

    def release_arrivals(self) -> None:
        """Process the waiting updates right after the current event (no-op when not holding)."""
        if self.holding:
            self.holding = False
            self.queue.push(self.now, "resume")

    def evaluate(self) -> dict[str, Any]:
        """Metrics of the current global model (``accuracy``, ``loss``, ...), from the trainer's evaluation."""
        if self.evaluator is None:
            raise RuntimeError("this simulator has no evaluator (the FederatedTrainer passes one)")
        return self.evaluator()

    def log(self, metrics: dict[str, Any]) -> None:
        """Log scheduler metrics (e.g. a round's latency and reward) at the current version and virtual time."""
        for observer in self.observers:
            observer.on_log(self, metrics)

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

    # -- the loop -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Reset the server and callbacks and make the first dispatches."""
        self.in_event = True
        self.server.on_fit_start()
        for cb in self.client_callbacks:
            cb.on_fit_start(self.num_clients)
        self.scheduler.on_fit_start(self)
        self.in_event = False

    def run(
        self,
        max_virtual_time: float | None = None,
        max_versions: int | None = None,
        after_event: Callable[[], bool] | None = None,
        max_stalled_arrivals: int | None = None,
    ) -> str:
        """Process events in (virtual time, sequence) order until a budget is reached or the queue is empty.

        Args:
            max_virtual_time: Process events up to and including this virtual time.
            max_versions: Stop once the global version reaches this number.
            after_event: Called after each event; returning ``True`` stops the loop.
            max_stalled_arrivals: Stop when this many updates in a row arrived without producing a new global
                version (every one rejected or discarded): the run can make no more progress.

        Returns:
            Why the loop stopped: ``"max_versions"``, ``"max_virtual_time"``, ``"queue_empty"``, ``"stopped"``
            (``after_event`` asked) or ``"stalled"``.
        """
        while self.queue:
            if max_versions is not None and self.server.version >= max_versions:
                return "max_versions"
            head = self.queue.peek()
            assert head is not None
            if max_virtual_time is not None and head.time > max_virtual_time:
                return "max_virtual_time"
            self.step()
            if after_event is not None and after_event():
                return "stopped"
            if max_stalled_arrivals is not None and self.stalled_arrivals >= max_stalled_arrivals:
                return "stalled"
        if max_versions is not None and self.server.version >= max_versions:
            return "max_versions"
        return "queue_empty"

    def step(self) -> None:
        """Process the next event."""
        event = self.queue.pop()
        now = self.server.now
        self.server.now = event.time
        self.in_event = True
        try:
            self._handle(event)
        except ClientJobError:  # raised before the event changed anything: back to the boundary before it
            self.queue.restore(event)
            self.server.now = now
            self.in_event = False
            raise
        self.in_event = False
        self.events_processed += 1

    def _handle(self, event: Event) -> None:
        if event.kind == "arrival":
            self._arrival(event.data["job_id"])
        elif event.kind == "request":
            self._request(event.data["job_id"])
        elif event.kind == "processed":
            self._process(*self.waiting.pop(event.data["job_id"]))
            self._serve()
        elif event.kind == "resume":
            self._serve()
        elif event.kind == "drop":
            job = self.in_flight[event.data["job_id"]]
            self._lose(job.job_id, job.drop_reason)
        elif event.kind == "online":
            self.wake_at = None
            self.scheduler.on_online(self)
        else:
            self.scheduler.on_event(self, event)

    def _request(self, job_id: int) -> None:
        """A device asks for the global model current now; it gets it only if newer than its start model.

        The job is computed here, at the request's virtual time, because what the device learns from the merge
        (e.g. FedASMU's reward) may update shared state that later dispatches read. A job that will be lost before
        its update arrives is not computed: nothing learns from it.
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
        update = self._job_result(job, fresh)  # first: a failure leaves the state untouched
        if update is None:
            return
        if newer:
            job.fresh_version = server.version
            server.stats.bytes_down += self.model_bytes
        self.ready[job_id] = update
        job.arrival_time = arrival
        self.queue.push(job.arrival_time, "arrival", job_id=job_id)

    def _job_result(self, job: ClientJob, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate | None:
        """The job's update from the executor; on an exception in the job, raise :class:`ClientJobError` or (with
        ``on_client_error="drop"``) drop the job and return ``None``."""
        try:  # (client callbacks learn from a job in on_train_end, which a job that raises never reaches)
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
        while self.waiting and not self.holding and self.now >= self.server_busy_until:
            job_id, (job, update) = next(iter(self.waiting.items()))
            cost = self.server.processing_time(update)
            if cost > 0:
                self.server_busy_until = self.now + cost
                self.queue.push(self.server_busy_until, "processed", job_id=job_id)
                return
            del self.waiting[job_id]
            self._process(job, update)

    def _process(self, job: ClientJob, update: ClientUpdate) -> None:
        version = self.server.version
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

    # -- checkpoints ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the simulation exactly (plain values and tensors only)."""
        return {
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
        for job_state in sorted(state["in_flight"], key=lambda s: s["job_id"]):
            job = ClientJob.from_state_dict(job_state)
            self.in_flight[job.job_id] = job
            self._hold_snapshot(job.base_version, state["snapshots"][job.base_version])
            if job.job_id not in self.ready and self._will_train(job):
                self.executor.submit(job, self.snapshots[job.base_version])
