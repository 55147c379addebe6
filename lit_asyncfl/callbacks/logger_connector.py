"""``LoggerConnector``: the run's hyper-parameters, evaluations, scheduler metrics and summary sent to every logger."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.loggers import Logger

from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.tracking import WandbRun, is_wandb

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


def _numbers(row: dict[str, Any], skip: tuple[str, ...] = ()) -> dict[str, float]:
    return {
        k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip
    }


class LoggerConnector(Callback):
    """Fans the run out to Lightning loggers (CSV, TensorBoard, W&B, ...), with the global version as step.

    - at the start: ``log_hyperparams`` with the run's hyper-parameters (``trainer.hyperparameters``: the model's
      and data module's ``hparams``, the algorithm's and the trainer's settings, or the whole CLI config);
    - at each evaluation: the row's numbers (``virtual_time`` included); W&B plots them against virtual time;
    - when the scheduler logs (e.g. ASFL's round latency): those metrics with ``virtual_time``;
    - at the end: the summary as ``summary/<key>`` metrics (W&B: the run summary, with the plots attached), then
      ``save()`` and ``finalize("success")``; ``finalize("failed")`` if the run raises.

    The trainer adds one when it has loggers.

    Args:
        loggers: The Lightning loggers.

    Example:
        >>> LoggerConnector([]).loggers
        []
    """

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = list(loggers)
        self._wandb_runs: dict[int, WandbRun] = {}

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        self._wandb_runs = {}  # a logger may have started a new W&B run since the last fit
        for lg in self.loggers:
            lg.log_hyperparams(trainer.hyperparameters)

    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        self._log(metrics, metrics["version"], skip=("version",))

    def on_scheduler_metrics(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        sim = trainer.simulator
        assert sim is not None
        self._log({"virtual_time": sim.now, **metrics}, sim.server.version)

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        sim = trainer.simulator
        assert sim is not None
        out = Path(trainer.log_dir)
        for lg in self.loggers:
            if is_wandb(lg):  # the run summary, not one more point of every chart
                self._wandb_run(lg).finish(trainer.summary, [out / "accuracy.png", out / "partition.png"])
            else:
                summary = {f"summary/{k}": v for k, v in _numbers(trainer.summary).items()}
                lg.log_metrics(summary, step=sim.server.version)
            lg.save()
            lg.finalize("success")

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        for lg in self.loggers:
            lg.finalize("failed")

    def _log(self, row: dict[str, Any], step: int, skip: tuple[str, ...] = ()) -> None:
        for lg in self.loggers:
            if is_wandb(lg):
                self._wandb_run(lg).log(row, step=step)
            else:
                lg.log_metrics(_numbers(row, skip), step=step)

    def _wandb_run(self, logger: Logger) -> WandbRun:
        if id(logger) not in self._wandb_runs:
            self._wandb_runs[id(logger)] = WandbRun(logger)
        return self._wandb_runs[id(logger)]
