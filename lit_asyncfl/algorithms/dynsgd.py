"""DynSGD (Jiang et al., 2017) under K-async training."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_int
from lit_asyncfl.schedulers.k_async import K, KAsync
from lit_asyncfl.server.aggregators import NORMALIZE, SERVER_LR, DeltaAverage, StalenessWeight


class DynSGD(Algorithm):
    r"""Staleness-scaled learning rate: :math:`w \leftarrow w - \frac{\eta}{K} \sum_i \frac{1}{\tau_i} g_i`, with
    :math:`\tau_i = t - o + 1` (the polynomial staleness weight with exponent 1), under K-async rounds.

    **Step length.** With all :math:`N` clients training and :math:`K` updates per version, an update is
    :math:`\tau \approx N/K` versions stale, so an aggregation moves the model by about :math:`K/N` of an averaged
    update: one averaged update per generation of :math:`N` jobs, the step synchronous SGD would take (FedBuff and
    TWAFL take one per :math:`K` arrivals). FedHist's authors run it in their K-async form,
    :math:`w \leftarrow w - \eta \sum_i p_i g_i` with :math:`\sum_i p_i = 1` (FedHist's Eq. 4), where it needs
    fewer rounds than FedAvg (their Table 2: 1,904 against 3,340), which the unnormalised step cannot:
    ``normalize=True`` takes that form, :math:`p_i \propto 1/\tau_i`. Measured on the FedHist digits suite (seed
    0, N/K = 10, mean staleness 8.9, 925 versions in 3,000 virtual s): unnormalised 0.20 (the loss moves from 2.306
    to 2.27 and stays on the initial plateau; seeds 0-2: 0.32 +- 0.15), ``server_lr=10`` 0.97, ``normalize=True``
    0.97 (seeds 0-2: 0.95 +- 0.02, 0.8 after 1,489 +- 147 virtual s); the suite runs ``normalize=True``.

    Args:
        k: Updates per aggregation :math:`K` (:class:`~lit_asyncfl.schedulers.KAsync`'s ``k``, the aggregation's
            ``buffer_size``).
        server_lr, normalize: The aggregation's (:class:`~lit_asyncfl.server.DeltaAverage`'s arguments, see there;
            ``normalize=True`` divides by :math:`\sum_i 1/\tau_i`, FedHist's K-async form).

    Example:
        >>> DynSGD(k=5).aggregator.buffer_size, DynSGD(normalize=True).aggregator.normalize
        (5, True)
    """

    def __init__(self, k: int = K, server_lr: float = SERVER_LR, normalize: bool = NORMALIZE) -> None:
        hparams = hyperparameters(locals())
        check_int("k", k, 1)  # also the buffer size: a count, not a fraction
        super().__init__(
            scheduler=KAsync(k),
            aggregator=DeltaAverage(buffer_size=k, server_lr=server_lr, normalize=normalize),
            server_callbacks=[StalenessWeight("polynomial", a=1.0)],
            hparams=hparams,
        )
