"""REFL's stale-aware aggregation (SAA): fresh and stale updates averaged, the stale ones damped and boosted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lit_asyncfl.checks import check_fraction, check_number
from lit_asyncfl.functional.refl import deviation_ratio, saa_weight
from lit_asyncfl.server.aggregators import Aggregator

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server

# SAA's defaults (REFL's beta = 0.35, scalecoff = 1), which REFL's preset repeats by name.
BETA = 0.35
SCALE = 1.0


class StaleAwareAverage(Aggregator):
    r"""Flush-only average of the buffered deltas, :math:`w \leftarrow w + \sum_i q_i \Delta_i / \sum_i q_i`, with
    :math:`q_i = p_i` for a fresh update (trained from the current model) and
    :math:`q_c = p_c \Lambda_c` for a stale one (:func:`~lit_asyncfl.functional.refl.saa_weight`, its staleness
    :math:`\tau_c = t - o_c` and deviation ratio :func:`~lit_asyncfl.functional.refl.deviation_ratio` against the
    fresh mean, relative to the largest ratio of the buffer's stale updates); :math:`p_i` is the server callbacks'
    weight (1 by default).

    Args:
        beta: :math:`\beta`, the weight of the boost against the damping.
        scale: The boost's scaling coefficient :math:`s \ge 1`.

    Example:
        >>> StaleAwareAverage().buffer_size, StaleAwareAverage().beta
        (None, 0.35)
    """

    def __init__(self, beta: float = BETA, scale: float = SCALE) -> None:
        super().__init__(buffer_size=None)
        check_fraction("beta", beta)
        check_number("scale", scale, 1)
        self.beta, self.scale = beta, scale

    def weights(self, server: Server) -> list[float]:
        """Each buffered update's :math:`q_i` (before normalization)."""
        n = server.param_numel  # deviations of the parameters: the server averages the buffers
        fresh = [u.delta[:n] for u, _ in self.buffer if u.base_version == server.version]
        mean = torch.stack(fresh).mean(0) if fresh else server.weights.new_zeros(n)
        ratios = [
            deviation_ratio(u.delta[:n], mean, len(fresh)) if u.base_version != server.version else 0.0
            for u, _ in self.buffer
        ]
        top = max(ratios, default=0.0)
        return [
            p if u.base_version == server.version
            else p * saa_weight(server.version - u.base_version, r, top, self.beta, self.scale)
            for (u, p), r in zip(self.buffer, ratios)
        ]  # fmt: skip

    def aggregate(self, server: Server) -> Tensor:
        return self._accumulate(server, server.weights.clone())

    def aggregate_step(self, server: Server) -> Tensor:
        return self._accumulate(server, server.weights.new_zeros(server.weights.shape))

    def _accumulate(self, server: Server, step: Tensor) -> Tensor:
        r"""Add :math:`\sum_i q_i \Delta_i / \sum_i q_i` to ``step`` in place."""
        q = self.weights(server)
        total = sum(q)
        if total > 0:
            for (update, _), weight in zip(self.buffer, q):
                step.add_(update.delta, alpha=weight / total)
        return step
