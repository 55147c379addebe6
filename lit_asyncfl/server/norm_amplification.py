"""FedHist's Intelligent l2-Norm Amplification (INA)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from lit_asyncfl.checks import check_number
from lit_asyncfl.functional.history import amplified_norm
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: INA's decay :math:`\mu` by default (FedHist's preset repeats it by name).
MU = 1e-4


class NormAmplification(ServerCallback):
    r"""INA (Eq. 15): rescale the aggregated gradient to :math:`\frac{1 - \mu r}{K} \sum_i \|g_i\|`, direction kept.

    :math:`g_i` are the local gradients as uploaded (before EGS fusion; their norms come from
    ``update.info["gradient_norm"]`` when a :class:`~lit_asyncfl.server.gradient_history.GradientHistory` recorded
    them), :math:`r` the round being aggregated. The server step :math:`-\eta g` is scaled accordingly.

    Args:
        mu: Decay :math:`\mu \in [0, 1/R)` of the amplification over rounds.

    Example:
        >>> NormAmplification(mu=1e-4).mu
        0.0001
    """

    def __init__(self, mu: float = MU) -> None:
        check_number("INA mu", mu, 0, 1, open_max=True)
        self.mu = mu

    def transform_aggregate(self, server: Server, step: Tensor, updates: list[ClientUpdate]) -> Tensor:
        norms = [
            float(u.info["gradient_norm"]) if "gradient_norm" in u.info else float(u.delta[: server.param_numel].norm())
            for u in updates
        ]
        lr = float(getattr(server.aggregator, "server_lr", 1.0))
        current = float(step.norm())
        if current == 0.0:
            return step
        return step * (lr * amplified_norm(norms, server.version + 1, self.mu) / current)
