"""PORT (Su & Li, IWQoS 2022): semi-asynchronous, similarity- and staleness-weighted, stragglers forced to move on."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_int
from lit_asyncfl.schedulers.buffered_concurrency import CONCURRENCY, BufferedConcurrency
from lit_asyncfl.server.aggregators import DataSizeWeight, ModelAverage
from lit_asyncfl.server.similarity_weight import (
    BOUND,
    SIMILARITY_WEIGHT,
    STALENESS_WEIGHT,
    SimilarityStalenessWeight,
)


class PORT(Algorithm):
    r"""PORT (Su & Li, 2022): aggregate every ``M`` arrivals, weighted by data size, similarity and staleness.

    .. math:: w_{t+1} = w_t + \sum_{i=1}^{M} \frac{p_i}{\sum_j p_j} (w_i - w_t), \qquad
        p_i = n_i \Big( \omega_{sim} \frac{1 + \cos(w_t - w_{t-1},\, w_i - w_t)}{2}
        + \omega_{st} \frac{b}{\tau_i + b}\Big)

    i.e. the :math:`p_i`-weighted mean of the :math:`M` buffered client models (the similarity is 1 for
    :math:`\tau_i \le 1`). ``concurrency`` clients are selected at a time; a buffered client holds its place until
    the aggregation, which then selects new ones. A client still training when an aggregation leaves it more than
    :math:`b` versions behind is made to stop and restart from the new global model.
    Composition: :class:`~lit_asyncfl.schedulers.BufferedConcurrency`, a
    :class:`~lit_asyncfl.server.ModelAverage` of ``M`` with :class:`~lit_asyncfl.server.DataSizeWeight` and
    :class:`~lit_asyncfl.server.SimilarityStalenessWeight`.

    Resolutions:

    * **Weights** as the authors' code (``examples/async/port/port_server.py`` in github.com/TL-System/plato, where
      Su's PORT was released): the data-size weight times the *sum* :math:`\omega_{sim} sim + \omega_{st} b/(\tau+b)`,
      normalised over the round; the update direction is the client model minus the *current* global model (Plato's
      deltas are taken against the server's model at aggregation), the global direction the last global step.
    * **Stragglers**: Plato's ``request_update`` asks a client more than :math:`b` versions behind for the model of its
      last completed local epoch and aggregates that partial model. Jobs here train their whole local epochs at once
      (and with one local epoch there is no completed epoch to send), so such a straggler *abandons* its job (its
      work is lost) and pulls the latest model; the staleness of an aggregated update is thus at most :math:`b + 1`.
      Plato's alternative without ``request_update`` (waiting for the straggler) is not implemented.
    * **One bound** :math:`b` for the staleness factor and for the forced restarts, as Plato's one ``staleness_bound``.
    * **Defaults** from the authors' PORT configuration (``port_cifar10.yml``, 100 clients): :math:`b = 10`,
      :math:`\omega_{sim} = 1`, :math:`\omega_{st} = 3`, 30 clients selected (``per_round``), aggregation at
      :math:`M = 15` arrivals (``minimum_clients_aggregated``). FedASMU's comparison runs every method at 10%
      parallelism: there (``configs/compare/fedasmu_table1.yaml``) ``concurrency=0.1`` and ``buffer_size=5`` keep the
      authors' ratio :math:`M` = half the selected clients.

    Sources: the authors' Plato code and configuration (``port_server.py``, ``port_cifar10.yml``,
    ``plato/servers/base.py``: ``minimum_clients_aggregated``, ``staleness_bound``, ``request_update``) and Plato's
    documentation of PORT; the paper itself was not available offline.

    Memory: the buffer of ``M`` models and one model-sized last global step.

    Args:
        buffer_size: Arrivals per aggregation :math:`M`.
        concurrency: Clients selected at once, at least ``buffer_size``
            (:class:`~lit_asyncfl.schedulers.BufferedConcurrency`'s argument, see there).
        staleness_bound, similarity_weight, staleness_weight: :math:`b`, :math:`\omega_{sim}` and
            :math:`\omega_{st}` (:class:`~lit_asyncfl.server.SimilarityStalenessWeight`'s ``bound``,
            ``similarity_weight`` and ``staleness_weight``, see there; :math:`b` also bounds the stragglers).

    Example:
        >>> algo = PORT()
        >>> algo.aggregator.buffer_size, algo.scheduler.max_staleness
        (15, 10)
    """

    def __init__(
        self,
        buffer_size: int = 15,  # the authors' minimum_clients_aggregated (ModelAverage's default: wait for a flush)
        concurrency: int | float = CONCURRENCY,
        staleness_bound: int = BOUND,
        similarity_weight: float = SIMILARITY_WEIGHT,
        staleness_weight: float = STALENESS_WEIGHT,
    ) -> None:
        hparams = hyperparameters(locals())
        check_int("buffer_size", buffer_size, 1)
        check_int("staleness_bound", staleness_bound, 1)
        super().__init__(
            scheduler=BufferedConcurrency(concurrency, max_staleness=staleness_bound),
            aggregator=ModelAverage(buffer_size=buffer_size),
            server_callbacks=[
                DataSizeWeight(),
                SimilarityStalenessWeight(staleness_bound, similarity_weight, staleness_weight),
            ],
            hparams=hparams,
        )
