"""FedCS (Nishio and Yonetani, ICC 2019) as ASFL compares with it."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm, round_settings
from lit_asyncfl.rl.controllers import FixedAction
from lit_asyncfl.schedulers.selection import DeadlineSelection
from lit_asyncfl.schedulers.semi_async import ALPHA_PREF, BETA_PREF, MAX_LATENCY, ROUNDS, SELECTED


class FedCS(SemiAsyncAlgorithm):
    r"""Synchronous rounds that drop, at selection, every device whose expected latency exceeds :math:`T_{max}/K`;
    up to ``S`` of the rest are chosen at random and all of them are waited for.

    Args:
        selected, rounds, max_latency, alpha_pref, beta_pref: The rounds'
            (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`'s arguments, see there;
            ``max_latency`` also sets the per-round limit :math:`T_{max}/K`).

    Example:
        >>> FedCS(selected=10).scheduler.controller.act([0.0] * 5)
        (None, 0)
    """

    def __init__(
        self,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            controller=FixedAction(num_picked=None, lag_tolerance=0),
            selection=DeadlineSelection(),
            hparams=hparams,
            **round_settings(hparams),
        )
