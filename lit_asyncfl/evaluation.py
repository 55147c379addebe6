"""Global evaluation: run a module's ``validation_step``/``test_step`` and collect what it logs."""

from __future__ import annotations

import logging
import math
import random
import warnings
from collections.abc import Iterable
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import Tensor
from torch.utils.data import DataLoader

from lit_asyncfl.checks import check, check_int
from lit_asyncfl.core.update import derive_seed
from lit_asyncfl.data.shards import dataset_tensors
from lit_asyncfl.loops.validation_loop import run_evaluation
from lit_asyncfl.reporting import callback_metrics


def find_metric_name(metrics: dict[str, Any], kind: str) -> str | None:
    """The name of the logged metric ending in ``acc``/``accuracy`` (``kind="accuracy"``) or ``loss``, if any.

    A regression model has no accuracy: its coefficient of determination (a metric ending in ``r2``) stands in
    for it, so targets and time-to-target work the same way.

    Example:
        >>> find_metric_name({"val_loss": 0.3, "val/acc": 0.9}, "accuracy")
        'val/acc'
        >>> find_metric_name({"val_loss": 0.3, "val_r2": 0.7}, "accuracy"), find_metric_name({}, "loss")
        ('val_r2', None)
        >>> find_metric_name({"val_acc/dataloader_idx_0": 0.9, "val_acc/dataloader_idx_1": 0.8}, "accuracy")
        'val_acc/dataloader_idx_0'
    """
    groups = [("acc", "accuracy"), ("r2",)] if kind == "accuracy" else [("loss",)]
    for suffixes in groups:
        for name in metrics:
            last = name.split("/dataloader_idx_")[0].replace("/", "_").rsplit("_", 1)[-1].lower()
            if last in suffixes:
                return name
    return None


def find_metric(metrics: dict[str, float], kind: str) -> float | None:
    """The value of the metric :func:`find_metric_name` names (``None`` if none).

    Example:
        >>> find_metric({"val_loss": 0.3, "val_acc": 0.9}, "accuracy")
        0.9
    """
    name = find_metric_name(metrics, kind)
    return None if name is None else metrics[name]


def evaluate(module: L.LightningModule, batches: Iterable[Any], stage: str = "val") -> dict[str, float]:
    """Evaluate ``module`` over one dataloader's ``batches`` with Lightning's evaluation loop
    (:func:`~lit_asyncfl.loops.run_evaluation`) and return what it logged.

    Example:
        >>> import torch
        >>> from lit_asyncfl.models import LogisticRegression
        >>> m = LogisticRegression(input_dim=4, num_classes=2)
        >>> out = evaluate(m, [[torch.zeros(3, 4), torch.tensor([0, 1, 1])]])
        >>> sorted(out)
        ['val_acc', 'val_loss']
    """
    return run_evaluation(module, [batches], stage)[0]


def as_dataloaders(loaders: Any) -> list[Any]:
    """What ``val_dataloader``/``test_dataloader`` returned, as a list of dataloaders (a list, tuple or dict of them
    is several, in order, as Lightning's sequential evaluation reads them).

    Example:
        >>> len(as_dataloaders([[1], [2]])), len(as_dataloaders({"a": [1]}))
        (2, 1)
    """
    if isinstance(loaders, dict):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)) and loaders and all(_is_loader(x) for x in loaders):
        return list(loaders)
    return [loaders]


def _is_loader(obj: Any) -> bool:
    return isinstance(obj, (DataLoader, list, tuple)) and not isinstance(obj, Tensor)


def eval_loader(dm: L.LightningDataModule) -> Any:
    """The validation loader, else the test loader, else ``None`` (evaluation is then skipped)."""
    for name in ("val_dataloader", "test_dataloader"):
        try:
            return getattr(dm, name)()
        except (MisconfigurationException, NotImplementedError):
            continue
    warnings.warn(
        f"{type(dm).__name__} has no val_dataloader or test_dataloader: the global model is not evaluated",
        UserWarning,
        stacklevel=3,
    )
    return None


def evaluate_stage(
    module: L.LightningModule, datamodule: L.LightningDataModule, stage: str, verbose: bool = True
) -> list[dict[str, float]]:
    """``validate`` or ``test`` ``module`` on the data module's validation or test loader, printing the results
    table as ``lightning.Trainer`` does when ``verbose``; one dict of metrics per dataloader.

    Example:
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> from lit_asyncfl.models import LogisticRegression
        >>> sorted(evaluate_stage(LogisticRegression(input_dim=64), DigitsDataModule(), "test", verbose=False)[0])
        ['test_acc', 'test_loss']
    """
    if stage not in ("validate", "test"):
        raise ValueError(f"stage must be 'validate' or 'test', got {stage!r}")
    datamodule.setup(stage)
    loaders = as_dataloaders(datamodule.val_dataloader() if stage == "validate" else datamodule.test_dataloader())
    results = run_evaluation(module, loaders, "val" if stage == "validate" else "test")
    if verbose:
        _EvaluationLoop._print_results(results, stage)
    return results


MODES = ("max", "min")
_log = logging.getLogger("lit_asyncfl")


class GlobalEvaluation:
    """The run's evaluation loop: evaluates the global model, keeps the history, and names the monitored metric.

    The global model is evaluated at version 0, every ``every`` versions, whenever the algorithm asks (e.g. ASFL
    at each round end) and at the end of the run. Each evaluation is one row of :attr:`history`: ``version``,
    ``virtual_time``, ``accuracy`` (the monitored metric's value), ``loss``, ``updates_received``,
    ``updates_aggregated``, ``wall_time`` and every metric the module logged.

    The monitored metric decides the run's ``best_accuracy`` and ``time_to_target``. ``monitor=None`` picks the
    logged metric ending in ``acc``/``accuracy`` (else ``r2``) and announces its choice once, at the first
    evaluation; a named ``monitor`` that the module does not log is refused there, with the names it does log.

    Args:
        every: Evaluate every this many versions.
        monitor: Name of the monitored metric (e.g. ``"val_acc"``), or ``None`` for the rule above.
        mode: ``"max"`` when higher is better, ``"min"`` when lower is.
        target: The value whose first attainment is the run's ``time_to_target`` (in ``(0, 1]`` when the metric is
            found by the rule above, i.e. an accuracy or R²).

    Example:
        >>> evaluation = GlobalEvaluation(every=5, monitor=None, mode="max", target=0.8)
        >>> evaluation.next_due, evaluation.due_after(10), evaluation.due_after(12)
        (0, 15, 15)
    """

    def __init__(self, every: int, monitor: str | None, mode: str, target: float) -> None:
        check_int("eval_every", every, 1)
        check(mode in MODES, f"mode must be one of {list(MODES)}, got {mode!r}")
        check(
            monitor is None or (isinstance(monitor, str) and monitor != ""),
            f"monitor must be a metric name or None, got {monitor!r}",
        )
        if monitor is None:
            check(
                mode == "max",
                "mode='min' needs a named monitor (e.g. monitor='val_loss'): the default metric is an accuracy",
            )
            check(0 < target <= 1, f"target_accuracy must be in (0, 1], got {target}")
        else:
            check(math.isfinite(target), f"target_accuracy must be finite, got {target}")
        self.every = every
        self.target = target
        self.monitor = monitor
        self.mode = mode
        self.history: list[dict[str, Any]] = []
        #: The next version the schedule evaluates (a run evaluates a new version once it reaches it): set by each
        #: evaluation, so that the run loop reads it instead of asking at every new version.
        self.next_due = 0
        #: Name of the monitored metric, once resolved at the first evaluation (``None``: none found).
        self.monitor_name: str | None = monitor
        self._resolved = False
        self._model: L.LightningModule | None = None
        self.batches: list[Any] | None = None
        self.rereads = False
        self.seed = 0
        self._load: Any = None
        self._wall_seconds: Any = None

    def setup(
        self,
        model: L.LightningModule,
        load_weights: Any,
        loaders: Any,
        wall_seconds: Any,
        seed: int = 0,
    ) -> None:
        """Bind to a fit: the module, how to load flat weights into it, what ``val_dataloader`` returned (a tensor
        dataset's batches are read once, any other dataset at every evaluation), a wall clock, the run seed."""
        self._model, self._load, self._wall_seconds, self.seed = model, load_weights, wall_seconds, seed
        # Static tensor data is read once; any other dataset is read afresh at every evaluation, as Lightning does
        self.batches = None
        if loaders is not None:
            self.batches = [
                list(dl) if not isinstance(dl, DataLoader) or dataset_tensors(dl.dataset) is not None else dl
                for dl in as_dataloaders(loaders)
            ]
        self.rereads = self.batches is not None and any(isinstance(b, DataLoader) for b in self.batches)
        self.history = []
        self.next_due = 0
        self.monitor_name, self._resolved = self.monitor, False

    def restore(self, history: list[dict[str, Any]], monitor_name: str | None) -> None:
        """Continue a resumed run: its history and the metric it monitored."""
        self.history[:] = history
        if history:
            self.monitor_name, self._resolved = monitor_name, True
            self.next_due = self.due_after(history[-1]["version"])

    def due_after(self, version: int) -> int:
        """The first version after ``version`` that the schedule evaluates (a multiple of ``every``)."""
        return (version // self.every + 1) * self.every

    def has(self, version: int) -> bool:
        """Whether ``version`` is the last evaluated one."""
        return bool(self.history) and self.history[-1]["version"] == version

    def run(self, sim: Any) -> dict[str, Any] | None:
        """Evaluate the current global model of ``sim`` and append its row (``None`` without evaluation data)."""
        server = sim.server
        self.next_due = self.due_after(server.version)
        if not self.batches:
            return None
        assert self._model is not None
        self._load(server.weights)
        if self.rereads:  # a dataset read afresh: its random transforms draw from generators seeded by the version
            state = random.getstate(), np.random.get_state()
            try:
                with torch.random.fork_rng(devices=[]):
                    eval_seed = derive_seed(self.seed, server.version, 0xE7A1)
                    torch.default_generator.manual_seed(eval_seed)
                    random.seed(eval_seed)
                    np.random.seed(eval_seed % 2**32)
                    results = run_evaluation(self._model, self.batches, "val", server.version)
            finally:
                random.setstate(state[0])
                np.random.set_state(state[1])
        else:
            results = run_evaluation(self._model, self.batches, "val", server.version)
        metrics = {k: v for result in results for k, v in result.items()}
        for key in [k for k in metrics if k.endswith("_epoch")]:  # on_step and on_epoch: also the bare name, as
            metrics.setdefault(key[: -len("_epoch")], metrics[key])  # in Lightning's callback_metrics
        self._resolve(metrics)
        stats = server.stats
        row: dict[str, Any] = {
            "version": server.version,
            "virtual_time": sim.now,
            "accuracy": metrics.get(self.monitor_name) if self.monitor_name is not None else None,
            "loss": find_metric(metrics, "loss"),
            "updates_received": stats.received,
            "updates_aggregated": stats.aggregated,
            "updates_dropped": sum(sim.dropped.values()),
            "num_online": int(sim.availability.online(sim.now).sum()),
            "wall_time": round(self._wall_seconds(), 3),
            **callback_metrics(sim),
            **metrics,
        }
        self.history.append(row)
        return row

    def _resolve(self, metrics: dict[str, float]) -> None:
        if self._resolved:
            return
        self._resolved = True
        if self.monitor is not None:
            if self.monitor not in metrics:
                raise ValueError(
                    f"monitor={self.monitor!r} is not among the metrics the module logs in validation: "
                    f"{sorted(metrics)}; set FederatedTrainer(monitor=...) to one of them (what training_step logs is "
                    "each client update's, in update.metrics, not the global model's)"
                )
            return
        self.monitor_name = find_metric_name(metrics, "accuracy")
        if self.monitor_name is None:
            warnings.warn(
                f"no logged metric ends in acc, accuracy or r2 (logged: {sorted(metrics)}): best_accuracy and "
                "time_to_target are not computed; set FederatedTrainer(monitor=..., mode=...) to name one",
                UserWarning,
                stacklevel=2,
            )
        else:
            _log.info(
                f"lit_asyncfl: monitoring {self.monitor_name!r} (mode={self.mode!r}) for best_accuracy and "
                "time_to_target; set FederatedTrainer(monitor=...) to choose another metric"
            )
