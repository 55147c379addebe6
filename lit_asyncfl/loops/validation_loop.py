"""Lightning's validation (and test) loop for a module without a ``lightning.Trainer``: its hooks, in Lightning's
order, with ``self.log`` reduced as Lightning reduces it (:mod:`lit_asyncfl.loops.stand_in`), so that the global model's
metrics are the ones ``lightning.Trainer.validate`` would report for the same weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_asyncfl.loops.stand_in import EpochLog, JobLog, JobTrainer
from lit_asyncfl.namespaces import is_overridden

#: Stage -> (hook prefix, step method).
STAGES = {"val": ("validation", "validation_step"), "test": ("test", "test_step")}

__all__ = ["STAGES", "EpochLog", "JobLog", "run_evaluation"]  # the log classes: importable from here, as before


def _hook(module: L.LightningModule, name: str, *args: Any, log: EpochLog | None = None) -> Any:
    if log is not None:
        log.hook = name
    return getattr(module, name)(*args)


@torch.no_grad()
def run_evaluation(
    module: L.LightningModule, dataloaders: Sequence[Sequence[Any]], stage: str = "val", global_step: int = 0
) -> list[dict[str, float]]:
    """Run Lightning's evaluation loop of ``module`` over ``dataloaders`` (each an iterable of batches).

    Hooks, in Lightning's order: ``on_{stage}_model_eval`` (eval mode), ``on_{stage}_start``,
    ``on_{stage}_epoch_start``, then per batch ``on_before_batch_transfer``, ``transfer_batch_to_device``,
    ``on_after_batch_transfer``, ``on_{stage}_batch_start``, the step, ``on_{stage}_batch_end``; then
    ``on_{stage}_epoch_end``, ``on_{stage}_end`` and ``on_{stage}_model_train`` (the previous mode back). With several
    dataloaders the step and batch hooks get ``dataloader_idx``. A module without the step is refused, as Lightning
    refuses it (nothing else calls the model on its data). Without a Trainer attached, ``self.trainer`` is a
    :class:`~lit_asyncfl.loops.JobTrainer` of the stage (``global_step``: the global version).

    Returns:
        One dict of the epoch's logged values per dataloader.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> m = LogisticRegression(input_dim=4, num_classes=2)
        >>> sorted(run_evaluation(m, [[[torch.zeros(3, 4), torch.tensor([0, 1, 1])]]])[0])
        ['val_acc', 'val_loss']
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {list(STAGES)}, got {stage!r}")
    prefix, step_name = STAGES[stage]
    if not is_overridden(step_name, module):
        raise MisconfigurationException(
            f"No `{step_name}()` method defined to run `Trainer.{'validate' if stage == 'val' else 'test'}` "
            f"(as Lightning): {type(module).__name__} is evaluated by its own {step_name} only"
        )
    several = len(dataloaders) > 1
    log = EpochLog(len(dataloaders))
    was_training = module.training
    module.log, module.log_dict = log.log, log.log_dict  # type: ignore[method-assign]
    stand_in = module._trainer is None
    if stand_in:  # self.trainer reads what a Trainer validating these weights would say
        module._trainer = JobTrainer("fast", stage="validate" if stage == "val" else "test", global_step=global_step)
    try:
        if is_overridden(f"on_{prefix}_model_eval", module):
            _hook(module, f"on_{prefix}_model_eval", log=log)
        else:
            module.eval()
        _hook(module, f"on_{prefix}_start", log=log)
        _hook(module, f"on_{prefix}_epoch_start", log=log)
        for dataloader_idx, batches in enumerate(dataloaders):
            log.dataloader_idx = dataloader_idx
            extra = (dataloader_idx,) if several else ()
            for batch_idx, batch in enumerate(batches):
                log.hook = "on_before_batch_transfer"  # (no logging there, as in Lightning)
                batch = module.on_before_batch_transfer(batch, dataloader_idx)  # the module's (a data module's
                batch = module.transfer_batch_to_device(batch, module.device, dataloader_idx)  # are refused)
                batch = module.on_after_batch_transfer(batch, dataloader_idx)
                log.batch = batch
                _hook(module, f"on_{prefix}_batch_start", batch, batch_idx, *extra, log=log)
                log.hook = step_name
                output = getattr(module, step_name)(batch, batch_idx, *extra)
                _hook(module, f"on_{prefix}_batch_end", output, batch, batch_idx, *extra, log=log)
            log.end_dataloader()
        log.batch, log.dataloader_idx = None, None
        _hook(module, f"on_{prefix}_epoch_end", log=log)
        results = log.results()
        _hook(module, f"on_{prefix}_end", log=log)  # self.log here raises, as in Lightning
    finally:
        del module.log, module.log_dict
        if stand_in:
            module._trainer = None
        if is_overridden(f"on_{prefix}_model_train", module):
            _hook(module, f"on_{prefix}_model_train", log=log)
        else:
            module.train(was_training)
    return results
