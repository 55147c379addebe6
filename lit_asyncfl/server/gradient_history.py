"""FedHist's server-side buffer of recent global and local gradients."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from lit_asyncfl.checks import check_int
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from torch import Tensor

    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: Buffer length :math:`h` by default (FedHist's preset repeats it by name).
LENGTH = 5


class GradientHistory(ServerCallback):
    r"""The buffer of the last ``h`` rounds (FedHist): global gradients :math:`\mathcal{G}` and, per round, the
    local gradients :math:`\mathcal{L}` with their client, base version and staleness.

    Gradients are pseudo-gradients :math:`g_i = w_{start} - w_{end}`; a round is one aggregation, numbered by the
    version it produces. FedHist staleness is :math:`\tau = t - o + 1 \ge 1`. Put it before the callbacks that
    read it: it records each update's original gradient (``update.info["gradient"]`` and its norm
    ``"gradient_norm"``) before any transform (EGS) changes the upload. Memory: at most ``h`` rounds of local
    gradients plus ``h`` global gradients.

    Args:
        length: Buffer length :math:`h` in rounds.

    Example:
        >>> GradientHistory(5).length
        5
    """

    def __init__(self, length: int = LENGTH) -> None:
        check_int("buffer length h", length, 0)
        self.length = length
        self._reset()

    def _reset(self) -> None:
        self.global_gradients: deque[Tensor] = deque(maxlen=max(self.length, 1))
        self.rounds: deque[dict[str, Any]] = deque(maxlen=max(self.length, 1))

    def on_fit_start(self, server: Server) -> None:
        self._reset()

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        gradient = -update.delta[: server.param_numel]  # gradients of parameters: buffers are averaged
        update.info["gradient"] = gradient
        update.info["gradient_norm"] = float(gradient.norm())
        return update

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        if self.length == 0:
            return
        lr = float(getattr(server.aggregator, "server_lr", 1.0))
        n = server.param_numel
        self.global_gradients.append((server.previous_weights[:n] - server.weights[:n]) / lr)
        self.rounds.append(
            {
                "round": server.version,
                "entries": [
                    {
                        "client": u.client,
                        "base_version": u.base_version,
                        "staleness": u.staleness + 1,
                        "gradient": u.info["gradient"],
                    }
                    for u in updates
                ],
            }
        )

    def relatively_fresh(self, base_version: int) -> list[Tensor]:
        """Every buffered local gradient computed from global version ``base_version``, whenever it arrived."""
        return [e["gradient"] for r in self.rounds for e in r["entries"] if e["base_version"] == base_version]

    def state_dict(self) -> dict[str, Any]:
        return {"global_gradients": list(self.global_gradients), "rounds": list(self.rounds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self.global_gradients.extend(state["global_gradients"])
        self.rounds.extend(state["rounds"])
