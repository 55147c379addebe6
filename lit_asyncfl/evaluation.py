"""Global evaluation: run a module's ``validation_step``/``test_step`` and collect what it logs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.classification import multiclass_accuracy

from lit_asyncfl.data.shards import _to_device


def _batch_size(batch: Any) -> int:
    if isinstance(batch, Tensor):
        return len(batch)
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    if isinstance(batch, dict) and batch:
        return _batch_size(next(iter(batch.values())))
    return 1


def _scalar(value: Any) -> float:
    return float(value.detach().float().mean()) if isinstance(value, Tensor) else float(value)


class _LogCapture:
    """Stands in for ``LightningModule.log``, reducing over the evaluation set as Lightning does at epoch end.

    Logged tensors and numbers are averaged weighted by batch size; a logged torchmetrics ``Metric`` (which
    accumulates its own state in ``update``/``forward``) is computed once at the end and then reset.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.counts: dict[str, float] = {}
        self.metrics: dict[str, Metric] = {}
        self.batch_size = 1

    def log(self, name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any) -> None:
        if isinstance(value, Metric):
            self.metrics[name] = value
            return
        n = batch_size if batch_size is not None else self.batch_size
        self.sums[name] = self.sums.get(name, 0.0) + _scalar(value) * n
        self.counts[name] = self.counts.get(name, 0.0) + n

    def log_dict(self, values: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in values.items():
            self.log(name, value, *args, **kwargs)

    def means(self) -> dict[str, float]:
        out = {k: self.sums[k] / self.counts[k] for k in self.sums}
        for name, metric in self.metrics.items():
            out[name] = _scalar(metric.compute())
            metric.reset()
        return out


def find_metric(metrics: dict[str, float], kind: str) -> float | None:
    """The value of the logged metric whose name ends in ``acc``/``accuracy`` (``kind="accuracy"``) or ``loss``.

    A regression model has no accuracy: its coefficient of determination (a metric ending in ``r2``) stands in
    for it, so targets and time-to-target work the same way.

    Example:
        >>> find_metric({"val_loss": 0.3, "val_acc": 0.9}, "accuracy")
        0.9
        >>> find_metric({"val_loss": 0.3, "val_r2": 0.7}, "accuracy")
        0.7
    """
    groups = [("acc", "accuracy"), ("r2",)] if kind == "accuracy" else [("loss",)]
    for suffixes in groups:
        for name, value in metrics.items():
            last = name.replace("/", "_").rsplit("_", 1)[-1].lower()
            if last in suffixes:
                return value
    return None


@torch.no_grad()
def evaluate(module: L.LightningModule, batches: Iterable[Any], stage: str = "val") -> dict[str, float]:
    """Evaluate ``module`` over ``batches`` and return the batch-size weighted mean of every logged value.

    Calls ``validation_step`` (``stage="val"``) or ``test_step`` (``stage="test"``) when the module defines it,
    with ``self.log`` captured; a module without one is scored as a classifier from its forward logits
    (cross-entropy ``{stage}_loss`` and torchmetrics accuracy ``{stage}_acc``).

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> m = LogisticRegression(input_dim=4, num_classes=2)
        >>> out = evaluate(m, [[torch.zeros(3, 4), torch.tensor([0, 1, 1])]])
        >>> sorted(out)
        ['val_acc', 'val_loss']
    """
    step_name = "validation_step" if stage == "val" else f"{stage}_step"
    was_training = module.training
    module.eval()
    capture = _LogCapture()
    has_step = is_overridden(step_name, module, L.LightningModule)
    module.log, module.log_dict = capture.log, capture.log_dict  # type: ignore[method-assign]
    try:
        for batch_idx, batch in enumerate(batches):
            batch = _to_device(batch, module.device)
            capture.batch_size = _batch_size(batch)
            if has_step:
                getattr(module, step_name)(batch, batch_idx)
            else:
                x, y = batch[0], batch[1]
                logits = module(x)
                capture.log(f"{stage}_loss", F.cross_entropy(logits, y))
                acc = multiclass_accuracy(logits, y, num_classes=logits.shape[-1], average="micro")
                capture.log(f"{stage}_acc", acc)
    finally:
        del module.log, module.log_dict
        module.train(was_training)
    return capture.means()
