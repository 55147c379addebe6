"""The parts ASFL and the baselines it is compared with share: semi-asynchronous rounds on a mobile edge network,
staleness-decayed models averaged by data size."""

from __future__ import annotations

from typing import Any

from lit_asyncfl.algorithms.base import Algorithm
from lit_asyncfl.rl.controllers import RoundController
from lit_asyncfl.schedulers.selection import Selection
from lit_asyncfl.schedulers.semi_async import (
    ALPHA_PREF,
    BETA_PREF,
    MAX_LATENCY,
    ROUNDS,
    SELECTED,
    SemiAsyncRounds,
)
from lit_asyncfl.server.aggregators import ModelAverage
from lit_asyncfl.server.staleness_decay import StalenessDecay
from lit_asyncfl.server.weights import DataSizeWeight

#: The arguments a semi-asynchronous preset passes on to :class:`SemiAsyncAlgorithm` unchanged.
ROUND_SETTINGS = ("selected", "rounds", "max_latency", "alpha_pref", "beta_pref", "decay", "reward")

#: The staleness decay :math:`c` of every semi-asynchronous preset (ASFL's 0.9).
DECAY = 0.9


class SemiAsyncAlgorithm(Algorithm):
    r"""Semi-asynchronous rounds (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`) aggregating
    :math:`w^{k+1} = \sum_{i \in P_k} \frac{n_i}{n_P} \left(c^{s_i} w_i + (1 - c^{s_i}) w_G\right)`.

    Presets (:class:`~lit_asyncfl.algorithms.ASFL`, ``SAFA``, ``FedCS``, ``Oort``) choose the controller, the
    selection and whether rounds have a deadline; the arguments below are theirs too.

    Args:
        controller: Chooses ``(M_k, tau_k)`` each round.
        selection: Chooses the ``S`` devices of a round.
        deadline: SAFA-style rounds (wait for every device, cache late arrivals).
        selected, rounds, max_latency, alpha_pref, beta_pref: The rounds'
            (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`'s arguments, see there).
        decay: Staleness decay :math:`c`.
        reward: What a learning controller learns from (``"round"`` or ``"objective_gain"``, see
            :class:`~lit_asyncfl.schedulers.SemiAsyncRounds`).
        name: Display name.
        hparams: The preset's hyper-parameters.
    """

    def __init__(
        self,
        controller: RoundController,
        selection: Selection,
        deadline: bool = False,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
        decay: float = DECAY,
        reward: str = "round",
        name: str | None = None,
        hparams: dict[str, Any] | None = None,
    ) -> None:
        scheduler = SemiAsyncRounds(
            selected=selected,
            rounds=rounds,
            max_latency=max_latency,
            alpha_pref=alpha_pref,
            beta_pref=beta_pref,
            controller=controller,
            selection=selection,
            deadline=deadline,
            reward=reward,
        )
        super().__init__(
            scheduler=scheduler,
            aggregator=ModelAverage(buffer_size=None),
            server_callbacks=[StalenessDecay(decay), DataSizeWeight()],
            name=name,
            hparams=hparams,
        )


def round_settings(hparams: dict[str, Any]) -> dict[str, Any]:
    """The :data:`ROUND_SETTINGS` among a preset's hyper-parameters, to pass on to :class:`SemiAsyncAlgorithm`.

    Example:
        >>> round_settings({"num_picked": 5, "rounds": 20, "decay": 0.5})
        {'rounds': 20, 'decay': 0.5}
    """
    return {name: hparams[name] for name in ROUND_SETTINGS if name in hparams}
