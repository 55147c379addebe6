"""TWAFL's temporally weighted aggregation (Chen, Sun and Jin, 2019) under K-async training."""

from __future__ import annotations

import math

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_int
from lit_asyncfl.schedulers.k_async import K, KAsync
from lit_asyncfl.server.aggregators import SERVER_LR, DeltaAverage, StalenessWeight


class TWAFL(Algorithm):
    r"""Weights :math:`p_i \propto (e/2)^{-\tau_i}`, normalised: the exponential staleness weight with
    :math:`a = \ln(e/2) = 1 - \ln 2` (the constant factor of FedHist's :math:`\tau = t - o + 1` cancels in the
    normalisation), under K-async rounds.

    Args:
        k: Updates per aggregation :math:`K` (:class:`~lit_asyncfl.schedulers.KAsync`'s ``k``, the aggregation's
            ``buffer_size``).
        server_lr: Server learning rate :math:`\eta` (:class:`~lit_asyncfl.server.DeltaAverage`'s, see there).

    Example:
        >>> round(TWAFL().server_callbacks[0].a, 6)
        0.306853
    """

    def __init__(self, k: int = K, server_lr: float = SERVER_LR) -> None:
        hparams = hyperparameters(locals())
        check_int("k", k, 1)  # also the buffer size: a count, not a fraction
        super().__init__(
            scheduler=KAsync(k),
            aggregator=DeltaAverage(buffer_size=k, server_lr=server_lr, normalize=True),
            server_callbacks=[StalenessWeight("exponential", a=1.0 - math.log(2.0))],
            hparams=hparams,
        )
