"""``JobTrainer``: what ``self.trainer`` offers a module where no ``lightning.Trainer`` runs it."""

from __future__ import annotations

from typing import Any

#: Attributes a module may read from :class:`JobTrainer`, with their meaning.
AVAILABLE = (
    "current_epoch", "global_step", "max_epochs", "max_steps", "num_training_batches", "estimated_stepping_batches",
    "training", "validating", "testing", "sanity_checking", "is_global_zero", "world_size", "global_rank",
    "local_rank", "num_devices", "num_nodes", "logger", "loggers", "callback_metrics", "fast_dev_run",
    "accumulate_grad_batches",
)  # fmt: skip


class JobTrainer:
    """Stands in for ``self.trainer`` in a client job of the ``fast`` engine and in the global evaluation.

    It answers what modules commonly read, with the values a ``lightning.Trainer`` running that job alone would
    have: ``current_epoch`` and ``global_step`` (updated as the job runs), ``max_epochs`` (the job's local epochs),
    ``num_training_batches`` and ``estimated_stepping_batches`` (the job's steps per epoch and in all), the stage
    flags, a single process (``is_global_zero``, ``world_size`` 1), no logger. Any other attribute raises an
    ``AttributeError`` that names the ones available and ``engine="lightning"`` (a real Trainer per job).

    Args:
        engine: The engine name (for the error message).
        max_epochs: The job's local epochs.
        num_training_batches: Steps per local epoch.
        stage: ``"train"``, ``"validate"`` or ``"test"``.
        global_step: Optimizer steps so far (the global version, in the global evaluation).
        max_steps: The job's own number of local steps (``None``: whole epochs, ``max_steps`` reads -1).

    Example:
        >>> t = JobTrainer("fast", max_epochs=2, num_training_batches=3)
        >>> t.estimated_stepping_batches, t.current_epoch, t.training
        (6, 0, True)
    """

    def __init__(
        self,
        engine: str,
        max_epochs: int = 1,
        num_training_batches: int = 0,
        stage: str = "train",
        global_step: int = 0,
        max_steps: int | None = None,
    ) -> None:
        self._engine = engine
        self.current_epoch = 0
        self.global_step = global_step
        self.max_epochs = max_epochs
        self.max_steps = -1 if max_steps is None else max_steps
        self.num_training_batches = num_training_batches
        self.estimated_stepping_batches = max_epochs * num_training_batches
        if max_steps is not None:
            self.estimated_stepping_batches = min(self.estimated_stepping_batches, max_steps)
        self.training = stage == "train"
        self.validating = stage == "validate"
        self.testing = stage == "test"
        self.sanity_checking = False
        self.is_global_zero = True
        self.world_size = self.num_devices = self.num_nodes = 1
        self.global_rank = self.local_rank = 0
        self.logger = None
        self.loggers: list[Any] = []
        self.callback_metrics: dict[str, Any] = {}
        self.fast_dev_run = False
        self.accumulate_grad_batches = 1

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"self.trainer.{name} is not available under engine={self._engine!r}, which runs no lightning.Trainer "
            f"(available: {', '.join(AVAILABLE)}); use engine='lightning' for a real Trainer per client job"
        )
