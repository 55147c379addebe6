"""What watches a simulation from outside: :class:`SimulationObserver`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lit_asyncfl.core.update import ClientUpdate

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Simulator


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
