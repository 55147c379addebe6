"""FedAvg (McMahan et al., 2017)."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.checks import check_number
from lit_asyncfl.schedulers.rounds import CLIENTS_PER_ROUND, SynchronousRounds
from lit_asyncfl.server.aggregators import DataSizeWeight, ModelAverage


class FedAvg(Algorithm):
    r"""Synchronous rounds; sample a fraction ``C`` of clients, wait for all, average weighted by data size.

    .. math:: w_{t+1} = \sum_{k \in S_t} \frac{n_k}{\sum_{j \in S_t} n_j} w_k

    Args:
        clients_per_round, round_deadline: Fraction ``C`` of clients (or a count) per round and the longest round
            in virtual seconds (``None``: wait for every member) (:class:`~lit_asyncfl.schedulers.SynchronousRounds`'s
            ``clients_per_round`` and ``deadline``, see there).

    Example:
        >>> FedAvg(clients_per_round=0.1).name
        'FedAvg'
    """

    def __init__(self, clients_per_round: int | float = CLIENTS_PER_ROUND, round_deadline: float | None = None) -> None:
        hparams = hyperparameters(locals())
        check_number("round_deadline", round_deadline, 0, open_min=True, optional=True, unit=" virtual seconds")
        super().__init__(
            scheduler=SynchronousRounds(clients_per_round, deadline=round_deadline),
            aggregator=ModelAverage(buffer_size=None),
            server_callbacks=[DataSizeWeight()],
            hparams=hparams,
        )
