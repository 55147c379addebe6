"""``ProgressBar``: a tqdm bar over virtual time (or versions) with the version and the monitored metric."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class ProgressBar(Callback):
    """Shows the run's progress toward its budget: virtual seconds when ``max_virtual_time`` is set, else versions.

    The postfix shows the global version and the last evaluation's monitored metric (``acc``). Redrawn at most
    every ``refresh_seconds`` of wall time, so a run of many short events is not slowed down by drawing.
    ``FederatedTrainer(enable_progress_bar=True)`` adds one; pass your own instance in ``callbacks`` to replace it.

    Args:
        refresh_seconds: Least wall-clock time between two redraws.

    Example:
        >>> ProgressBar(refresh_seconds=1.0).refresh_seconds
        1.0
    """

    def __init__(self, refresh_seconds: float = 0.2) -> None:
        if not refresh_seconds >= 0:
            raise ValueError(f"refresh_seconds must be >= 0, got {refresh_seconds!r}")
        self.refresh_seconds = refresh_seconds
        self._bar: Any = None
        self._last = 0.0

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        from tqdm.auto import tqdm

        by_time = trainer.max_virtual_time is not None
        unit = "virtual s" if by_time else "versions"
        self._bar = tqdm(
            total=trainer.max_virtual_time if by_time else trainer.max_versions,
            desc=trainer.algorithm.name,
            unit=unit,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:,.0f}/{total:,.0f} "
            + unit
            + " [{elapsed}<{remaining}{postfix}]",
        )
        self._last = 0.0

    def on_event_end(self, trainer: FederatedTrainer) -> None:
        now = time.perf_counter()
        if self._bar is not None and now - self._last > self.refresh_seconds:
            self._last = now
            self._refresh(trainer)

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self._close(trainer)

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        self._close(trainer)

    def _close(self, trainer: FederatedTrainer) -> None:
        if self._bar is not None:
            self._refresh(trainer)
            self._bar.close()
            self._bar = None

    def _refresh(self, trainer: FederatedTrainer) -> None:
        sim, bar = trainer.simulator, self._bar
        if sim is None:
            return
        done = sim.now if trainer.max_virtual_time is not None else sim.server.version
        bar.n = min(done, bar.total) if bar.total else done
        acc = trainer.history[-1]["accuracy"] if trainer.history else None
        bar.set_postfix(version=sim.server.version, acc=f"{acc:.3f}" if acc is not None else "-", refresh=False)
        bar.refresh()
