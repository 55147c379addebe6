"""FedProx (Li et al., 2020)."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.fedavg import FedAvg
from lit_asyncfl.client_callbacks.base import MU, ProximalTerm
from lit_asyncfl.schedulers.rounds import CLIENTS_PER_ROUND


class FedProx(FedAvg):
    r"""FedAvg whose clients minimise :math:`F_k(w) + \frac{\mu}{2} \lVert w - w_t \rVert^2`.

    Args:
        mu: Proximal coefficient :math:`\mu` (:class:`~lit_asyncfl.client_callbacks.ProximalTerm`'s, see there;
            ``mu=0`` is FedAvg).
        clients_per_round, round_deadline: :class:`~lit_asyncfl.algorithms.FedAvg`'s arguments, see there.

    Example:
        >>> FedProx(mu=0.1).client_callbacks[0].mu
        0.1
    """

    def __init__(
        self, mu: float = MU, clients_per_round: int | float = CLIENTS_PER_ROUND, round_deadline: float | None = None
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(clients_per_round=clients_per_round, round_deadline=round_deadline)
        self.client_callbacks = [ProximalTerm(mu)]
        self.hparams = hparams
