"""SAFA (Wu et al., IEEE TC 2020) as ASFL compares with it."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm
from lit_asyncfl.rl.controllers import FixedAction
from lit_asyncfl.schedulers.selection import RandomSelection


class SAFA(SemiAsyncAlgorithm):
    r"""Semi-asynchronous rounds with a fixed quota ``M`` and lag tolerance ``tau``: ``S`` random devices get the
    model; a round lasts until every device could have reported (:math:`T_{dist}^k + \max_i (T^{cmp}_i + T^U_i)`);
    the first ``M`` arrivals are aggregated, the later ones cached and aggregated in the next round.

    Args:
        num_picked: Quota ``M`` (5 in ASFL's comparison).
        lag_tolerance: Lag tolerance ``tau`` (2).
        selected: Devices selected per round ``S``.
        rounds: Rounds ``K``.
        max_latency: Latency limit :math:`T_{max}` (for the objective).
        alpha_pref: Latency preference within the limit.
        beta_pref: Latency preference beyond it.
        decay: Staleness decay :math:`c`.

    Example:
        >>> SAFA().scheduler.deadline
        True
    """

    def __init__(
        self,
        num_picked: int = 5,
        lag_tolerance: int = 2,
        selected: int | float = 10,
        rounds: int = 50,
        max_latency: float = 5000.0,
        alpha_pref: float = 0.07,
        beta_pref: float = 0.09,
        decay: float = 0.9,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            controller=FixedAction(num_picked, lag_tolerance),
            selection=RandomSelection(),
            deadline=True,
            selected=selected,
            rounds=rounds,
            max_latency=max_latency,
            alpha_pref=alpha_pref,
            beta_pref=beta_pref,
            decay=decay,
            hparams=hparams,
        )
