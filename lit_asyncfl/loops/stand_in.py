"""What a module sees of its trainer where no ``lightning.Trainer`` runs it: ``self.trainer`` (:class:`JobTrainer`)
and ``self.log``/``self.log_dict``, reduced as Lightning reduces them: :class:`EpochLog` over an evaluation epoch (the
global evaluation), :class:`JobLog` over a client job's ``training_step`` calls (what an update reports in
``update.metrics``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from lightning.pytorch.trainer.connectors.logger_connector.fx_validator import _FxValidator  # where logging is allowed
from lightning.pytorch.utilities.data import extract_batch_size  # Lightning's own inference of self.log's size
from torch import Tensor
from torchmetrics import Metric

__all__ = ["AVAILABLE", "EpochLog", "JobLog", "JobTrainer"]

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


_REDUCTIONS = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_TORCH_REDUCTIONS = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min"}


#: The sums of a mean before any value (see ``_Entry.sums``).
_NO_SUMS = (np.float32(0.0), np.float32(0.0))


class _Entry:
    """One logged key over an epoch: Lightning's ``_ResultMetric`` (float32 sums, batch-size weighted means)."""

    def __init__(self, reduction: str) -> None:
        self.reduction = reduction
        self.value: Tensor | None = None
        self.weight = torch.zeros(())  # float32 0.0, as torch.tensor(0.0), in half the time
        self.metric: Metric | None = None
        #: A metric object's value when its dataloader ended (see :meth:`EpochLog.end_dataloader`).
        self.frozen: float | None = None
        #: The weighted sum and the weight of a mean while every value has been a CPU float32 scalar tensor and
        #: every batch size an int, as NumPy float32 scalars (the same IEEE float32 operations as torch's, a third
        #: of the time); ``None`` once another value came (the sums then go on as tensors).
        self.sums: tuple[np.float32, np.float32] | None = _NO_SUMS

    def update(self, value: Any, batch_size: int) -> None:
        if isinstance(value, Metric):
            self.metric = value
            return
        if self.reduction == "mean" and self.sums is not None:
            if (
                type(value) is Tensor
                and type(batch_size) is int
                and batch_size > 0
                and value.dim() == 0
                and value.dtype is torch.float32
                and value.device.type == "cpu"
            ):
                # mean() of one element is the element with -0.0 made +0.0, and so is a sum that starts at +0.0;
                # float32 products and sums round as torch's do (overflow gives inf, as there, without a warning).
                size = np.float32(batch_size)
                with np.errstate(all="ignore"):
                    self.sums = (self.sums[0] + np.float32(value.item()) * size, self.sums[1] + size)
                return
            if self.sums is not _NO_SUMS:  # values came: go on from their sums (float32 tensors, exact)
                self.value, self.weight = torch.tensor(self.sums[0]), torch.tensor(self.sums[1])
            self.sums = None
        value = torch.as_tensor(value).detach().float().mean().cpu()
        if self.reduction == "mean":  # in place on the entry's own tensors (the same sums, without new tensors)
            if self.value is None:
                self.value = value * batch_size
            else:
                self.value.add_(value * batch_size)
            self.weight.add_(batch_size)
        elif self.value is None:
            self.value = value
        elif self.reduction == "sum":
            self.value = self.value + value
        else:
            self.value = (
                torch.maximum(self.value, value) if self.reduction == "max" else torch.minimum(self.value, value)
            )

    def compute(self) -> float:
        if self.frozen is not None:
            return self.frozen
        if self.metric is not None:
            return float(self.metric.compute())
        if self.reduction == "mean" and self.sums is not None:
            with np.errstate(all="ignore"):  # 0/0 (nothing logged) and inf/inf are NaN, as in torch
                return float(self.sums[0] / self.sums[1])
        assert self.value is not None
        return float(self.value / self.weight) if self.reduction == "mean" else float(self.value)


class EpochLog:
    """Stands in for ``LightningModule.log``/``log_dict`` during an evaluation epoch, with Lightning's meaning.

    ``on_epoch`` values are reduced with ``reduce_fx`` (``"mean"`` weighted by ``batch_size``, inferred from the
    batch as Lightning does; ``"sum"``, ``"max"``, ``"min"``); a logged torchmetrics ``Metric`` is computed at the
    end and reset; with several dataloaders a key gets ``/dataloader_idx_N`` unless ``add_dataloader_idx=False``;
    ``on_step=True`` values are Lightning's per-step logger values (``<name>_step``), not part of the epoch's
    results (with ``on_epoch=True`` too, the epoch value is ``<name>_epoch``, as Lightning names it).
    """

    def __init__(self, num_dataloaders: int) -> None:
        self.num_dataloaders = num_dataloaders
        self.entries: dict[tuple[str, str], tuple[_Entry, int | None]] = {}
        self.batch: Any = None
        self.dataloader_idx: int | None = None
        #: The hook logging now (what may be logged where is Lightning's own rule); a key logged by two hooks keeps
        #: the later hook's value, as in Lightning.
        self.hook = "validation_step"

    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: Any = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        on_step, on_epoch = _FxValidator.check_logging_and_get_default_levels(self.hook, on_step, on_epoch)
        if not isinstance(value, Metric) and torch.as_tensor(value).numel() != 1:
            raise ValueError(
                f"`self.log({name!r}, value)` was called, but the tensor must have a single element; "
                f"got shape {tuple(torch.as_tensor(value).shape)} (as Lightning)"
            )
        if not on_epoch:
            return  # a per-step value for the logger only: not part of the epoch's results
        reduction = _REDUCTIONS.get(reduce_fx) if isinstance(reduce_fx, str) else _TORCH_REDUCTIONS.get(reduce_fx)
        if reduction is None:
            raise ValueError(
                f"self.log({name!r}, reduce_fx={reduce_fx!r}): the global evaluation reduces with 'mean', 'sum', "
                "'max' or 'min' (or torch.mean/sum/max/min), as Lightning does"
            )
        key = f"{name}_epoch" if on_step else name
        idx = self.dataloader_idx if self.num_dataloaders > 1 and add_dataloader_idx else None
        if idx is not None:
            key = f"{key}/dataloader_idx_{idx}"
        entry_key = (self.hook, key)
        if entry_key not in self.entries:
            self.entries[entry_key] = (_Entry(reduction), self.dataloader_idx)
        entry, idx_logged = self.entries[entry_key]
        if entry.reduction != reduction:
            raise ValueError(
                f"You called `self.log({name!r}, ...)` twice in `{self.hook}` with different reduce_fx "
                f"({entry.reduction!r}, then {reduction!r}); this is not allowed (as Lightning)"
            )
        if idx_logged != self.dataloader_idx and self.num_dataloaders > 1:
            raise ValueError(
                f"You called `self.log({name!r}, ..., add_dataloader_idx=False)` from dataloaders {idx_logged} and "
                f"{self.dataloader_idx}: their values would mix; log one name per dataloader (as Lightning refuses)"
            )
        if batch_size is None:
            batch_size = extract_batch_size(self.batch) if self.batch is not None else 1
        entry.update(value, batch_size or 1)

    def log_dict(self, dictionary: Any, **kwargs: Any) -> None:
        for name, value in dict(dictionary).items():
            self.log(name, value, **kwargs)

    def end_dataloader(self) -> None:
        """Close the current dataloader, as Lightning does when the next one starts: a metric object logged under
        its ``/dataloader_idx_N`` key keeps the value it computes now. The object is not reset in between, so
        one object logged from two loaders reports for the second the value over both, as Lightning does."""
        if self.num_dataloaders < 2:
            return
        for entry, idx in self.entries.values():
            if idx == self.dataloader_idx and entry.metric is not None and entry.frozen is None:
                entry.frozen = float(entry.metric.compute())

    def results(self) -> list[dict[str, float]]:
        """One dict per dataloader, as ``lightning.Trainer.validate`` returns: the keys logged while that dataloader
        ran, plus those logged outside any dataloader (the epoch-level hooks); metric objects are reset."""
        computed = {key: (entry.compute(), idx) for (_, key), (entry, idx) in self.entries.items()}  # later wins
        for entry, _ in self.entries.values():
            if entry.metric is not None:
                entry.metric.reset()
        out: list[dict[str, float]] = [{} for _ in range(max(self.num_dataloaders, 1))]
        for key, (value, idx) in computed.items():
            for i, row in enumerate(out):
                if idx is None or idx == i:
                    row[key] = value
        return out


class JobLog(EpochLog):
    """Stands in for ``self.log`` in ``training_step`` during one client job: a logged value is reduced over the
    job's steps (``reduce_fx``; means weighted by batch size), whatever ``on_step``/``on_epoch`` say; a logged
    metric object reports its value when last logged (Lightning resets logged metric objects at each epoch's end,
    so that is the last local epoch's value). A client update so reports the job's mean of what the module logs
    (e.g. its ``train_loss``).

    Example:
        >>> log = JobLog()
        >>> log.batch = torch.zeros(4, 1)
        >>> log.log("train_loss", 1.0); log.batch = torch.zeros(2, 1); log.log("train_loss", 4.0)
        >>> log.results()[0]
        {'train_loss': 2.0}
    """

    def __init__(self) -> None:
        super().__init__(1)
        self.hook = "training_step"
        self.metric_values: dict[str, float] = {}
        self.metric_objects: dict[str, Metric] = {}

    def log(self, name: str, value: Any, *args: Any, on_step: bool | None = None, **kwargs: Any) -> None:
        if not args and type(value) is Tensor and (not kwargs or kwargs.keys() == {"on_epoch"}):
            # The common call self.log(name, tensor) (on_step/on_epoch aside, which a job ignores): the checks of
            # EpochLog.log that depend on the call (a one-element tensor; the name's reduce_fx so far, "mean"),
            # without rebuilding its arguments (a third of a small job's own time).
            found = self.entries.get((self.hook, name))
            if value.numel() == 1 and (found is None or found[0].reduction == "mean"):
                _FxValidator.check_logging_and_get_default_levels(self.hook, False, True)
                if found is None:
                    found = self.entries[(self.hook, name)] = (_Entry("mean"), None)
                batch_size = extract_batch_size(self.batch) if self.batch is not None else 1
                found[0].update(value, batch_size or 1)
                return
        if isinstance(value, Metric):
            self.metric_values[name] = float(value.compute())
            self.metric_objects[name] = value
            return
        kwargs.pop("on_epoch", None)
        super().log(name, value, *args, on_step=False, on_epoch=True, **kwargs)

    def epoch_end(self) -> None:
        """Reset the logged metric objects, as Lightning does at the end of every training epoch."""
        for metric in self.metric_objects.values():
            metric.reset()

    def results(self) -> list[dict[str, float]]:
        return [{**super().results()[0], **self.metric_values}]
