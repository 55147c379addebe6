"""WKAFL's aggregation: momentum, norm clipping and a two-stage (staleness, then consistency) weighted step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check_bool, check_int, check_number
from lit_asyncfl.functional.wkafl import adaptive_lr, clip_norm, two_stage_aggregate
from lit_asyncfl.server.aggregators import Aggregator

# Defaults (the authors' MNIST script), which WKAFL's preset repeats by name.
BUFFER_SIZE = 10
SERVER_LR = 1.0
MOMENTUM = 0.1
FIRST_CLIP = 100.0
SECOND_CLIP = 10.0
THRESHOLD = 0.3
CLIP_IN_PLACE = True

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class TwoStageWeightedStep(Aggregator):
    r"""Every ``K`` updates: :math:`g_i = \mathrm{clip}(-\Delta_i + \beta G_{t-1},\ C_1)`, then
    :math:`G_t` = :func:`~lit_asyncfl.functional.wkafl.two_stage_aggregate` of the :math:`g_i` with staleness
    :math:`\tau_i = t - o_i + 1`, and :math:`w_{t+1} = w_t - \eta_t G_t` with
    :math:`\eta_t = \eta / (1 + c\, \tau_{min})` (:func:`~lit_asyncfl.functional.wkafl.adaptive_lr`).

    :math:`G_{t-1}` (the last aggregate, 0 at first) is the momentum the authors' clients add to their gradient
    against non-IID drift; it is kept here, on the server, and checkpointed. It becomes :math:`G_t` only once the
    server has applied the step (:meth:`on_aggregated`): a step the server refuses as non-finite teaches it nothing
    (an overflowing upload would otherwise make it NaN and every later step non-finite). The server callbacks'
    weights are not used (WKAFL has its own); an update weighted 0 by a callback is left out. The gradients, their
    norms and cosines are those of the parameters: floating buffers (BatchNorm statistics) are averaged by the
    server (see :class:`~lit_asyncfl.core.server.Server`), their part of the step is 0.

    Args:
        buffer_size: :math:`K`.
        server_lr: :math:`\eta`.
        momentum: :math:`\beta` (the authors' ``alpha``).
        first_clip: :math:`C_1` (absolute bound of each :math:`g_i`, and stage one's factor on the freshest norm).
        second_clip: :math:`B` (stage two's factor on :math:`\|\tilde G\|`).
        threshold: Consistency threshold :math:`\theta`.
        temperature: :math:`T` of the consistency weights :math:`e^{T \cos}`.
        lr_decay: :math:`c` of the adaptive rate.
        clip_in_place: Stage two reads the gradients as stage one clipped them, as the authors' code (see
            :func:`~lit_asyncfl.functional.wkafl.two_stage_aggregate`); ``False``: as they came.

    Example:
        >>> TwoStageWeightedStep(buffer_size=10).buffer_size
        10
    """

    def __init__(
        self,
        buffer_size: int = BUFFER_SIZE,
        server_lr: float = SERVER_LR,
        momentum: float = MOMENTUM,
        first_clip: float = FIRST_CLIP,
        second_clip: float = SECOND_CLIP,
        threshold: float = THRESHOLD,
        temperature: float = 10.0,
        lr_decay: float = 0.1,
        clip_in_place: bool = CLIP_IN_PLACE,
    ) -> None:
        check_int("buffer_size", buffer_size, 1)
        super().__init__(buffer_size)
        check_number("server_lr", server_lr, 0, open_min=True)
        check_number("momentum", momentum, 0, 1)
        check_number("first_clip", first_clip, 0, open_min=True)
        check_number("second_clip", second_clip, 0, open_min=True)
        check_number("threshold", threshold, -1, 1, open_max=True)
        check_number("temperature", temperature, 0)
        check_number("lr_decay", lr_decay, 0)
        check_bool("clip_in_place", clip_in_place)
        self.clip_in_place = clip_in_place
        self.server_lr, self.momentum = server_lr, momentum
        self.first_clip, self.second_clip = first_clip, second_clip
        self.threshold, self.temperature, self.lr_decay = threshold, temperature, lr_decay
        self.previous: Tensor | None = None
        self._staged: Tensor | None = None  # G_t of the step just computed, committed once the server applies it
        #: Gradients stage two kept at the last aggregation, and the last rate (for logs and tests).
        self.last_kept: list[bool] = []
        self.last_lr = server_lr

    def on_fit_start(self, server: Server) -> None:
        super().on_fit_start(server)
        self.previous = self._staged = None

    def aggregate(self, server: Server) -> Tensor:
        return server.weights + self.aggregate_step(server)

    def aggregate_step(self, server: Server) -> Tensor:
        self._staged = None
        entries = [(u, w) for u, w in self.buffer if w > 0]
        if not entries:
            return server.weights.new_zeros(server.weights.shape)
        n = server.param_numel  # gradients, norms and cosines of the parameters: the server averages the buffers
        previous = self.previous if self.previous is not None else server.weights.new_zeros(n)
        grads = [clip_norm(-u.delta[:n] + self.momentum * previous, self.first_clip) for u, _ in entries]
        staleness = [server.version - u.base_version + 1 for u, _ in entries]
        step, _, self.last_kept = two_stage_aggregate(
            grads, staleness, self.first_clip, self.second_clip, self.threshold, self.temperature, self.clip_in_place
        )
        self._staged = step
        self.last_lr = adaptive_lr(self.server_lr, min(staleness), self.lr_decay)
        return torch.cat([-self.last_lr * step, server.weights.new_zeros(server.weights.numel() - n)])

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        if self._staged is not None:  # None: every update was weighted 0, the model did not move
            self.previous, self._staged = self._staged, None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous": self.previous}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.previous = state["previous"]
