"""``EarlyStopping``: end the run when the monitored global metric stops improving."""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, Any, ClassVar

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class EarlyStopping(Callback):
    """Stops the run when a metric of the *global* model has not improved for ``patience`` evaluations.

    Lightning's ``EarlyStopping``, counted in evaluations of the global model (every ``eval_every`` versions, and
    whenever the algorithm evaluates) instead of validation epochs. An evaluation improves when the metric beats
    the best so far by more than ``min_delta`` (the evaluation of the final model that a run adds when it ends
    between two scheduled evaluations is not counted); after ``patience`` evaluations in a row without improvement the
    run stops at the next event boundary with ``stop_reason="early_stopping"``. Its state (best score, count) is
    checkpointed, so a resumed run keeps its patience.

    Args:
        monitor: The metric, as the module logs it in ``validation_step`` (e.g. ``"val_acc"``).
        min_delta: Least change that counts as an improvement.
        patience: Evaluations without improvement before stopping.
        mode: ``"min"`` (lower is better) or ``"max"``.
        strict: Raise when ``monitor`` is not among the evaluation's metrics (else warn once and never stop).
        check_finite: Stop when the metric becomes NaN or infinite.
        stopping_threshold: Stop as soon as the metric reaches this value.
        divergence_threshold: Stop as soon as the metric is worse than this value.
        verbose: Print each decision.

    Example:
        >>> stopper = EarlyStopping(monitor="val_acc", mode="max", patience=2)
        >>> [stopper._decide(v)[0] for v in (0.5, 0.6, 0.6, 0.59)]
        [False, False, False, True]
    """

    mode_dict: ClassVar[dict[str, Any]] = {"min": operator.lt, "max": operator.gt}

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        verbose: bool = False,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must be the name of a logged metric, got {monitor!r}")
        if mode not in self.mode_dict:
            raise ValueError(f"mode must be one of {list(self.mode_dict)}, got {mode!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}")
        if not (isinstance(min_delta, (int, float)) and math.isfinite(min_delta) and min_delta >= 0):
            raise ValueError(f"min_delta must be a finite number >= 0, got {min_delta!r}")
        for name, value in (("stopping_threshold", stopping_threshold), ("divergence_threshold", divergence_threshold)):
            if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number or None, got {value!r}")
        self.monitor = monitor
        self.min_delta = float(min_delta)
        self.patience = patience
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.verbose = verbose
        self.wait_count = 0
        self.stopped_version: int | None = None
        self.best_score = math.inf if mode == "min" else -math.inf
        #: Why the run was stopped (``None`` while it was not).
        self.stopping_reason_message: str | None = None
        self._warned = False

    @property
    def monitor_op(self) -> Any:
        """``operator.lt`` for ``mode="min"``, ``operator.gt`` for ``"max"``."""
        return self.mode_dict[self.mode]

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        if trainer.final_evaluation:
            return  # the run is ending; a resumed run would not see this evaluation
        if self.monitor not in metrics:
            message = (
                f"EarlyStopping(monitor={self.monitor!r}) found no such metric in the evaluation; the module logs: "
                f"{sorted(k for k in metrics if k not in ('version', 'virtual_time', 'wall_time'))}"
            )
            if self.strict:
                raise RuntimeError(message)
            if not self._warned:
                import warnings

                warnings.warn(message + " (strict=False: never stopping)", UserWarning, stacklevel=2)
                self._warned = True
            return
        should_stop, reason = self._decide(float(metrics[self.monitor]))
        if self.verbose and reason:
            print(f"EarlyStopping at version {metrics['version']}: {reason}")
        if should_stop:
            self.stopped_version = int(metrics["version"])
            self.stopping_reason_message = reason
            trainer.request_stop("early_stopping")

    def _decide(self, current: float) -> tuple[bool, str | None]:
        """``(should_stop, reason)`` for the next value of the metric (updates the best score and the count)."""
        better = self.monitor_op
        if self.check_finite and not math.isfinite(current):
            return True, f"{self.monitor} = {current} is not finite; the best value was {self.best_score:.4g}"
        if self.stopping_threshold is not None and better(current, self.stopping_threshold):
            return (
                True,
                f"stopping threshold reached: {self.monitor} = {current:.4g} (threshold {self.stopping_threshold})",
            )
        if self.divergence_threshold is not None and better(self.divergence_threshold, current):
            return (
                True,
                f"divergence threshold passed: {self.monitor} = {current:.4g} (threshold {self.divergence_threshold})",
            )
        delta = self.min_delta if self.mode == "min" else -self.min_delta
        if better(current + delta, self.best_score):
            reason = f"{self.monitor} improved to {current:.4g}"
            self.best_score, self.wait_count = current, 0
            return False, reason
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, (
                f"{self.monitor} did not improve in the last {self.wait_count} evaluations; best {self.best_score:.4g}"
            )
        return False, None

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_version": self.stopped_version,
            "best_score": self.best_score,
            "patience": self.patience,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = int(state_dict["wait_count"])
        self.stopped_version = state_dict["stopped_version"]
        self.best_score = float(state_dict["best_score"])
        self.patience = int(state_dict["patience"])
