"""SAFA (Wu et al., IEEE TC 2020) as ASFL compares with it."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import DECAY, SemiAsyncAlgorithm, round_settings
from lit_asyncfl.rl.controllers import FixedAction
from lit_asyncfl.schedulers.selection import RandomSelection
from lit_asyncfl.schedulers.semi_async import ALPHA_PREF, BETA_PREF, MAX_LATENCY, ROUNDS, SELECTED


class SAFA(SemiAsyncAlgorithm):
    r"""Semi-asynchronous rounds with a fixed quota ``M`` and lag tolerance ``tau``: ``S`` random devices get the
    model; a round lasts until every device could have reported (:math:`T_{dist}^k + \max_i (T^{cmp}_i + T^U_i)`);
    the first ``M`` arrivals are aggregated, the later ones cached and aggregated in the next round.

    Args:
        num_picked: Quota ``M`` (5 in ASFL's comparison).
        lag_tolerance: Lag tolerance ``tau`` (2).
        selected, rounds, max_latency, alpha_pref, beta_pref: The rounds'
            (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`'s arguments, see there;
            ``max_latency`` counts in the objective only).
        decay: Staleness decay :math:`c`.

    Example:
        >>> SAFA().scheduler.deadline
        True
    """

    def __init__(
        self,
        num_picked: int = 5,
        lag_tolerance: int = 2,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
        decay: float = DECAY,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            controller=FixedAction(num_picked, lag_tolerance),
            selection=RandomSelection(),
            deadline=True,
            hparams=hparams,
            **round_settings(hparams),
        )
