"""FedAvgM (Hsu, Qi & Brown, 2019): FedAvg with server momentum, synchronous or buffered asynchronous."""

from __future__ import annotations

from functools import partial

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.algorithms.fedbuff import FedBuff
from lit_asyncfl.algorithms.modes import rounds_or
from lit_asyncfl.server.adaptive_optimizer import MOMENTUM, MOMENTUM_SERVER_LR, ServerMomentum

#: FedBuff's composition without its staleness weighting and with :math:`\eta_g = 1`: the momentum takes the step.
_BUFFERED = partial(FedBuff, server_lr=1.0, staleness_weighting=False)


class FedAvgM(Algorithm):
    r"""Federated averaging with server momentum (Hsu et al., 2019).

    .. math::
        \Delta_t = \sum_{k} \frac{n_k}{\sum_j n_j} w_k - w_t, \qquad
        v_t = \beta v_{t-1} + \Delta_t, \qquad w_{t+1} = w_t + \eta v_t

    Synchronous (default): FedAvg's rounds (a fraction of clients, averaged by data size) give :math:`\Delta_t`.
    Asynchronous (``asynchronous=True``): FedBuff's buffered composition, :math:`\Delta_t` the mean of the last
    ``buffer_size`` arriving changes :math:`w_i - w_{o}` (unweighted), under keep-concurrency dispatch. Either way a
    :class:`~lit_asyncfl.server.adaptive_optimizer.ServerMomentum` (the generalised server optimizer of FADAS) takes
    the step.

    Resolutions:

    * **Momentum form**: Hsu et al.'s :math:`v \leftarrow \beta v + \Delta w`, :math:`w \leftarrow w - v` (their
      :math:`\Delta w` is the negative of our :math:`\Delta_t`), with a server rate :math:`\eta` (1 in the paper).
      MOON's authors' FedAvgM damps the buffer, :math:`v \leftarrow \beta v + (1 - \beta) \Delta`: that is
      ``server_lr = 1 - momentum`` here.
    * **Defaults**: :math:`\beta = 0.9`, :math:`\eta = 1` (the paper's main setting; it reports the effective rate
      :math:`\eta / (1 - \beta)` as what matters, so lower the clients' or the server's rate if a run diverges).
    * **Asynchronous variant**: not in the paper (FedADT's baseline list names FedAvgM without saying how it ran
      asynchronously); the buffered form is FedBuff's aggregation with the momentum step, no staleness weighting.
    * Mode-specific arguments given in the other mode are refused (e.g. ``buffer_size`` with synchronous rounds).

    Sources: the paper's algorithm as summarised in its abstract and FL surveys; MOON's authors' code
    (github.com/QinbinLi/MOON, ``main.py``, ``--server_momentum``) for the damped variant.

    Memory: one model-sized momentum buffer (plus the asynchronous buffer).

    Args:
        server_lr, momentum: The server step's :math:`\eta` and :math:`\beta` (0: FedAvg / FedBuff)
            (:class:`~lit_asyncfl.server.ServerMomentum`'s arguments, see there).
        asynchronous: Buffered asynchronous aggregation instead of synchronous rounds.
        clients_per_round, round_deadline: Synchronous: :class:`~lit_asyncfl.algorithms.FedAvg`'s arguments, see
            there (``None``: its defaults).
        buffer_size, concurrency: Asynchronous: :class:`~lit_asyncfl.algorithms.FedBuff`'s arguments, see there
            (``None``: its defaults).

    Example:
        >>> FedAvgM().server_callbacks[-1].momentum
        0.9
        >>> type(FedAvgM(asynchronous=True).aggregator).__name__
        'DeltaAverage'
    """

    def __init__(
        self,
        server_lr: float = MOMENTUM_SERVER_LR,
        momentum: float = MOMENTUM,
        asynchronous: bool = False,
        clients_per_round: int | float | None = None,
        round_deadline: float | None = None,
        buffer_size: int | None = None,
        concurrency: int | float | None = None,
    ) -> None:
        hparams = hyperparameters(locals())
        base = rounds_or(hparams, ("buffer_size", "concurrency"), _BUFFERED)
        super().__init__(
            scheduler=base.scheduler,
            aggregator=base.aggregator,
            server_callbacks=[*base.server_callbacks, ServerMomentum(server_lr=server_lr, momentum=momentum)],
            hparams=hparams,
        )
