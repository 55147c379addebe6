"""A sliding window of the latest client models, averaged at every arrival (FedFa)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_asyncfl.checks import check_int
from lit_asyncfl.functional.calibration import sliding_window_average
from lit_asyncfl.server.aggregators import Aggregator

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: Window length :math:`K` by default, which FedFa's preset repeats by name.
WINDOW_SIZE = 10


class SlidingWindowAverage(Aggregator):
    r"""The global model is the mean of the last ``K`` client models received (a FIFO queue).

    .. math:: w_{t+1} = \frac{\sum_{j=0}^{K-1} p_{(t-j)} \, w_{(t-j)}}{\sum_{j=0}^{K-1} p_{(t-j)}}

    where :math:`w_{(t-j)}` is the model of the :math:`j`-th latest accepted arrival and :math:`p` its weight from
    the server callbacks (1 without weight callbacks, as in FedFa). Once the window is full, every arrival pushes its
    model, drops the oldest one and makes a new version; the first version is made when the ``K``-th model arrives
    (the window starts empty, not filled with the initial model). The arrivals enter the window only once the
    server has applied the new model (:meth:`on_aggregated`): a model the server refuses (non-finite) leaves the
    window as it was.

    Memory: ``K`` model copies (the window), besides the server's own.

    Args:
        window_size: Number of models :math:`K` in the window.

    Example:
        >>> SlidingWindowAverage(window_size=10).window_size
        10
    """

    averages_models = True

    def __init__(self, window_size: int = WINDOW_SIZE) -> None:
        check_int("window_size", window_size, 1)
        super().__init__(buffer_size=1)
        self.window_size = window_size
        self.window: deque[tuple[Tensor, float]] = deque(maxlen=window_size)
        self._aggregated: list[tuple[Tensor, float]] | None = None

    def on_fit_start(self, server: Server) -> None:
        super().on_fit_start(server)
        self.window.clear()
        self._aggregated = None

    def add(self, server: Server, update: ClientUpdate, weight: float) -> None:
        super().add(server, update, weight)
        self._aggregated = None  # a model aggregated but never applied: refused by the server

    def ready(self) -> bool:
        """Whether the window, with the buffered arrivals, holds ``K`` models."""
        return len(self.window) + len(self.buffer) >= self.window_size

    def aggregate(self, server: Server) -> Tensor:
        self._aggregated = [(update.weights, weight) for update, weight in self.buffer]
        window = (list(self.window) + self._aggregated)[-self.window_size :]
        return sliding_window_average([w for w, _ in window], [p for _, p in window])

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        self.window.extend(self._aggregated or [])  # the deque drops the oldest beyond K
        self._aggregated = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "window": [(w, p) for w, p in self.window]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.window.clear()
        self.window.extend((w, float(p)) for w, p in state["window"])
        self._aggregated = None
