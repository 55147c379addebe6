"""The event loop on the virtual clock: the clock's events (:class:`EventQueue`) processed in virtual-time order.

The :class:`Simulator` is assembled from one module per job: a job's life from dispatch to the server
(:mod:`lit_asyncfl.core.jobs`) and its checkpoint (:mod:`lit_asyncfl.core.simulation_state`); what a job costs is in
:mod:`lit_asyncfl.core.job_work`, its observers' hooks in :mod:`lit_asyncfl.core.observer`, and what a scheduler may
use of it in :mod:`lit_asyncfl.schedulers.view`. The names this module had before the split are importable from it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lit_asyncfl.availability import AlwaysAvailable, Availability
from lit_asyncfl.checks import check_choice
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.job_work import sample_profiles, samples_before_step
from lit_asyncfl.core.jobs import CRASH_STREAM, JOB_EVENTS, ClientJobError, ExecutorError, JobLifecycle
from lit_asyncfl.core.observer import SimulationObserver
from lit_asyncfl.core.retirement import RetiredOffline, retired_clients
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulation_state import SimulatorCheckpoint
from lit_asyncfl.devices import DeviceModel, DeviceProfiles
from lit_asyncfl.schedulers.base import Scheduler

__all__ = [
    "CRASH_STREAM",
    "JOB_EVENTS",
    "ON_CLIENT_ERROR",
    "SIMULATOR_EVENTS",
    "ClientJobError",
    "Event",
    "EventQueue",
    "ExecutorError",
    "SimulationObserver",
    "Simulator",
    "sample_profiles",
    "samples_before_step",
]

#: What an exception in a client job does (see :class:`Simulator`).
ON_CLIENT_ERROR = ("raise", "drop")
#: The event kinds the simulator handles itself (a scheduler's events must be named otherwise).
SIMULATOR_EVENTS = (*JOB_EVENTS, "processed", "resume", "online")


@dataclass(order=True, frozen=True)
class Event:
    """Something that happens at a virtual time.

    Events compare by ``(time, seq)``: ties in time are broken by the order in which they were scheduled, so the
    processing order never depends on anything but the simulation itself.

    Args:
        time: Virtual time (seconds) at which the event happens.
        seq: Sequence number given by the :class:`EventQueue` when the event was pushed.
        kind: What happens, e.g. ``"arrival"`` or ``"trigger"``.
        data: Plain payload (ints, floats, strings), so the queue can be checkpointed.
    """

    time: float
    seq: int
    kind: str = field(compare=False)
    data: dict[str, Any] = field(compare=False, default_factory=dict)


class EventQueue:
    """Events in virtual-time order; ties broken by insertion order.

    Example:
        >>> q = EventQueue()
        >>> _ = q.push(5.0, "arrival", client=1)
        >>> _ = q.push(2.0, "trigger")
        >>> _ = q.push(5.0, "arrival", client=0)
        >>> [(e.time, e.kind, e.data) for e in (q.pop(), q.pop(), q.pop())]
        [(2.0, 'trigger', {}), (5.0, 'arrival', {'client': 1}), (5.0, 'arrival', {'client': 0})]
    """

    def __init__(self) -> None:
        self._heap: list[Event] = []
        self._seq = 0

    def push(self, time: float, kind: str, **data: Any) -> Event:
        """Schedule an event ``kind`` at virtual ``time`` and return it."""
        if not math.isfinite(time) or time < 0:
            raise ValueError(f"event time must be finite and >= 0, got {time}")
        event = Event(float(time), self._seq, kind, data)
        self._seq += 1
        heapq.heappush(self._heap, event)
        return event

    def pop(self) -> Event:
        """Remove and return the earliest event."""
        return heapq.heappop(self._heap)

    def restore(self, event: Event) -> None:
        """Put back an event just popped, in its original place (same time and sequence number)."""
        heapq.heappush(self._heap, event)

    def peek(self) -> Event | None:
        """The earliest event without removing it, or ``None`` when empty."""
        return self._heap[0] if self._heap else None

    def remove(self, predicate: Any) -> list[Event]:
        """Remove every event for which ``predicate(event)`` is true and return them."""
        removed = [e for e in self._heap if predicate(e)]
        if removed:
            self._heap = [e for e in self._heap if not predicate(e)]
            heapq.heapify(self._heap)
        return removed

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return iter(sorted(self._heap))

    def state_dict(self) -> dict[str, Any]:
        """Plain, weights-only-loadable state."""
        return {"seq": self._seq, "events": [(e.time, e.seq, e.kind, dict(e.data)) for e in sorted(self._heap)]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
        self._seq = int(state["seq"])
        self._heap = [Event(float(t), int(s), k, dict(d)) for t, s, k, d in state["events"]]
        heapq.heapify(self._heap)


class Simulator(JobLifecycle, SimulatorCheckpoint):
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
        evaluator: Evaluates the current global model of the simulator it is given and returns its metrics (see
            :meth:`evaluate`).
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
        evaluator: Callable[[Simulator], dict[str, Any]] | None = None,
        observers: Sequence[SimulationObserver] = (),
        on_client_error: str = "raise",
        availability: Availability | None = None,
        client_state: Any = None,
    ) -> None:
        check_choice("on_client_error", on_client_error, ON_CLIENT_ERROR)
        self.client_state = client_state
        # A retired client is offline for good, to every scheduler. Wrapped before anything reads the availability:
        # RetiredOffline is never always_online, so a shortcut for always-online runs must see the wrapper.
        self._retiring = [cb for cb in client_callbacks if cb.retires_clients]
        if self._retiring:
            availability = RetiredOffline(availability or AlwaysAvailable(), self._retiring)
        self.availability = availability if availability is not None else AlwaysAvailable()
        self.availability.setup(len(num_samples), seed)
        #: Every device online at all times and no crash (the default): the simulator then asks the availability
        #: nothing (its answers are known).
        self._always_online = self.availability.always_online
        if profiles is None:
            profiles = sample_profiles(device_model, len(num_samples), seed)
        super().__init__(
            executor, device_model, num_samples, local_epochs, batch_size, drop_last, model_bytes, profiles
        )
        self.on_client_error = on_client_error
        self.server = server
        server.seed = seed
        self.scheduler = scheduler
        self.seed = seed
        self.client_callbacks = list(client_callbacks)
        self.rng = np.random.default_rng([seed, 0x5C4ED])
        self.queue = EventQueue()
        self.events_processed = 0
        self.evaluator = evaluator
        self.observers = list(observers)
        #: Whether an event is being processed (the state is consistent, e.g. for a checkpoint, only between events).
        self.in_event = False
        #: When the scheduler will be woken because an offline idle device comes back (``None``: no wake pending).
        self.wake_at: float | None = None
        self._wakes = type(scheduler).on_online is not Scheduler.on_online  # only a scheduler that listens
        self._hears_arrivals = type(scheduler).on_arrival is not Scheduler.on_arrival  # (told before the server)

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
        if self._always_online:
            return np.flatnonzero(~self.busy)
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
        if k == 1:  # (each arrival's refill) choice's one draw, as integers makes it: same client and stream (tested)
            return idle[self.rng.integers(0, len(idle), size=1)]
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

    def evaluate(self) -> dict[str, Any]:
        """Metrics of the current global model (``accuracy``, ``loss``, ...), from the trainer's evaluation."""
        if self.evaluator is None:
            raise RuntimeError("this simulator has no evaluator (the FederatedTrainer passes one)")
        return self.evaluator(self)

    def log(self, metrics: dict[str, Any]) -> None:
        """Log scheduler metrics (e.g. a round's latency and reward) at the current version and virtual time."""
        for observer in self.observers:
            observer.on_log(self, metrics)

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
            (``after_event`` asked), ``"stalled"``, the ``stop_reason`` a server callback set, or the
            ``retire_reason`` of a client callback that retired every client once no job is left (both
            ``"privacy_budget"`` for DP's budgets).
        """
        while self.queue:  # the budgets in one order, here and after the loop: max_versions, then retirement
            if max_versions is not None and self.server.version >= max_versions:
                return "max_versions"
            if self._all_retired():
                return self._retiring[0].retire_reason
            head = self.queue.peek()
            assert head is not None
            if max_virtual_time is not None and head.time > max_virtual_time:
                return "max_virtual_time"
            self.step()
            if after_event is not None and after_event():
                return "stopped"
            stop = next((cb.stop_reason for cb in self.server.callbacks if cb.stop_reason), None)
            if stop is not None:  # a server callback can make no more progress (e.g. central DP's budget)
                return stop
            if max_stalled_arrivals is not None and self.stalled_arrivals >= max_stalled_arrivals:
                return "stalled"
        if max_versions is not None and self.server.version >= max_versions:
            return "max_versions"
        if self._all_retired():
            return self._retiring[0].retire_reason
        return "queue_empty"

    def _all_retired(self) -> bool:
        """Whether client callbacks retired every client and no job is left in flight or waiting."""
        if not self._retiring or self.in_flight or self.waiting:
            return False
        retired = retired_clients(self._retiring)
        return retired is not None and bool(retired.all())

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
