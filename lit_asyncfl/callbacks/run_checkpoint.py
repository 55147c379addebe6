"""``RunCheckpoint``: the run's resumable ``checkpoints/last.ckpt`` — periodically, at the end, and on failure."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.checks import check_int, check_number

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer

log = logging.getLogger("lit_asyncfl")


class RunCheckpoint(Callback):
    """Writes ``<log_dir>/checkpoints/last.ckpt``, the checkpoint that resumes the run exactly.

    It is written (atomically: a crash mid-write leaves the previous file) at the end of the run (whatever ended
    it), at the first event boundary after every ``every_n_seconds`` of wall time (so a run killed with ``kill -9``
    or by the out-of-memory killer loses at most that much), after every ``every_n_events`` events, and when an
    exception ends the run while the simulation is at an event boundary (a client job that raised: the state
    before its event; a run callback or logger that raised inside an event: the state at the end of that
    event). Writing never changes results. Every trainer has one
    (``FederatedTrainer(checkpoint_every=N, checkpoint_every_seconds=S)`` set the intervals).

    Args:
        every_n_events: Also write after every this many events (``None``: not by events).
        every_n_seconds: Also write after every this many seconds of wall time (``None``: not by time).

    Example:
        >>> RunCheckpoint(every_n_events=100).every_n_events
        100
    """

    #: Where the checkpoint goes, under the log dir.
    FILENAME = os.path.join("checkpoints", "last.ckpt")

    def __init__(self, every_n_events: int | None = None, every_n_seconds: float | None = None) -> None:
        check_int("every_n_events", every_n_events, 1, optional=True)
        check_number("every_n_seconds", every_n_seconds, 0, open_min=True, optional=True)
        self.every_n_events = every_n_events
        self.every_n_seconds = every_n_seconds
        self._last_write = 0.0

    @property
    def periodic(self) -> bool:
        """Whether it writes during the run (an interval is set), not only at its end and on failure."""
        return self.every_n_events is not None or self.every_n_seconds is not None

    def path(self, trainer: FederatedTrainer) -> str:
        """Where the checkpoint goes."""
        return os.path.join(trainer.log_dir, self.FILENAME)

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        self._last_write = time.monotonic()

    def on_event_end(self, trainer: FederatedTrainer) -> None:
        sim = trainer.simulator
        if sim is None:
            return
        due = self.every_n_events is not None and sim.events_processed % self.every_n_events == 0
        if not due and self.every_n_seconds is not None:
            due = time.monotonic() - self._last_write >= self.every_n_seconds
        if due:
            self._save(trainer)

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self._save(trainer)

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        sim = trainer.simulator
        if sim is None or sim.in_event or not trainer.run_started:  # mid-event or before the start: inconsistent
            return
        try:
            self._save(trainer)
            log.warning("lit_asyncfl: the run failed; last.ckpt holds its state at the event boundary where it stopped")
        except Exception as error:  # never hide the exception that ended the run
            log.warning("lit_asyncfl: could not write last.ckpt after the failure: %r", error)

    def _save(self, trainer: FederatedTrainer) -> None:
        trainer.save_checkpoint(self.path(trainer))
        self._last_write = time.monotonic()
