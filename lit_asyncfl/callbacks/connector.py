"""The trainer's run callbacks: the built-in ones around the user's, and their connection to the simulator."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.model_helpers import is_overridden

from lit_asyncfl import namespaces
from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.callbacks.interrupt import InterruptHandler
from lit_asyncfl.callbacks.logger_connector import LoggerConnector
from lit_asyncfl.callbacks.model_checkpoint import ModelCheckpoint
from lit_asyncfl.callbacks.progress import ProgressBar
from lit_asyncfl.callbacks.run_checkpoint import RunCheckpoint
from lit_asyncfl.callbacks.run_outputs import RunOutputs
from lit_asyncfl.core.simulator import SimulationObserver, Simulator
from lit_asyncfl.core.update import ClientUpdate

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer

log = logging.getLogger("lit_asyncfl")

#: The hooks called during the loop (per event or per version), each only on the callbacks that implement it.
LOOP_HOOKS = ("on_new_version", "on_evaluation_end", "on_scheduler_metrics", "on_client_update", "on_event_end")


def configure_callbacks(
    callbacks: Sequence[Callback] | Callback | None,
    loggers: Sequence[Logger],
    enable_progress_bar: bool = True,
    print_summary: bool = True,
    checkpoint_every: int | None = None,
    checkpoint_every_seconds: float | None = None,
) -> list[Callback]:
    """``[ProgressBar, InterruptHandler, *user's, *user's ModelCheckpoints, RunOutputs, RunCheckpoint,
    LoggerConnector]``: progress first; the files, the run checkpoint (which saves every callback's state) and the
    loggers (which attach the files) last. A ``ProgressBar`` among the user's replaces the built-in one.

    Example:
        >>> [type(cb).__name__ for cb in configure_callbacks([ModelCheckpoint()], [], enable_progress_bar=False)]
        ['InterruptHandler', 'ModelCheckpoint', 'RunOutputs', 'RunCheckpoint']
    """
    user = [callbacks] if isinstance(callbacks, Callback) else list(callbacks or [])
    for cb in user:
        if isinstance(cb, namespaces.classes("Callback")):
            raise ValueError(lightning_callback_message(cb))
        if not isinstance(cb, Callback):
            raise ValueError(f"callbacks must be lit_asyncfl.callbacks.Callback instances, got {cb!r}")
    keys = [cb.state_key for cb in user]
    duplicated = sorted({k for k in keys if keys.count(k) > 1})
    if duplicated:
        raise ValueError(f"callbacks need distinct state_key values; duplicated: {duplicated}")
    first: list[Callback] = [InterruptHandler()]
    if enable_progress_bar and not any(isinstance(cb, ProgressBar) for cb in user):
        first.insert(0, ProgressBar())
    user.sort(key=lambda cb: isinstance(cb, ModelCheckpoint))  # stable: the others keep their order
    last: list[Callback] = [RunOutputs(print_summary), RunCheckpoint(checkpoint_every, checkpoint_every_seconds)]
    if loggers:
        last.append(LoggerConnector(list(loggers)))
    return first + user + last


#: Lightning's callbacks with an equivalent among the run callbacks.
_EQUIVALENTS = {
    "ModelCheckpoint": "lit_asyncfl.callbacks.ModelCheckpoint (dirpath, filename, monitor, mode, save_top_k, "
    "save_last; every_n_versions)",
    "EarlyStopping": "lit_asyncfl.callbacks.EarlyStopping (monitor, min_delta, patience in evaluations, mode)",
    "TQDMProgressBar": "lit_asyncfl.callbacks.ProgressBar (or enable_progress_bar)",
    "RichProgressBar": "lit_asyncfl.callbacks.ProgressBar (or enable_progress_bar)",
    "ProgressBar": "lit_asyncfl.callbacks.ProgressBar (or enable_progress_bar)",
}


def lightning_callback_message(cb: object) -> str:
    """Why a Lightning ``Callback`` given as a run callback is refused, and what to use instead.

    Example:
        >>> from lightning.pytorch.callbacks import EarlyStopping
        >>> print(lightning_callback_message(EarlyStopping("val_loss")))  # doctest: +ELLIPSIS
        callbacks: EarlyStopping is a Lightning Callback (lightning...; use lit_asyncfl.callbacks.EarlyStopping (...
    """
    name = type(cb).__name__
    instead = next((v for k, v in _EQUIVALENTS.items() if any(c.__name__ == k for c in type(cb).__mro__)), None)
    return (
        f"callbacks: {name} is a Lightning Callback ({type(cb).__module__}), whose hooks belong to a "
        "lightning.Trainer's loop, which the global loop of a federated run is not; use "
        + (instead if instead is not None else "a lit_asyncfl.callbacks.Callback subclass")
        + " (run callbacks, see docs/callbacks.md: on_fit_start, on_evaluation_end, on_new_version, on_event_end, "
        "on_fit_end, ...); client-side hooks go on the module or in client callbacks"
    )


def _listens(cb: Callback, hook: str) -> bool:
    """Whether ``cb`` implements ``hook`` (a run checkpoint without an interval has nothing to do after an event)."""
    if hook == "on_event_end" and isinstance(cb, RunCheckpoint) and not cb.periodic:
        return False
    return is_overridden(hook, cb, Callback)


class CallbackConnector(SimulationObserver):
    """Connects a fit's simulator to the trainer's evaluation and run callbacks.

    The simulator tells it of new versions and scheduler metrics (as its observer), asks it for the current
    version's metrics (as its evaluator) and calls :meth:`after_event` after each event; it evaluates the global
    model when due and calls the callbacks' hooks with the trainer.

    Failures (see ``docs/reproducibility.md``): an exception a callback (or a logger, through the
    ``LoggerConnector``) raises in a hook called *inside* an event (``on_new_version``, ``on_evaluation_end``,
    ``on_scheduler_metrics``, ``on_client_update``) does not cut the event short: the other callbacks still get
    the hook, the event completes, and the first such exception is raised at the event boundary that follows, so
    the run ends in a consistent state that ``last.ckpt`` then holds (a resume continues from it exactly).
    :meth:`call_all` (``on_exception``) calls every callback whatever another raises.

    Args:
        trainer: The :class:`~lit_asyncfl.FederatedTrainer` (its ``callbacks`` and ``evaluation``).
    """

    def __init__(self, trainer: FederatedTrainer) -> None:
        self.trainer = trainer
        self.evaluation = trainer.evaluation
        #: The first exception a callback raised inside the current event (raised at its end).
        self.pending: BaseException | None = None
        self.setup()

    def setup(self) -> None:
        """Take the trainer's callbacks as they are at the start of a fit, and for each hook called during the loop
        the ones that implement it (only those are called: the others' hooks do nothing)."""
        self.callbacks = self.trainer.callbacks
        self._listeners = {hook: [cb for cb in self.callbacks if _listens(cb, hook)] for hook in LOOP_HOOKS}
        self.pending = None

    def call(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of every callback, in order, with the trainer and ``args``."""
        for cb in self.callbacks:
            getattr(cb, hook)(self.trainer, *args)

    def call_all(self, hook: str, *args: Any) -> list[BaseException]:
        """Call ``hook`` of every callback whatever another raises (``on_exception``); the exceptions raised, each
        logged with its callback."""
        errors = []
        for cb in self.callbacks:
            try:
                getattr(cb, hook)(self.trainer, *args)
            except Exception as error:
                log.warning("lit_asyncfl: %s.%s raised %r", type(cb).__name__, hook, error, exc_info=error)
                errors.append(error)
        return errors

    def _call_in_event(self, hook: str, *args: Any) -> None:
        """Call ``hook`` of the callbacks that implement it; an exception is kept for the end of the event (the first
        one) or, outside an event, raised once every callback had the hook."""
        sim = self.trainer.simulator
        first: Exception | None = None
        for cb in self._listeners[hook]:
            try:
                getattr(cb, hook)(self.trainer, *args)
            except Exception as error:
                if first is None:
                    first = error
                else:
                    log.warning("lit_asyncfl: %s.%s raised %r too", type(cb).__name__, hook, error, exc_info=error)
        if first is None:
            return
        if sim is None or not sim.in_event:
            raise first
        if self.pending is None:
            log.warning("lit_asyncfl: a run callback raised %r in %s: the run ends after this event", first, hook)
            self.pending = first
        else:
            log.warning("lit_asyncfl: %s raised %r too", hook, first, exc_info=first)

    def raise_pending(self) -> None:
        """Raise the exception a callback raised inside the last event, if any (at an event boundary)."""
        if self.pending is not None:
            error, self.pending = self.pending, None
            raise error

    def after_event(self) -> bool:
        """``on_event_end`` of the callbacks that have one; whether the run should stop (an exception a callback
        raised during the event is raised first)."""
        self.raise_pending()
        for cb in self._listeners["on_event_end"]:
            cb.on_event_end(self.trainer)
        return self.trainer.should_stop

    def evaluate(self, sim: Simulator) -> None:
        """Evaluate the current global model and call ``on_evaluation_end`` with its row (while the run goes on, a
        Ray executor's workers first get enough jobs to train meanwhile: its ``pause``; at the run's final evaluation,
        the jobs the end-of-run checkpoint waits for)."""
        pause = getattr(sim.executor, "pause", None)
        pausing = pause is not None and self.evaluation.batches
        with pause(final=self.trainer.final_evaluation) if pausing else contextlib.nullcontext():
            row = self.evaluation.run(sim)
        if row is not None:
            self._call_in_event("on_evaluation_end", row)

    def current_metrics(self, sim: Simulator) -> dict[str, Any]:
        """The evaluation row of the current global version of ``sim`` (evaluated now if not yet): the simulator's
        evaluator."""
        if not self.evaluation.has(sim.server.version):
            self.evaluate(sim)
        if not self.evaluation.has(sim.server.version):
            raise RuntimeError("the algorithm needs evaluations, but the data module has no validation or test data")
        return self.evaluation.history[-1]

    def on_new_version(self, sim: Simulator) -> None:
        self._call_in_event("on_new_version")
        if sim.server.version >= self.evaluation.next_due:  # (each evaluation sets the next version due)
            self.evaluate(sim)

    def on_update(self, sim: Simulator, update: ClientUpdate, aggregated: bool) -> None:
        self._call_in_event("on_client_update", update, aggregated)

    def on_log(self, sim: Simulator, metrics: dict[str, Any]) -> None:
        if self.evaluation.has(sim.server.version):  # they join that version's evaluation row
            self.evaluation.history[-1].update(metrics)
        self._call_in_event("on_scheduler_metrics", metrics)
