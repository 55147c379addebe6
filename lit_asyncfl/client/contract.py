"""What client jobs honour of a module's Lightning features: checked once at fit start, refused with the
alternative or announced, never silently changed."""

from __future__ import annotations

import logging

import lightning as L
from torch.optim.lr_scheduler import ReduceLROnPlateau

from lit_asyncfl.client.engine_base import parse_optimizers

_log = logging.getLogger("lit_asyncfl")


def check_lightning_contract(module: L.LightningModule, engine: str) -> None:
    """Refuse at fit start the Lightning features a client job cannot honour; announce the per-job ones.

    - ``configure_callbacks`` returning callbacks: refused (they would run once per client job); the global loop's
      callbacks are :mod:`lit_asyncfl.callbacks`, client-side hooks are client callbacks.
    - ``ReduceLROnPlateau``: refused (it needs a metric per local epoch that no client job computes).
    - Other LR schedulers: announced. Every client job builds a fresh optimizer and schedulers from
      ``configure_optimizers``, so a schedule restarts with each job (it does not decay across the run).
    - ``configure_optimizers`` reading ``self.trainer`` (e.g. ``estimated_stepping_batches``): refused outside
      ``engine="lightning"``.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> check_lightning_contract(LogisticRegression(input_dim=4), "fast")
    """
    name = type(module).__name__
    callbacks = module.configure_callbacks()
    if callbacks:
        listed = [type(cb).__name__ for cb in (callbacks if isinstance(callbacks, (list, tuple)) else [callbacks])]
        raise ValueError(
            f"{name}.configure_callbacks() returned {listed}: Lightning callbacks would run once per client job. "
            "Pass run callbacks for the global model to FederatedTrainer(callbacks=[...]) (lit_asyncfl.callbacks: "
            "ModelCheckpoint, EarlyStopping, ...) instead"
        )
    try:
        config = module.configure_optimizers()
    except RuntimeError as exc:
        if engine != "lightning" and "not attached to a `Trainer`" in str(exc):
            raise ValueError(
                f"{name}.configure_optimizers() reads self.trainer, which engine={engine!r} does not provide; "
                "use engine='lightning'"
            ) from exc
        raise
    try:
        _, schedulers = parse_optimizers(config)
    except (TypeError, ValueError):
        return  # several optimizers or manual optimization: the engine itself refuses what it cannot run
    for scheduler, _ in schedulers:
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(
                f"{name}.configure_optimizers() returns ReduceLROnPlateau, which needs a monitored metric per local "
                "epoch that client jobs do not compute; use a step or epoch scheduler (it restarts with every "
                "client job)"
            )
    if schedulers:
        kinds = sorted({type(s).__name__ for s, _ in schedulers})
        _log.info(
            f"lit_asyncfl: {name}'s LR schedulers {kinds} restart with every client job (each job builds its "
            "optimizer from configure_optimizers): they decay within a job's local epochs, not across the run"
        )
