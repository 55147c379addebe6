"""``InterruptHandler``: Ctrl-C or SIGTERM stops the run at the next event boundary, with its outputs and
checkpoint."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

from lit_asyncfl.callbacks.base import Callback

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


class InterruptHandler(Callback):
    """Turns the first Ctrl-C (SIGINT) or SIGTERM (what Slurm, Kubernetes and ``kill`` send) into a graceful stop; a
    second signal aborts at once.

    After the first, the run ends at the next event boundary like any other stop: the final evaluation, the
    summary (``stop_reason="interrupted"``), the output files and ``last.ckpt`` are written, so the run can be
    resumed. The handler is installed for the duration of ``fit`` (only from the main thread, where Python
    delivers signals) and the previous one restored afterwards. Every trainer has one.

    Example:
        >>> InterruptHandler().state_key
        'InterruptHandler'
    """

    #: The signals handled.
    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}
        self._installed = False
        self._interrupted = False

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        self._interrupted = False
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: int, frame: Any) -> None:
            if self._interrupted:  # a second signal: stop now
                raise KeyboardInterrupt
            self._interrupted = True
            name = signal.Signals(signum).name
            trainer.request_stop("interrupted" if signum == signal.SIGINT else f"interrupted ({name})")
            print(f"\n{name}: stopping at the next event boundary (Ctrl-C again to abort)...", flush=True)

        self._previous = {sig: signal.signal(sig, handler) for sig in self.SIGNALS}
        self._installed = True

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self._restore()

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._installed:
            for sig, previous in self._previous.items():
                signal.signal(sig, previous)
            self._installed = False
