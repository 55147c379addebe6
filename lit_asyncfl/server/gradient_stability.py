"""FedHist's Enhancement of Gradient Stability (EGS)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lit_asyncfl.checks import check_number
from lit_asyncfl.functional.history import least_similar
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.gradient_history import GradientHistory

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: EGS's fusion coefficient :math:`\alpha` by default (FedHist's preset repeats it by name).
ALPHA = 0.1


class GradientStability(ServerCallback):
    r"""EGS (Eqs. 5-7): fuse each local gradient with the least similar cached global gradient.

    .. math:: g_{co} = \arg\min_{g \in \mathcal{G}} \cos\langle g_i, g \rangle, \qquad \tilde g_i = g_i + \alpha g_{co}

    once the round being aggregated, :math:`r`, exceeds the buffer length :math:`h` (no fusion while
    :math:`r \le h`). The upload is rewritten so that :math:`w_o - \tilde w_i = \tilde g_i`.

    Args:
        history: The shared :class:`~lit_asyncfl.server.gradient_history.GradientHistory` (placed before this).
        alpha: Fusion coefficient :math:`\alpha > 0`.

    Example:
        >>> GradientStability(GradientHistory(3), alpha=0.1).alpha
        0.1
    """

    def __init__(self, history: GradientHistory, alpha: float = ALPHA) -> None:
        check_number("EGS alpha", alpha, 0)
        self.history = history
        self.alpha = alpha

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        if server.version + 1 <= self.history.length or not self.history.global_gradients:
            return update
        n = server.param_numel  # the fusion is a step on parameters: the uploaded buffers are kept (averaged)
        gradient = update.info.get("gradient", -update.delta[:n])
        candidates = list(self.history.global_gradients)
        index = least_similar(gradient, candidates)
        fused = update.base_weights[:n] - (gradient + self.alpha * candidates[index])
        update.weights = torch.cat([fused, update.weights[n:]]) if n < update.weights.numel() else fused
        update.info["egs_partner"] = index  # position in the buffer, oldest first
        return update
