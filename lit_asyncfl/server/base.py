"""Server callbacks: the small hooks through which an algorithm shapes what the server does with an update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class ServerCallback:
    """Base class of server callbacks; every hook does nothing by default.

    For each arriving update the server calls, over its ordered callbacks: every ``reject_update`` (the first
    reason returned rejects the update), then every ``transform_update`` (correction, fusion), then every
    ``weight_update`` (a multiplicative chain starting at 1.0), then hands the update and its weight to the
    algorithm's :class:`~lit_asyncfl.server.aggregators.Aggregator`. When the aggregator has produced the next
    model, every ``transform_aggregate`` may change the step, then ``on_aggregated`` is called.

    State that must survive a checkpoint goes through :meth:`state_dict` / :meth:`load_state_dict`, stored under
    :attr:`state_key`.
    """

    #: How a rejection by this callback is counted in the summary: ``"rejected"`` or ``"discarded"``.
    rejection_kind: str = "rejected"
    #: Fraction of the training data held out for the server before partitioning (``server.data``).
    server_data_fraction: float = 0.0
    #: Set by the callback to a reason (e.g. ``"privacy_budget"``) when the server can make no more progress: the run
    #: then ends at the end of the event, with that ``stop_reason``. Reset it in :meth:`on_fit_start`.
    stop_reason: str | None = None

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint; override to let two instances coexist."""
        return type(self).__qualname__

    def on_fit_start(self, server: Server) -> None:
        """Called when a run starts, before any dispatch: reset per-run state here."""

    def processing_time(self, server: Server, update: ClientUpdate) -> float:
        """Virtual seconds of server compute this callback will spend on ``update`` (e.g. distillation).

        Called when the server starts on an update (``update.staleness`` is set). While the server works, later
        arrivals queue; the update is processed, and the new version published, when the time has passed.
        """
        return 0.0

    def reject_update(self, server: Server, update: ClientUpdate) -> str | None:
        """Return a short reason to reject ``update``, or ``None`` to accept it."""
        return None

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        """Return the update to aggregate (e.g. corrected by distillation)."""
        return update

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        """Return the update's aggregation weight, given the weight computed by the callbacks before."""
        return weight

    def transform_aggregate(self, server: Server, step: Tensor, updates: list[ClientUpdate]) -> Tensor:
        """Return the step to apply to the global model (``new - current``), e.g. rescaled (FedHist's INA)."""
        return step

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        """Called after the global model moved to a new version built from ``updates``
        (``server.previous_weights`` holds the model before)."""

    def metrics(self, server: Server) -> dict[str, Any]:
        """Values this callback adds to every evaluation row (hence the loggers) and to the run summary, e.g. the
        privacy spent (``dp_epsilon``); keys must not clash with the row's own."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state (plain Python values and tensors)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
