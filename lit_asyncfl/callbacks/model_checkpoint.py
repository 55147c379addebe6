"""``ModelCheckpoint``: keep the best global models by a monitored metric, as Lightning's callback does."""

from __future__ import annotations

import math
import operator
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class ModelCheckpoint(Callback):
    """Saves the global model at evaluations, keeping the ``save_top_k`` best by ``monitor``.

    Lightning's ``ModelCheckpoint`` for the *global* model: it acts at evaluations of the global model (every
    ``eval_every`` versions) instead of validation epochs. Each file is a Lightning checkpoint of the global model
    at the evaluated version, so ``MyModule.load_from_checkpoint(callback.best_model_path)`` and
    ``lightning.Trainer().test(model, ckpt_path=...)`` work on it, and so does
    ``FederatedTrainer.test(ckpt_path="best")``. Ties rank as in Lightning (the oldest of equal scores is the best
    and the first evicted). The evaluation a run adds of its final model when its budget ends between two
    scheduled evaluations is not ranked (a resumed run would not see it; the final model is in ``last.ckpt``).
    These files hold the model, not the simulation (an evaluation
    happens mid-event, where the simulation cannot be saved consistently); ``save_last=True`` also keeps
    ``last.ckpt`` in ``dirpath``: a resumable checkpoint of the whole run, written at the event boundary after each
    check and at the end. Its state (the best paths and scores) is checkpointed with the run: a resumed run ranks
    the earlier run's files with its own (they are never deleted from another directory).

    Args:
        dirpath: Directory of the files (default: ``<log_dir>/checkpoints``).
        filename: File name template without ``.ckpt``; ``{version}``, ``{virtual_time}`` and any logged metric
            may appear, with a format (``"{version}-{val_acc:.3f}"`` gives ``version=40-val_acc=0.912``). Default:
            ``"{version}"``, followed by ``"-{<monitor>:.4f}"`` when a metric is monitored.
        monitor: The metric deciding the best models (e.g. ``"val_acc"``); ``None``: keep the latest.
        verbose: Print each save.
        save_last: Also keep a resumable ``last.ckpt`` of the run in ``dirpath``.
        save_top_k: How many best models to keep (``-1``: every one checked; ``0``: none). Without ``monitor``,
            ``1`` keeps the latest and ``-1`` all.
        mode: ``"min"`` (lower is better, Lightning's default) or ``"max"``.
        every_n_versions: Check at an evaluation only when at least this many versions passed since the last check
            (``None``: at every evaluation).

    Example:
        >>> ckpt = ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=2)
        >>> ckpt.format_checkpoint_name({"version": 40, "val_acc": 0.91234})
        'version=40-val_acc=0.9123.ckpt'
    """

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    mode_dict: ClassVar[dict[str, Any]] = {"min": operator.lt, "max": operator.gt}

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | None = None,
        save_top_k: int = 1,
        mode: str = "min",
        every_n_versions: int | None = None,
    ) -> None:
        if mode not in self.mode_dict:
            raise ValueError(f"mode must be one of {list(self.mode_dict)}, got {mode!r}")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(f"save_top_k must be an integer >= -1, got {save_top_k!r}")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ValueError(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) has no metric to rank models by: set monitor, "
                "or save_top_k to -1 (keep every check), 0 or 1 (keep the latest)"
            )
        if save_last not in (None, True, False):
            raise ValueError(f"save_last must be True, False or None, got {save_last!r}")
        if every_n_versions is not None and (
            isinstance(every_n_versions, bool) or not isinstance(every_n_versions, int) or every_n_versions < 1
        ):
            raise ValueError(f"every_n_versions must be an integer >= 1 or None, got {every_n_versions!r}")
        self.dirpath = str(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.mode = mode
        self.every_n_versions = every_n_versions
        #: Checkpoints kept, path -> score (the latest ones when nothing is monitored).
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.kth_best_model_path = ""
        self.last_model_path = ""
        self._last_checked: int | None = None
        self._last_pending = False

    @property
    def state_key(self) -> str:
        return self._generate_state_key(
            monitor=self.monitor, mode=self.mode, every_n_versions=self.every_n_versions, filename=self.filename
        )

    # -- hooks --------------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        if self.dirpath is None:
            self.dirpath = os.path.join(trainer.log_dir, "checkpoints")

    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        if trainer.final_evaluation:
            return  # not ranked: a resumed run never sees it (the final state is in the run's last.ckpt)
        version = int(metrics["version"])
        if self._last_checked is not None and (
            version == self._last_checked
            or (self.every_n_versions is not None and version - self._last_checked < self.every_n_versions)
        ):
            return
        self._last_checked = version
        if self.save_top_k != 0:
            if self.monitor is None:
                self._save_latest(trainer, metrics)
            else:
                self._save_if_top_k(trainer, metrics)
        if self.save_last:
            self._last_pending = True  # written at the end of this event, where the simulation is consistent

    def on_event_end(self, trainer: FederatedTrainer) -> None:
        if self._last_pending:
            self._save_last(trainer)

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        if self.save_last:
            self._save_last(trainer)

    # -- decisions ----------------------------------------------------------------------------------------------
    def format_checkpoint_name(self, metrics: dict[str, Any]) -> str:
        """The file name for an evaluation's ``metrics`` (with ``version``), from :attr:`filename`."""
        template = self.filename
        if template is None:
            template = "{version}" + (f"{self.CHECKPOINT_JOIN_CHAR}{{{self.monitor}:.4f}}" if self.monitor else "")
        values = {}
        for group in re.findall(r"(\{.*?)[:\}]", template):
            name = group[1:]
            key = re.sub(r"\W", "_", name)
            template = template.replace(group, f"{name}{self.CHECKPOINT_EQUALS_CHAR}{{{key}", 1)
            if name not in metrics:
                raise KeyError(f"ModelCheckpoint(filename={self.filename!r}) names {name!r}, which was not logged")
            values[key] = metrics[name]
        return template.format(**values) + self.FILE_EXTENSION

    def _path(self, metrics: dict[str, Any]) -> str:
        assert self.dirpath is not None
        return os.path.join(self.dirpath, self.format_checkpoint_name(metrics))

    def _save_latest(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        path = self._path(metrics)
        trainer.save_checkpoint(path, weights_only=True)
        if self.save_top_k == 1:
            for old in list(self.best_k_models):
                if old != path:
                    self._remove(old)
        self.best_k_models[path] = float(metrics["version"])
        self.best_model_path = path
        self._say(f"version {metrics['version']}: saved {path}")

    def _save_if_top_k(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        if self.monitor not in metrics:
            logged = sorted(k for k in metrics if k not in ("version", "virtual_time", "wall_time"))
            raise RuntimeError(
                f"ModelCheckpoint(monitor={self.monitor!r}) found no such metric in the evaluation; the module "
                f"logs: {logged}"
            )
        score = float(metrics[self.monitor])
        if not math.isfinite(score):  # as Lightning: a non-finite score ranks worst
            score = math.inf if self.mode == "min" else -math.inf
        better = self.mode_dict[self.mode]
        worst, best = (max, min) if self.mode == "min" else (min, max)
        full = self.save_top_k != -1 and len(self.best_k_models) >= self.save_top_k
        if full and not better(score, self.best_k_models[self.kth_best_model_path]):
            return
        evicted = self.kth_best_model_path if full else None
        if evicted is not None:
            del self.best_k_models[evicted]
        path = self._path(metrics)
        trainer.save_checkpoint(path, weights_only=True)
        if evicted is not None and evicted != path:  # a fixed file name overwrites in place
            self._remove(evicted)
        self.best_k_models[path] = score
        # as Lightning: among equal scores the oldest counts as the k-th (evicted first) and as the best
        self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.__getitem__)
        self.best_model_score = self.best_k_models[self.best_model_path]
        self._say(f"version {metrics['version']}: {self.monitor}={score:.4g}, saved {path}")

    def _save_last(self, trainer: FederatedTrainer) -> None:
        assert self.dirpath is not None
        self.last_model_path = os.path.join(self.dirpath, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION)
        trainer.save_checkpoint(self.last_model_path)
        self._last_pending = False

    def _remove(self, path: str) -> None:
        """Drop ``path`` from the ranking; delete the file only when it is under this callback's directory."""
        self.best_k_models.pop(path, None)
        if not path or self.dirpath is None or not Path(path).is_file():
            return
        if Path(path).resolve().is_relative_to(Path(self.dirpath).resolve()):
            os.remove(path)

    def _say(self, message: str) -> None:
        if self.verbose:
            print(f"ModelCheckpoint: {message}")

    # -- state --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "dirpath": self.dirpath,
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "kth_best_model_path": self.kth_best_model_path,
            "last_model_path": self.last_model_path,
            "last_checked": self._last_checked,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A resumed run usually writes into a new log dir: the earlier run's files keep their rank (so the best
        # score and path carry over), but only files in this callback's own dirpath are ever deleted.
        self._last_checked = state_dict["last_checked"]
        self.best_k_models = dict(state_dict["best_k_models"])
        self.best_model_path = state_dict["best_model_path"]
        self.best_model_score = state_dict["best_model_score"]
        self.kth_best_model_path = state_dict["kth_best_model_path"]
        self.last_model_path = state_dict["last_model_path"]
