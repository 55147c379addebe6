"""ASFL (Chen et al., ICPP 2023): semi-asynchronous rounds steered by a soft actor-critic."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import hyperparameters
from lit_asyncfl.algorithms.semi_async import SemiAsyncAlgorithm, round_settings
from lit_asyncfl.rl.controllers import RoundController, SACController
from lit_asyncfl.schedulers.selection import UtilitySelection
from lit_asyncfl.schedulers.semi_async import ALPHA_PREF, BETA_PREF, MAX_LATENCY, REWARD, ROUNDS, SELECTED
from lit_asyncfl.server.staleness_decay import DECAY


class ASFL(SemiAsyncAlgorithm):
    r"""Adaptive semi-asynchronous FL: the ``S`` devices of largest utility :math:`n_i \sqrt{\bar\ell_i}` (unseen
    first) get the model each round; a controller picks the number of aggregated devices ``M_k`` and the lag
    tolerance ``tau_k``; stale models are decayed toward the global one (:math:`c^{s_i}`).

    The controller is a :class:`~lit_asyncfl.rl.controllers.SACController` acting from a trained ``policy``
    (train one with ``scripts/train_asfl.py``) or, with ``controller=FixedAction(M, tau)``, a fixed action.

    Where the paper's Table 4 reproduces here (task II on digits, ``configs/compare/asfl_table4.yaml``, three
    seeds no policy saw; the table is on the benchmarks page): ASFL's objective beats SAFA's, as in the paper,
    but not FedCS's or Oort's, which the paper reports 23% and 15% below ASFL. Three measured reasons:

    * **FedCS keeps to the budget.** As the paper describes it, FedCS drops at selection every device slower than
      :math:`T_{max}/K`, so its 50 rounds fit the limit (4,264 ± 352 virtual s of 5,000) while it waits for every
      selected device, and it ends with the best objective. The paper's latencies (FedCS 8x slower than ASFL on
      task II, up to 19x on task III) mean that its FedCS overran the limit several times; that is not what the
      rule it states does.
    * **The shipped policies are trained less.** ``configs/asfl/policies/digits_cnn.pt`` learned from 200 episodes
      at Adam's rate 3e-4; the paper trains 600 episodes at 1e-6 (its Table 3). Retraining with the paper's
      settings takes about 100 minutes of CPU (10 s per episode) and was not done; neither shipped policy's
      learning curve (``*.episodes.csv``) still rises clearly at episode 200.
    * **The per-round reward favours fast rounds.** Eq. 8 pays :math:`(T_{lim}/T)^\alpha` every round, and
      :math:`T_{lim}` grows as the budget goes unspent, so the policy trained on it picks ``M = 2`` in about half
      of the rounds and gives up accuracy the final objective values more; ``reward="objective_gain"`` (the
      per-round change of the objective, summing to the run's objective) gives a better policy (objective 0.91
      against 0.84), still below the best fixed action (0.94).

    Args:
        controller: ``(M_k, tau_k)`` chooser (default: ``SACController(policy=policy)``).
        policy: Policy file for the default controller (``None``: an untrained, randomly initialised agent).
        selected, rounds, max_latency, alpha_pref, beta_pref, reward: The rounds'
            (:class:`~lit_asyncfl.schedulers.SemiAsyncRounds`'s arguments, see there; ``reward`` is what a training
            controller learns from).
        decay: Staleness decay :math:`c` (:class:`~lit_asyncfl.server.StalenessDecay`'s, see there).

    Example:
        >>> from lit_asyncfl.rl import FixedAction
        >>> ASFL(controller=FixedAction(3, 2), selected=6, rounds=50).scheduler.controller.act([0.0] * 5)
        (3, 2)
    """

    def __init__(
        self,
        controller: RoundController | None = None,
        policy: str | None = None,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
        decay: float = DECAY,
        reward: str = REWARD,
    ) -> None:
        hparams = hyperparameters(locals())
        if controller is not None and policy is not None:
            raise ValueError("give either controller or policy (the default controller's policy file), not both")
        super().__init__(
            controller=controller if controller is not None else SACController(policy=policy),
            selection=UtilitySelection(),
            hparams=hparams,
            **round_settings(hparams),
        )
