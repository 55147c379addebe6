"""Oort (Lai et al., OSDI 2021) guided selection, as ASFL compares with it."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm, round_settings
from lit_asyncfl.rl.controllers import FixedAction
from lit_asyncfl.schedulers.selection import OortSelection
from lit_asyncfl.schedulers.semi_async import ALPHA_PREF, BETA_PREF, MAX_LATENCY, ROUNDS, SELECTED


class Oort(SemiAsyncAlgorithm):
    r"""Synchronous rounds over the ``S`` devices of largest Oort utility: statistical utility
    :math:`n_i \sqrt{\bar\ell_i}` times :math:`(T / t_i)^{\alpha}` for devices slower than the preferred round
    duration :math:`T` (default :math:`T_{max}/K`); unexplored devices first.

    Args:
        penalty: System penalty exponent :math:`\alpha` (2).
        preferred_duration: :math:`T` (``None``: :math:`T_{max}/K`).
        selected, rounds, max_latency, alpha_pref, beta_pref: The rounds'
            (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`'s arguments, see there).

    Example:
        >>> Oort(penalty=2.0).scheduler.selection.penalty
        2.0
    """

    def __init__(
        self,
        penalty: float = 2.0,
        preferred_duration: float | None = None,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            controller=FixedAction(num_picked=None, lag_tolerance=0),
            selection=OortSelection(penalty, preferred_duration),
            hparams=hparams,
            **round_settings(hparams),
        )
