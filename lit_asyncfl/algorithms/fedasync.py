"""FedAsync (Xie et al., 2019)."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.schedulers.keep_concurrency import CONCURRENCY, KeepConcurrency
from lit_asyncfl.server.aggregators import (
    MIXING_ALPHA,
    STALENESS_A,
    STALENESS_B,
    STALENESS_FUNCTION,
    Mixing,
    StalenessWeight,
)
from lit_asyncfl.server.staleness_bound import StalenessBound


class FedAsync(Algorithm):
    r"""Asynchronous mixing with a staleness function.

    .. math:: w_t = (1 - \alpha_t) w_{t-1} + \alpha_t w_i, \qquad \alpha_t = \alpha \, s(t - o)

    **Resolution** (common notation): the staleness is :math:`t - o`, with :math:`t` the current global
    version and :math:`o` the version the client started from, so an update computed from the current model has
    staleness 0. Xie et al. number server iterations so that such an update has :math:`t - \tau = 1`.

    **Many clients in flight.** Xie et al. evaluate staleness bounded by 4 and 16. Mixing a model trained from
    :math:`w_o` pulls :math:`w` back towards :math:`w_o` by :math:`\alpha_t (w - w_o)`; with :math:`c` clients in
    flight the staleness is about :math:`c` versions, so the step per arrival shrinks to about
    :math:`\alpha_t / (1 + \alpha_t c)` of a client update, and the :math:`c` arrivals of a job's duration move
    the model by about :math:`\alpha_t c / (1 + \alpha_t c) < 1` client update, whatever the concurrency
    (FedBuff moves :math:`c/K` averaged updates in that time). Measured on the FedHist digits suite (100 clients,
    3,000 virtual s, about 60 jobs of 16-80 s each; seed 0): every client in flight, mean staleness 98 (max 598),
    the loss stays at 2.30 for the first 4,500 virtual s and the accuracy is 0.31 at 3,000 s, 0.95 at 15,000 s:
    slow, not divergent. At 10%, 30% and 50% concurrency the loss ends at 2.29-2.28 too (0.10, 0.23, 0.14); the
    FedASMU suite's 20,000 s at 10% reach 0.94.

    Args:
        alpha: Mixing weight :math:`\alpha` (:class:`~lit_asyncfl.server.Mixing`'s argument, see there).
        staleness, a, b: The staleness function :math:`s` and its parameters
            (:class:`~lit_asyncfl.server.StalenessWeight`'s ``function``, ``a``, ``b``, see there).
        concurrency: Clients training at once (:class:`~lit_asyncfl.schedulers.KeepConcurrency`'s argument, see
            there).
        max_staleness: Discard updates staler than this (``None``: keep all).

    Example:
        >>> FedAsync(alpha=0.6, staleness="hinge", a=10, b=4).aggregator.alpha
        0.6
    """

    def __init__(
        self,
        alpha: float = MIXING_ALPHA,
        staleness: str = STALENESS_FUNCTION,
        a: float = STALENESS_A,
        b: float = STALENESS_B,
        concurrency: int | float = CONCURRENCY,
        max_staleness: int | None = None,
    ) -> None:
        hparams = hyperparameters(locals())
        callbacks = [] if max_staleness is None else [StalenessBound(max_staleness)]
        callbacks.append(StalenessWeight(staleness, a=a, b=b))
        super().__init__(
            scheduler=KeepConcurrency(concurrency),
            aggregator=Mixing(alpha),
            server_callbacks=callbacks,
            hparams=hparams,
        )
