"""Schedulers decide when and whom to dispatch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_asyncfl.checks import check_count_or_fraction, is_int

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.schedulers.view import SchedulerView


def resolve_count(name: str, value: int | float, num_clients: int) -> int:
    """An absolute number of clients from a count (``int >= 1``) or a fraction (``float`` in ``(0, 1]``).

    Example:
        >>> resolve_count("concurrency", 0.1, 100), resolve_count("concurrency", 7, 100)
        (10, 7)
    """
    check_count_or_fraction(name, value)
    if not is_int(value):
        return max(1, round(value * num_clients))
    if value > num_clients:
        raise ValueError(f"{name}={value} is larger than num_clients={num_clients}; allowed: 1..{num_clients}")
    return int(value)


class Scheduler:
    """Base class of schedulers.

    The simulator calls :meth:`on_fit_start` once, :meth:`on_arrival` before and :meth:`on_update` after the server
    processes each arrival,
    and :meth:`on_event` for the events the scheduler put on the clock itself (e.g. periodic triggers). Each hook
    receives the simulator as a :class:`~lit_asyncfl.schedulers.view.SchedulerView`: a scheduler uses only its
    members.
    """

    #: Whether the scheduler reads the evaluation's ``accuracy`` (the monitored metric) as an accuracy, higher
    #: being better (e.g. ASFL's objective): the trainer then refuses ``mode="min"``.
    needs_accuracy = False

    def setup(self, num_clients: int) -> None:
        """Validate against the number of clients (raise ``ValueError`` naming the bad value)."""

    def on_fit_start(self, sim: SchedulerView) -> None:
        """Make the first dispatches or schedule the first trigger."""

    def on_arrival(self, sim: SchedulerView, update: ClientUpdate) -> None:
        """See an update as the server is about to process it (e.g. to learn a device's training loss)."""

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        """React to a processed arrival (``aggregated``: whether a new global version was made)."""

    def on_drop(self, sim: SchedulerView, job: ClientJob, reason: str) -> None:
        """React to a job that ended without an update (e.g. its client raised, ``reason="client_error"``).

        By default as to an arrival the server did not aggregate (``on_update(sim, job, aggregated=False)``): the
        asynchronous schedulers refill, synchronous rounds close once every other member answered (the round
        aggregates who returned).
        """
        self.on_update(sim, job, False)

    def on_online(self, sim: SchedulerView) -> None:
        """Idle devices that were offline when the scheduler last looked for some (``sim.sample_idle`` came back
        short) are coming back online: e.g. refill. Only a scheduler that overrides this hook is woken."""

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        """Handle an event this scheduler scheduled."""

    def summary(self) -> dict[str, Any]:
        """Run-level results added to the trainer's summary (e.g. ASFL's objective)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
