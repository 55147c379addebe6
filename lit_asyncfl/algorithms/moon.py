"""MOON (Li, He & Song, CVPR 2021): model-contrastive federated learning, synchronous or FedAsync-style."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.algorithms.modes import with_mode
from lit_asyncfl.client_callbacks.client_state import ModelContrastive


class MOON(Algorithm):
    r"""Model-contrastive federated learning (Li, He & Song, CVPR 2021).

    Each client minimises :math:`\ell_{task} + \mu\, \ell_{con}` with

    .. math::
        \ell_{con} = -\log \frac{\exp(\mathrm{sim}(z, z_{glob}) / \tau)}
        {\exp(\mathrm{sim}(z, z_{glob}) / \tau) + \exp(\mathrm{sim}(z, z_{prev}) / \tau)}

    (:class:`~lit_asyncfl.client_callbacks.ModelContrastive`): :math:`z` the representation of the batch by the local
    model, :math:`z_{glob}` by the global model the job started from, :math:`z_{prev}` by the client's previous local
    model, kept per client in the run's :class:`~lit_asyncfl.core.client_state.ClientStateStore` (in memory up to
    ``FederatedTrainer(client_state_budget=...)``, on disk beyond). The module must define ``representation(x)``
    (the bundled models do); one without it is refused at fit start.

    Synchronous (default): FedAvg's rounds and data-size-weighted average, as the paper. Asynchronous
    (``asynchronous=True``): FedAsync's composition (keep-concurrency dispatch, mixing
    :math:`w \leftarrow (1 - \alpha_t) w + \alpha_t w_i` with the polynomial staleness weight, :math:`a = 0.5`), the
    way asynchronous papers (FedHist, FedASMU) run MOON as a baseline; :math:`z_{glob}` is then the (possibly
    stale) global model the client downloaded.

    Resolutions:

    * **First job of a client**: no previous model, the term is zero (the authors' first round has an empty model
      pool, see :class:`~lit_asyncfl.client_callbacks.ModelContrastive`); one previous model per client (the authors'
      ``model_buffer_size=1``). This equals the authors' code only when every client trains in the first round
      (their main experiments: 10 parties, all sampled). With partial participation their pool holds, after round
      1, every party's network, so a client first sampled in a later round contrasts with its own never-trained,
      independently initialised network; that term pushes away from an arbitrary random model and is an artefact of
      their bookkeeping, not of the method, so it is not reproduced.
    * **Representation** :math:`z`: the input of the bundled models' classifier layer (the paper adds a projection
      head; the models are not changed).
    * **Defaults** :math:`\tau = 0.5`, :math:`\mu = 1` (the authors' code defaults; the paper uses :math:`\mu = 5`
      on CIFAR-10 and 1 on CIFAR-100 and Tiny-ImageNet).
    * Mode-specific arguments given in the other mode are refused.

    **Few local steps** (measured): the term pushes :math:`z` away from the client's previous local model. MOON
    trains 10 local epochs a round, so that model has drifted from the global one; with one or two local steps a
    job (E = 1 on a digits shard of ~14 images) the previous model is about the global model plus the client's own
    last step on the same data, and the term's gradient opposes the task gradient: at LeNet-5's initialisation, on
    ten digits clients, cosine -0.36 to -0.54 with a norm of 0.26-0.37 of the task gradient's (-0.48 to -0.81
    after 300 steps). On the FedASMU digits suite (seed 0, 143 rounds of 10 clients, E = 1) the global loss rises
    from 2.31 to 2.38 by round 50 (FedAvg's: 2.30) and MOON ends at 0.53 against FedAvg's 0.80 (``mu=0`` repeats
    FedAvg's run exactly; seeds 0-2: 0.57 +- 0.13 against 0.80 +- 0.01, FedAvg itself limited by the 143 rounds
    the budget holds); with E = 5 (35 rounds) 0.67 against 0.76. Asynchronous with every client in flight
    (FedHist suite, seed 0): 0.17, against 0.31 with ``mu=0``, which is FedAsync's mixing at a staleness of ~98
    versions (see FedAsync).

    Sources: the authors' code (github.com/QinbinLi/MOON: ``main.py``, ``train_net_fedcon``) and the paper's loss.

    Memory: one model copy per client that has trained (the store), two module copies in the training process.

    Args:
        mu: Weight :math:`\mu \ge 0` of the contrastive term (0: FedAvg / FedAsync).
        tau: Temperature :math:`\tau > 0`.
        asynchronous, clients_per_round, round_deadline, alpha, concurrency: The mode: ``asynchronous=True`` for
            FedAsync-style asynchronous aggregation instead of synchronous rounds; the other four are
            :class:`~lit_asyncfl.algorithms.FedAvg`'s (synchronous) and :class:`~lit_asyncfl.algorithms.FedAsync`'s
            (asynchronous) arguments, see there (``None``: their defaults).

    Example:
        >>> moon = MOON(mu=5.0)
        >>> moon.client_callbacks[0].mu, type(moon.scheduler).__name__
        (5.0, 'SynchronousRounds')
        >>> type(MOON(asynchronous=True).aggregator).__name__
        'Mixing'
    """

    def __init__(
        self,
        mu: float = 1.0,
        tau: float = 0.5,
        asynchronous: bool = False,
        clients_per_round: int | float | None = None,
        round_deadline: float | None = None,
        alpha: float | None = None,
        concurrency: int | float | None = None,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(**with_mode(hparams, ModelContrastive(mu=mu, tau=tau)))
