"""CA2FL (Wang et al., ICLR 2024): FedBuff calibrated by a server cache of every client's latest update."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.algorithms.fedadt import CONCURRENCY
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.server.aggregators import BUFFER_SIZE, SERVER_LR
from lit_asyncfl.server.calibration import CalibratedDeltaAverage
from lit_asyncfl.server.update_cache import CACHE_DTYPE


class CA2FL(Algorithm):
    r"""Cache-aided asynchronous FL (Wang et al., 2024): buffered deltas calibrated by every client's cached delta.

    .. math:: v_t = h_t + \frac{1}{M} \sum_{i \in \mathcal{S}_t} \big(\Delta^i_{t-\tau_i} - h^i_t\big), \qquad
        x_{t+1} = x_t + \eta \, v_t, \qquad h_{t+1} = \frac{1}{N} \sum_{j=1}^{N} h^j_{t+1}

    :math:`\Delta^i = w_i - w_o` is client :math:`i`'s delta, :math:`h^i` the latest delta the server cached for it
    (0 before its first upload; replaced by :math:`\Delta^i` at each arrival), :math:`\mathcal{S}_t` the :math:`M`
    buffered arrivals and :math:`N` the number of clients. The cache mean :math:`h_t` stands in for the clients that
    are not in the buffer, so every client's latest information enters every step (a SAGA-like correction of the
    bias toward fast clients). With an empty cache the first step is FedBuff's
    (:class:`~lit_asyncfl.server.calibration.CalibratedDeltaAverage`).

    Resolutions:

    * :math:`h_t` is the cache mean at the end of the previous aggregation (the algorithm computes :math:`h_{t+1}` after
      the step); :math:`h^i_t` is the client's cached delta at its arrival, so a client that arrives twice within
      one buffer is calibrated by its own earlier upload of that buffer the second time.
    * No staleness weighting and uniform (not data-size) weights, as in the paper's algorithm.
    * **Defaults**: ``M = 10``, :math:`\eta = 1` and 20% of the clients training, FedBuff's defaults here (and the
      buffered baselines' setting of FedADT's Tables I-II), so the two differ only by the calibration.

    Sources: the paper's abstract and reviews (the full text was not available offline) and FLGo's non-official
    implementation (``hs``, ``ht``, ``delta``), which computes the same step.

    Memory: one cached delta per client ever seen, i.e. up to ``N`` model copies (LeNet-5 on digits: 86 KB per
    client in float32); ``cache_dtype="float16"`` (or ``"bfloat16"``) halves it at the cost of rounding the cache
    (float16 refuses a delta beyond 65504). Nothing bounds it but ``N``: at fit start a warning gives the full
    cache's size when it would pass 8 GiB. Deltas enter the cache only with a step the server applied.

    Args:
        buffer_size, server_lr, cache_dtype: The aggregation's :math:`M`, :math:`\eta` and cache storage type
            (:class:`~lit_asyncfl.server.CalibratedDeltaAverage`'s arguments, see there).
        concurrency: Clients training at once (:class:`~lit_asyncfl.schedulers.KeepConcurrency`'s argument, see
            there).

    Example:
        >>> CA2FL(buffer_size=5).aggregator.buffer_size
        5
    """

    def __init__(
        self,
        buffer_size: int = BUFFER_SIZE,
        server_lr: float = SERVER_LR,
        concurrency: int | float = CONCURRENCY,
        cache_dtype: str = CACHE_DTYPE,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            scheduler=KeepConcurrency(concurrency),
            aggregator=CalibratedDeltaAverage(buffer_size, server_lr, cache_dtype),
            hparams=hparams,
        )
