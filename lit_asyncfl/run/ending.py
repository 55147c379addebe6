"""How a ``FederatedTrainer``'s run ends: the warnings of a run that stopped early, the evaluation of the final
model, the summary, and a failure's record (the outputs are then written by the run callbacks)."""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING

import numpy as np

from lit_asyncfl.core.simulator import Simulator
from lit_asyncfl.reporting import run_summary
from lit_asyncfl.run.checkpointing import resumable_history_and_callbacks

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer

log = logging.getLogger("lit_asyncfl")


def finish_run(trainer: FederatedTrainer, sim: Simulator, loop_reason: str) -> None:
    """End a run whose loop returned ``loop_reason``: warn where it stopped early, evaluate the final model if its
    version was not evaluated, and summarize (warnings point at the caller of ``fit``)."""
    if loop_reason == "stalled":
        warnings.warn(
            f"stopped: the last {sim.stalled_arrivals} updates produced no new global version "
            f"(rejection reasons so far: {sim.server.stats.reasons or 'none'}; jobs dropped: "
            f"{dict(sim.dropped) or 'none'})",
            RuntimeWarning,
            stacklevel=3,
        )
    availability = trainer.availability
    if loop_reason == "queue_empty" and not availability.always_online:
        back = availability.next_online(np.arange(trainer.num_clients), sim.now)
        warnings.warn(
            f"stopped at virtual time {sim.now:g} (version {sim.server.version}) with nothing left to happen: "
            f"{'no device is online again' if math.isinf(back) else f'no job in flight until {back:g}'} under "
            f"the availability {type(availability).__name__}; jobs dropped: {dict(sim.dropped) or 'none'}",
            RuntimeWarning,
            stacklevel=3,
        )
    reason = (trainer.stop_reason or "callback") if loop_reason == "stopped" else loop_reason
    # What an uninterrupted run has too: the end-of-run checkpoint keeps these, so the off-schedule evaluation
    # that ends this run is neither in the history nor in the callbacks' states of the run it resumes.
    trainer._final_state = resumable_history_and_callbacks(trainer)
    if not trainer.evaluation.has(sim.server.version):
        trainer.final_evaluation = True
        try:
            trainer._hooks.evaluate(sim)
        finally:
            trainer.final_evaluation = False
    summarize(trainer, sim, reason)


def summarize(trainer: FederatedTrainer, sim: Simulator, reason: str) -> None:
    """End the run's record: the global model holds the final weights, ``trainer.summary`` says how it went."""
    trainer.stop_reason = reason
    assert trainer._flat is not None
    trainer._flat.load(sim.server.weights)
    trainer.summary = run_summary(
        trainer.history,
        sim,
        algorithm=trainer.algorithm.name,
        num_clients=trainer.num_clients,
        monitor=trainer.evaluation.monitor_name,
        mode=trainer.evaluation.mode,
        target=trainer.target_accuracy,
        stop_reason=reason,
        wall_seconds=trainer._wall_seconds(),
    )


def record_failure(trainer: FederatedTrainer, sim: Simulator, exc: BaseException) -> None:
    """What a run an exception ended leaves: a note of a run callback's earlier error on ``exc``, the summary of
    the run (if it had started) for the outputs the callbacks then write, and every callback's ``on_exception``.
    Never raises: the original exception is what the user must see."""
    hooks = trainer._hooks
    if hooks.pending is not None and hooks.pending is not exc:  # the event itself raised after
        log.warning("lit_asyncfl: a run callback had raised earlier in the failing event: %r", hooks.pending)
        add_note(exc, f"(a run callback had raised earlier in the same event: {hooks.pending!r})")
        hooks.pending = None
    if trainer.run_started:  # else (a refused resume, a failing start) nothing of a run exists to write
        try:
            summarize(trainer, sim, f"error: {type(exc).__name__}")
        except Exception as error:  # pragma: no cover (a secondary failure must not hide the first)
            log.warning("lit_asyncfl: could not summarize the failed run: %r", error)
    for error in hooks.call_all("on_exception", exc):  # every callback's, whatever one raises
        add_note(exc, f"(while handling it, on_exception of a run callback raised {error!r})")


def add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` where Python can (3.11+); on 3.10 the note is only in the log, which already has it,
    so that handling a failure never replaces the run's own exception with an ``AttributeError``."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
