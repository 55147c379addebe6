"""What a scheduler may use of the simulator: :class:`SchedulerView`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from lit_asyncfl.availability import Availability
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
    from lit_asyncfl.devices import DeviceModel, DeviceProfiles


@runtime_checkable
class SchedulerView(Protocol):
    """The simulator as a scheduler sees it: the only members a scheduler's hooks may read or call.

    Every hook of a :class:`~lit_asyncfl.schedulers.base.Scheduler` receives the
    :class:`~lit_asyncfl.core.simulator.Simulator` typed as this view; the rest of the simulator (its event loop,
    checkpoint, executor, snapshots, observers) is its own business. ``tests/schedulers/test_view.py`` runs every
    preset's scheduler against a proxy that exposes only these members and checks the scheduler sources statically.
    Attributes are read, never assigned (the arrays and dicts are the simulator's own: read them, do not change them).

    Example:
        >>> sorted(SCHEDULER_VIEW)[:6]
        ['availability', 'busy', 'cancel', 'device_model', 'dispatch', 'drop']
        >>> len(SCHEDULER_VIEW)
        26
    """

    # -- the run's settings ----------------------------------------------------------------------------------------
    #: Number of clients.
    num_clients: int
    #: Training samples of each client (int64).
    num_samples: np.ndarray
    #: Local epochs ``E`` of a job dispatched without ``local_steps``.
    local_epochs: int
    #: The run seed (a scheduler's own random streams derive from it).
    seed: int
    #: Bytes of one model transfer (for a scheduler that models its own timing, e.g. ASFL).
    model_bytes: int
    #: The simulated devices (e.g. ASFL's positions and bandwidths).
    device_model: DeviceModel
    #: The clients' device profiles (e.g. FedCompass's speeds).
    profiles: DeviceProfiles
    #: When each device is online (``online(now)``, ``is_online(client, now)``).
    availability: Availability
    #: The server: its ``version`` and its ``aggregator`` (e.g. FedCompass's group releases).
    server: Server

    # -- the state now ---------------------------------------------------------------------------------------------
    #: Which clients are training (bool per client).
    busy: np.ndarray
    #: The jobs in flight, by job id.
    in_flight: Mapping[int, ClientJob]
    #: Arrived updates held for the server (see :meth:`hold_arrivals`), by job id: ``(job, update)``.
    waiting: Mapping[int, tuple[ClientJob, ClientUpdate]]

    @property
    def now(self) -> float:
        """Current virtual time."""
        ...

    @property
    def num_training(self) -> int:
        """Number of clients training now."""
        ...

    def idle_online(self) -> np.ndarray:
        """The clients idle and online now (ascending)."""
        ...

    def sample_idle(self, k: int) -> np.ndarray:
        """Up to ``k`` distinct idle online clients drawn at random (a short draw wakes ``on_online`` later)."""
        ...

    def wake_when_online(self) -> None:
        """Call the scheduler's ``on_online`` when the first idle device now offline comes back online."""
        ...

    # -- acting ----------------------------------------------------------------------------------------------------
    def dispatch(self, client: int, timing: JobTiming | None = None, local_steps: int | None = None) -> ClientJob:
        """Send the current global model to an idle online client."""
        ...

    def cancel(self, job_id: int) -> ClientJob:
        """Abandon a job in flight or held (its work is lost)."""
        ...

    def drop(self, job_id: int, reason: str) -> ClientJob:
        """End an in-flight job without an update, counted under ``reason``."""
        ...

    def schedule(self, time: float, kind: str, **data: Any) -> Event:
        """Put a scheduler event on the clock (handed back through ``on_event``)."""
        ...

    def flush(self) -> bool:
        """Aggregate what the server has buffered (a synchronous round's end)."""
        ...

    def hold_arrivals(self) -> None:
        """Let arriving updates wait, in arrival order, until :meth:`release_arrivals`."""
        ...

    def release_arrivals(self) -> None:
        """Process the waiting updates right after the current event."""
        ...

    def evaluate(self) -> dict[str, Any]:
        """Metrics of the current global model, from the trainer's evaluation."""
        ...

    def log(self, metrics: dict[str, Any]) -> None:
        """Log scheduler metrics at the current version and virtual time."""
        ...


#: The names of :class:`SchedulerView`'s members.
SCHEDULER_VIEW: frozenset[str] = frozenset(
    name
    for name in (*SchedulerView.__annotations__, *vars(SchedulerView))
    if not name.startswith("_") and name not in {"Protocol"}
)
