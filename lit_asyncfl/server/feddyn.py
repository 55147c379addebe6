"""FedDyn's server state :math:`h` and the corrected server model (Acar et al., ICLR 2021)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from lit_asyncfl.checks import check_number
from lit_asyncfl.functional.feddyn import ALPHA, feddyn_server_model, feddyn_server_state
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class DynamicCorrection(ServerCallback):
    r"""FedDyn's server step on top of a uniform :class:`~lit_asyncfl.server.aggregators.ModelAverage`.

    .. math::
        h^t = h^{t-1} - \frac{\alpha}{m} \sum_{k \in P_t} (\theta_k^t - \theta^{t-1}), \qquad
        \theta^t = \frac{1}{|P_t|} \sum_{k \in P_t} \theta_k^t - \frac{1}{\alpha} h^t

    (:func:`~lit_asyncfl.functional.feddyn.feddyn_server_state`,
    :func:`~lit_asyncfl.functional.feddyn.feddyn_server_model`); :math:`m` is the number of clients of the run and
    :math:`\theta^{t-1}` each update's start model (the round's model). The aggregator's step (the average minus
    the model) is changed by :math:`-h^t / \alpha`; :math:`h` is committed only when the step was applied and is
    checkpointed. The correction acts on the parameters only (floating buffers such as BatchNorm statistics are
    averaged: the server hands every step callback the parameter part of the step), as the authors' code, which
    reads ``model.parameters()``. Memory: one model-sized vector.

    Args:
        alpha: :math:`\alpha > 0` (the clients' :class:`~lit_asyncfl.client_callbacks.DynamicRegularizer` must use the
            same).

    Example:
        >>> DynamicCorrection(alpha=0.01).alpha
        0.01
    """

    def __init__(self, alpha: float = ALPHA) -> None:
        check_number("FedDyn alpha", alpha, 0, open_min=True)
        self.alpha = alpha
        self._reset()

    def _reset(self) -> None:
        #: :math:`h` (``None``: zero, before the first aggregation).
        self.h: Tensor | None = None
        self._pending: Tensor | None = None

    def on_fit_start(self, server: Server) -> None:
        self._reset()

    def transform_aggregate(self, server: Server, step: Tensor, updates: list[ClientUpdate]) -> Tensor:
        n = server.param_numel  # == step.numel(): the server hands a step callback the parameters only
        changes = sum((u.weights[:n] - u.base_weights[:n] for u in updates), start=step.new_zeros(n))
        self._pending = h = feddyn_server_state(self.h, changes, server.num_clients, self.alpha)
        return feddyn_server_model(server.weights[:n] + step, h, self.alpha) - server.weights[:n]

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        if self._pending is not None:
            self.h, self._pending = self._pending, None

    def state_dict(self) -> dict[str, Any]:
        return {"h": self.h}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self.h = state["h"]
