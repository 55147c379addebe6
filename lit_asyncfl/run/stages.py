"""``FederatedTrainer.validate`` and ``test``: a model (the run's, or one given) evaluated on the data module's
validation or test data, with the weights of a checkpoint (a path, ``"best"`` or ``"last"``) where one is asked."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

import lightning as L

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.callbacks import ModelCheckpoint, RunCheckpoint
from lit_asyncfl.evaluation import evaluate_stage

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


def run_stage(
    trainer: FederatedTrainer,
    stage: str,
    model: L.LightningModule | None,
    datamodule: L.LightningDataModule | None,
    ckpt_path: str | None,
    verbose: bool,
) -> list[dict[str, float]]:
    """Evaluate for ``trainer.validate`` (``stage="validate"``) or ``trainer.test`` (warnings point at their
    caller)."""
    model = model if model is not None else trainer.global_model
    dm = datamodule if datamodule is not None else trainer.datamodule
    if model is None or dm is None:
        raise RuntimeError(f"{stage}: pass a model and a datamodule, or call fit() first")
    if ckpt_path is not None:
        path = resolve_ckpt_path(trainer, ckpt_path)
        ckpt.load_model_weights(model, ckpt.load(path, trainer.device))
    elif trainer.global_model is None:
        warnings.warn(
            f"{stage}() without ckpt_path and without a preceding fit(): evaluating the model's INITIAL weights. "
            "Pass ckpt_path=<a checkpoint, e.g. a run's checkpoints/last.ckpt> to evaluate a trained model",
            UserWarning,
            stacklevel=3,
        )
    return evaluate_stage(model.to(trainer.device), dm, stage, verbose)


def resolve_ckpt_path(trainer: FederatedTrainer, ckpt_path: str) -> str:
    """The file ``ckpt_path`` names: ``"last"`` (the run's ``last.ckpt``), ``"best"`` (the best model of the run's
    :class:`~lit_asyncfl.callbacks.ModelCheckpoint`) or a path."""
    if ckpt_path == "last":
        path = os.path.join(trainer.log_dir, RunCheckpoint.FILENAME)
        if trainer.simulator is None or not os.path.isfile(path):
            raise ValueError('ckpt_path="last" needs a preceding fit() of this trainer')
        return path
    if ckpt_path == "best":
        best = [cb.best_model_path for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor]
        if not best or not best[0]:
            raise ValueError(
                'ckpt_path="best" needs a ModelCheckpoint(monitor=...) in callbacks that has saved a model; '
                "pass a checkpoint path instead"
            )
        return best[0]
    return ckpt_path
