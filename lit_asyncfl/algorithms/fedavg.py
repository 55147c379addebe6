"""FedAvg (McMahan et al., 2017)."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_number
from lit_asyncfl.schedulers.rounds import SynchronousRounds
from lit_asyncfl.server.aggregators import ModelAverage
from lit_asyncfl.server.weights import DataSizeWeight


class FedAvg(Algorithm):
    r"""Synchronous rounds; sample a fraction ``C`` of clients, wait for all, average weighted by data size.

    .. math:: w_{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{j \in S_t} n_j} w_k

    Args:
        clients_per_round: Fraction ``C`` of clients per round (float in (0, 1]) or a count (int).
        round_deadline: Longest round in virtual seconds: members not back by then are dropped (reason
            ``"deadline"``) and the round aggregates who returned; ``None``: wait for every member (members whose
            device goes offline are dropped either way; see :class:`~lit_asyncfl.schedulers.SynchronousRounds`).

    Example:
        >>> FedAvg(clients_per_round=0.1).name
        'FedAvg'
    """

    def __init__(self, clients_per_round: int | float = 0.1, round_deadline: float | None = None) -> None:
        hparams = hyperparameters(locals())
        check_number("round_deadline", round_deadline, 0, open_min=True, optional=True, unit=" virtual seconds")
        super().__init__(
            scheduler=SynchronousRounds(clients_per_round, deadline=round_deadline),
            aggregator=ModelAverage(buffer_size=None),
            server_callbacks=[DataSizeWeight()],
            hparams=hparams,
        )
