"""FedBuff (Nguyen et al., 2022)."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.algorithms.fedadt import CONCURRENCY
from lit_asyncfl.checks import check_bool
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.server.aggregators import BUFFER_SIZE, SERVER_LR, DeltaAverage, StalenessWeight


class FedBuff(Algorithm):
    r"""Buffered asynchronous aggregation: average ``K`` client deltas, apply with a server learning rate.

    .. math:: w \leftarrow w + \eta_g \frac{1}{K} \sum_{i=1}^{K} \frac{\Delta_i}{\sqrt{1 + \tau_i}}

    Args:
        buffer_size, server_lr: The aggregation's ``K`` and :math:`\eta_g`
            (:class:`~lit_asyncfl.server.DeltaAverage`'s arguments, see there).
        staleness_weighting: Scale each delta by :math:`1/\sqrt{1+\tau}`.
        concurrency: Clients training at once (:class:`~lit_asyncfl.schedulers.KeepConcurrency`'s argument, see
            there; the default is FedADT's buffered baselines' 20%).

    Example:
        >>> FedBuff(buffer_size=10).aggregator.buffer_size
        10
    """

    def __init__(
        self,
        buffer_size: int = BUFFER_SIZE,
        server_lr: float = SERVER_LR,
        staleness_weighting: bool = True,
        concurrency: int | float = CONCURRENCY,
    ) -> None:
        hparams = hyperparameters(locals())
        check_bool("staleness_weighting", staleness_weighting)
        callbacks = [StalenessWeight("polynomial", a=0.5)] if staleness_weighting else []
        super().__init__(
            scheduler=KeepConcurrency(concurrency),
            aggregator=DeltaAverage(buffer_size=buffer_size, server_lr=server_lr),
            server_callbacks=callbacks,
            hparams=hparams,
        )
