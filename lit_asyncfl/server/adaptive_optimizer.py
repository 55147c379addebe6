"""An adaptive server optimizer (AMSGrad / Adam) on the aggregated pseudo-gradient, with a delay-adaptive rate
(FADAS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check_bool, check_int, check_number
from lit_asyncfl.functional.adaptive import AdaptiveStep, amsgrad_direction, delay_adaptive_lr, momentum_direction
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

# Defaults (FADAS's, from the authors' code, with the rate for the small models here; FedAvgM's), which the presets
# repeat by name.
SERVER_LR = 0.01
BETA1 = 0.9
BETA2 = 0.99
EPS = 1e-8
BIAS_CORRECTION = False
#: :class:`ServerMomentum`'s rate :math:`\eta` and momentum :math:`\beta` (FedAvgM's main setting).
MOMENTUM_SERVER_LR = 1.0
MOMENTUM = 0.9


class AdaptiveServerOptimizer(ServerCallback):
    r"""Replace the aggregator's step :math:`\Delta_t` by an AMSGrad step :math:`\eta_t m_t / (\sqrt{\hat v_t} +
    \epsilon)` (see :func:`~lit_asyncfl.functional.adaptive.amsgrad_direction`).

    Composes with any aggregator: the step it receives (``new - current``) is read as the pseudo-gradient, so put it
    after a :class:`~lit_asyncfl.server.aggregators.DeltaAverage` with ``server_lr=1`` to get FADAS's
    :math:`\Delta_t = \frac{1}{M} \sum_i \Delta^i`. With ``delay_threshold`` :math:`\tau_c`, the rate is
    :math:`\eta_t = \eta / \tau^{max}_t` when the stalest update of the aggregation has staleness
    :math:`\tau^{max}_t > \tau_c` (:func:`~lit_asyncfl.functional.adaptive.delay_adaptive_lr`).

    The moments are committed only when the step was applied (``on_aggregated``): a step the server refuses
    (non-finite) teaches the optimizer nothing. Memory: three model-sized vectors :math:`m, v, \hat v`.

    Args:
        server_lr: Global learning rate :math:`\eta > 0`.
        beta1: :math:`\beta_1 \in [0, 1)`.
        beta2: :math:`\beta_2 \in (0, 1)`.
        eps: :math:`\epsilon > 0`.
        amsgrad: Keep the running maximum :math:`\hat v_t` (``False``: Adam, as FedAdam).
        bias_correction: Divide the moments by :math:`1 - \beta^t` (Adam's bias corrections).
        delay_threshold: :math:`\tau_c`, or ``None`` for a constant rate.

    Example:
        >>> opt = AdaptiveServerOptimizer(server_lr=0.01, delay_threshold=1)
        >>> opt.server_lr, opt.delay_threshold, opt.steps
        (0.01, 1, 0)
    """

    def __init__(
        self,
        server_lr: float = SERVER_LR,
        beta1: float = BETA1,
        beta2: float = BETA2,
        eps: float = EPS,
        amsgrad: bool = True,
        bias_correction: bool = BIAS_CORRECTION,
        delay_threshold: int | None = None,
    ) -> None:
        check_number("server_lr", server_lr, 0, open_min=True)
        check_number("beta1", beta1, 0, 1, open_max=True)
        check_number("beta2", beta2, 0, 1, open_min=True, open_max=True)
        check_number("eps", eps, 0, open_min=True)
        check_bool("amsgrad", amsgrad)
        check_bool("bias_correction", bias_correction)
        check_int("delay_threshold", delay_threshold, 0, optional=True)
        self.server_lr, self.beta1, self.beta2, self.eps = server_lr, beta1, beta2, eps
        self.amsgrad, self.bias_correction, self.delay_threshold = amsgrad, bias_correction, delay_threshold
        self._reset()

    def _reset(self) -> None:
        self.steps = 0
        self.first_moment: Tensor | None = None
        self.second_moment: Tensor | None = None
        self.max_second_moment: Tensor | None = None
        self._pending: AdaptiveStep | None = None
        #: The rate :math:`\eta_t` of the last step (for logs and tests).
        self.last_lr: float | None = None

    def on_fit_start(self, server: Server) -> None:
        self._reset()

    def _direction(self, step: Tensor) -> AdaptiveStep:
        """The direction and the new moments for the pseudo-gradient ``step`` (committed once applied)."""
        zeros = torch.zeros_like(step)
        return amsgrad_direction(
            step,
            zeros if self.first_moment is None else self.first_moment,
            zeros if self.second_moment is None else self.second_moment,
            zeros if self.max_second_moment is None else self.max_second_moment,
            self.steps + 1,
            self.beta1,
            self.beta2,
            self.eps,
            self.amsgrad,
            self.bias_correction,
        )

    def transform_aggregate(self, server: Server, step: Tensor, updates: list[ClientUpdate]) -> Tensor:
        result = self._direction(step)
        self._pending = result
        max_staleness = max((u.staleness for u in updates), default=0)
        self.last_lr = delay_adaptive_lr(self.server_lr, max_staleness, self.delay_threshold)
        return result.direction * self.last_lr

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        if self._pending is None:
            return
        _, self.first_moment, self.second_moment, self.max_second_moment = self._pending
        self._pending = None
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "first_moment": self.first_moment,
            "second_moment": self.second_moment,
            "max_second_moment": self.max_second_moment,
            "last_lr": self.last_lr,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset()
        self.steps = int(state["steps"])
        self.first_moment = state["first_moment"]
        self.second_moment = state["second_moment"]
        self.max_second_moment = state["max_second_moment"]
        self.last_lr = state["last_lr"]


class ServerMomentum(AdaptiveServerOptimizer):
    r"""FedAvgM's server momentum (Hsu et al., 2019) on the aggregator's step :math:`\Delta_t`:
    :math:`v_t = \beta v_{t-1} + \Delta_t`, the model moves by :math:`\eta_t v_t`
    (:func:`~lit_asyncfl.functional.adaptive.momentum_direction`).

    The same mechanism as :class:`AdaptiveServerOptimizer` (the buffer :math:`v` is its ``first_moment``, committed
    only when the step was applied, checkpointed; the optional delay-adaptive rate); put it after a
    :class:`~lit_asyncfl.server.aggregators.ModelAverage` (synchronous rounds: :math:`\Delta_t` = the round's
    average minus the model) or a :class:`~lit_asyncfl.server.aggregators.DeltaAverage` with ``server_lr=1``
    (buffered asynchronous). Memory: one model-sized vector.

    Args:
        server_lr: Server learning rate :math:`\eta > 0`.
        momentum: :math:`\beta \in [0, 1)`.
        delay_threshold: :math:`\tau_c` of the delay-adaptive rate, or ``None`` for a constant rate.

    Example:
        >>> opt = ServerMomentum(server_lr=1.0, momentum=0.9)
        >>> opt.momentum, opt.server_lr
        (0.9, 1.0)
    """

    def __init__(
        self, server_lr: float = MOMENTUM_SERVER_LR, momentum: float = MOMENTUM, delay_threshold: int | None = None
    ) -> None:
        check_number("momentum", momentum, 0, 1, open_max=True)
        super().__init__(server_lr=server_lr, delay_threshold=delay_threshold)
        self.momentum = momentum

    def _direction(self, step: Tensor) -> AdaptiveStep:
        buffer = momentum_direction(
            step, torch.zeros_like(step) if self.first_moment is None else self.first_moment, self.momentum
        )
        return AdaptiveStep(buffer, buffer, None, None)  # type: ignore[arg-type]
