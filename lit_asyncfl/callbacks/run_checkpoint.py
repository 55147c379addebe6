"""``RunCheckpoint``: the run's resumable ``checkpoints/last.ckpt``, every N events and at the end."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class RunCheckpoint(Callback):
    """Writes ``<log_dir>/checkpoints/last.ckpt``: a Lightning checkpoint of the global model that also holds the
    whole simulation, so ``fit(..., ckpt_path=...)`` resumes the run exactly.

    It is written at the end of the run (whatever ended it) and, with ``every_n_events``, after every that many
    simulator events — always at an event boundary, the only point where the simulation state is consistent.
    Every trainer has one (``FederatedTrainer(checkpoint_every=N)`` sets ``every_n_events``).

    Args:
        every_n_events: Also write after every this many events (``None``: only at the end).

    Example:
        >>> RunCheckpoint(every_n_events=100).every_n_events
        100
    """

    FILENAME = os.path.join("checkpoints", "last.ckpt")

    def __init__(self, every_n_events: int | None = None) -> None:
        if every_n_events is not None and (
            isinstance(every_n_events, bool) or not isinstance(every_n_events, int) or every_n_events < 1
        ):
            raise ValueError(f"every_n_events must be an integer >= 1 or None, got {every_n_events!r}")
        self.every_n_events = every_n_events

    def path(self, trainer: FederatedTrainer) -> str:
        """Where the checkpoint goes."""
        return os.path.join(trainer.log_dir, self.FILENAME)

    def on_event_end(self, trainer: FederatedTrainer) -> None:
        sim = trainer.simulator
        if self.every_n_events is not None and sim is not None and sim.events_processed % self.every_n_events == 0:
            trainer.save_checkpoint(self.path(trainer))

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        trainer.save_checkpoint(self.path(trainer))
