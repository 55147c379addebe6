"""``InterruptHandler``: Ctrl-C stops the run at the next event boundary, with its outputs and checkpoint."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class InterruptHandler(Callback):
    """Turns the first Ctrl-C (SIGINT) into a graceful stop; a second one aborts at once.

    After the first, the run ends at the next event boundary like any other stop: the final evaluation, the
    summary (``stop_reason="interrupted"``), the output files and ``last.ckpt`` are written, so the run can be
    resumed. The handler is installed for the duration of ``fit`` (only from the main thread, where Python
    delivers signals) and the previous one restored afterwards. Every trainer has one.

    Example:
        >>> InterruptHandler().state_key
        'InterruptHandler'
    """

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False
        self._interrupted = False

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        self._interrupted = False
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            if self._interrupted:  # second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._interrupted = True
            trainer.request_stop("interrupted")
            print("\nStopping at the next event boundary (Ctrl-C again to abort)...", flush=True)

        self._previous = signal.signal(signal.SIGINT, handler)
        self._installed = True

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self._restore()

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
