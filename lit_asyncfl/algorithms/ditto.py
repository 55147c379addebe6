"""Ditto (Li, Hu, Beirami & Smith, ICML 2021): a personal model per client next to FedAvg's or FedAsync's global
model."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.algorithms.modes import with_mode
from lit_asyncfl.client_callbacks.personal import PersonalModel


class Ditto(Algorithm):
    r"""Fair and robust federated learning through personalization (Li, Hu, Beirami & Smith, ICML 2021).

    The global model :math:`w` is trained as FedAvg trains it (each job's ordinary local update of :math:`w^t`,
    averaged by the server); each client :math:`k` also keeps a personal model :math:`v_k`, never uploaded, and in
    every job takes :math:`s` local steps on

    .. math:: \min_{v_k}\; F_k(v_k) + \frac{\lambda}{2} \lVert v_k - w^t \rVert^2

    from its stored :math:`v_k` (:math:`w^t` at its first job), :math:`w^t` the global model the job started from
    (Algorithm 1; :class:`~lit_asyncfl.client_callbacks.PersonalModel`, the :math:`v_k` in the run's
    :class:`~lit_asyncfl.core.client_state.ClientStateStore`). The global weights are exactly FedAvg's (FedAsync's
    with ``asynchronous=True``). Evaluate the personal models with
    :class:`~lit_asyncfl.callbacks.PerClientEvaluation` (the ``personal_`` keys: each client's :math:`v_k` on its
    held-out samples, the global model for a client that never trained).

    Synchronous (default): FedAvg's rounds and data-size-weighted average, as the paper. Asynchronous
    (``asynchronous=True``): FedAsync's composition (keep-concurrency dispatch, mixing with the polynomial
    staleness weight); :math:`w^t` is then the (possibly stale) global model the client downloaded::

        Ditto(lam=1.0, asynchronous=True, alpha=0.6, concurrency=0.1)

    Resolutions:

    * **Default** :math:`\lambda = 1`: the value of the authors' run scripts (``--lam=1`` in
      github.com/litian96/ditto ``run_*_ditto_lam1.sh``); the paper tunes :math:`\lambda` in
      :math:`\{0.05, 0.1, 0.2, 0.5, 1, 2\}` per data set.
    * **Personal steps**: as many as the job's global update (``steps=None``, the authors' ``local_iters`` for both),
      on the same mini-batches, with the module's own optimizer; see
      :class:`~lit_asyncfl.client_callbacks.PersonalModel` for the rest.
    * Mode-specific arguments given in the other mode are refused.

    Memory: one model copy per client that has trained (the store), one module copy for the personal steps.

    Args:
        lam: :math:`\lambda \ge 0`.
        steps: Personal steps :math:`s` per job; ``None``: the job's own number.
        asynchronous, clients_per_round, round_deadline, alpha, concurrency: The mode: ``asynchronous=True`` for
            FedAsync-style asynchronous aggregation instead of synchronous rounds; the other four are
            :class:`~lit_asyncfl.algorithms.FedAvg`'s (synchronous) and :class:`~lit_asyncfl.algorithms.FedAsync`'s
            (asynchronous) arguments, see there (``None``: their defaults).

    Example:
        >>> ditto = Ditto(lam=0.5)
        >>> ditto.client_callbacks[0].lam, type(ditto.scheduler).__name__
        (0.5, 'SynchronousRounds')
        >>> type(Ditto(asynchronous=True).aggregator).__name__
        'Mixing'
    """

    def __init__(
        self,
        lam: float = 1.0,
        steps: int | None = None,
        asynchronous: bool = False,
        clients_per_round: int | float | None = None,
        round_deadline: float | None = None,
        alpha: float | None = None,
        concurrency: int | float | None = None,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(**with_mode(hparams, PersonalModel(lam=lam, steps=steps)))
