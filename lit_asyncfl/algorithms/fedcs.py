"""FedCS (Nishio and Yonetani, ICC 2019) as ASFL compares with it."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm
from lit_asyncfl.rl.controllers import FixedAction
from lit_asyncfl.schedulers.selection import DeadlineSelection


class FedCS(SemiAsyncAlgorithm):
    r"""Synchronous rounds that drop, at selection, every device whose expected latency exceeds :math:`T_{max}/K`;
    up to ``S`` of the rest are chosen at random and all of them are waited for.

    Args:
        selected: Devices selected per round ``S``.
        rounds: Rounds ``K``.
        max_latency: Latency limit :math:`T_{max}` (also sets the per-round limit :math:`T_{max}/K`).
        alpha_pref: Latency preference within the limit.
        beta_pref: Latency preference beyond it.

    Example:
        >>> FedCS(selected=10).scheduler.controller.act([0.0] * 5)
        (None, 0)
    """

    def __init__(
        self,
        selected: int | float = 10,
        rounds: int = 50,
        max_latency: float = 5000.0,
        alpha_pref: float = 0.07,
        beta_pref: float = 0.09,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            controller=FixedAction(num_picked=None, lag_tolerance=0),
            selection=DeadlineSelection(),
            selected=selected,
            rounds=rounds,
            max_latency=max_latency,
            alpha_pref=alpha_pref,
            beta_pref=beta_pref,
            hparams=hparams,
        )
