"""DynSGD (Jiang et al., 2017) under K-async training."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_int
from lit_asyncfl.schedulers.k_async import KAsync
from lit_asyncfl.server.aggregators import DeltaAverage
from lit_asyncfl.server.weights import StalenessWeight


class DynSGD(Algorithm):
    r"""Staleness-scaled learning rate: :math:`w \leftarrow w - \frac{\eta}{K} \sum_i \frac{1}{\tau_i} g_i`, with
    :math:`\tau_i = t - o + 1` (the polynomial staleness weight with exponent 1), under K-async rounds.

    Args:
        k: Updates per aggregation :math:`K`.
        server_lr: Server learning rate :math:`\eta`.

    Example:
        >>> DynSGD(k=5).aggregator.buffer_size
        5
    """

    def __init__(self, k: int = 10, server_lr: float = 1.0) -> None:
        hparams = hyperparameters(locals())
        check_int("k", k, 1)  # also the buffer size: a count, not a fraction
        super().__init__(
            scheduler=KAsync(k),
            aggregator=DeltaAverage(buffer_size=k, server_lr=server_lr, normalize=False),
            server_callbacks=[StalenessWeight("polynomial", a=1.0)],
            hparams=hparams,
        )
