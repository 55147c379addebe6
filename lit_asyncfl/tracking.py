"""Weights & Biases specifics of a run: custom x-axes, the run summary and the plots.

Lightning's ``WandbLogger`` records the config (through ``log_hyperparams``) and logs metrics against its
``trainer/global_step`` (here: the global version). A federated run is read against *virtual time*, so
:class:`WandbRun` declares ``virtual_time`` and ``version`` as metrics and every evaluation metric with
``step_metric="virtual_time"`` (``define_metric``); the W&B UI then plots accuracy against virtual time by
default, and against the version on a click. At the end it writes the run summary and attaches the accuracy and
partition plots. It works the same in ``WANDB_MODE=offline`` (all of it goes to the local run directory, for a
later ``wandb sync``) and ``disabled`` (nothing is written).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

X_AXES = ("virtual_time", "version")


def is_wandb(logger: Logger) -> bool:
    """Whether ``logger`` is Lightning's ``WandbLogger`` (without importing wandb for other loggers)."""
    return type(logger).__name__ == "WandbLogger" and hasattr(logger, "experiment")


class WandbRun:
    """Adds the federated axes, summary and plots to a ``WandbLogger``'s run.

    Args:
        logger: A Lightning ``WandbLogger``.
    """

    def __init__(self, logger: Logger) -> None:
        self.logger = logger
        self._defined: set[str] = set()

    def _logged_name(self, key: str) -> str:
        """The name W&B sees: the logger's ``prefix`` (if any) joined to ``key``, as ``log_metrics`` does."""
        prefix = getattr(self.logger, "_prefix", "")
        return f"{prefix}{getattr(self.logger, 'LOGGER_JOIN_CHAR', '-')}{key}" if prefix else key

    def log(self, row: dict[str, Any], step: int) -> None:
        """Log one evaluation row (with ``virtual_time`` and ``version``), declaring new keys against virtual time."""
        run = self.logger.experiment
        numeric = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if hasattr(run, "define_metric"):
            x_axis = self._logged_name("virtual_time")
            for key in (*X_AXES, *numeric):
                if key in self._defined:
                    continue
                if key in X_AXES:
                    run.define_metric(self._logged_name(key))
                else:
                    run.define_metric(self._logged_name(key), step_metric=x_axis)
                self._defined.add(key)
        self.logger.log_metrics(numeric, step=step)

    def finish(self, summary: dict[str, Any], plots: Iterable[Path]) -> None:
        """Write ``summary`` into the run summary and attach the ``plots`` (PNG files) as images."""
        import wandb

        run = self.logger.experiment
        values = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
        values.update({k: dict(v) for k, v in summary.items() if isinstance(v, dict)})
        run.summary.update(values)
        images = {f"plots/{p.stem}": wandb.Image(str(p)) for p in plots if p.exists()}
        if images:
            run.log(images)
