"""REFL (Abdelmoniem et al., EuroSys 2023): stale-aware aggregation and availability-prioritized selection."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.availability.prediction import CONFIDENCE, SessionPredictor
from lit_asyncfl.checks import check_bool
from lit_asyncfl.schedulers.deadline_rounds import (
    CLIENTS_PER_ROUND,
    DEADLINE,
    AvailabilityPrioritySelection,
    DeadlineRounds,
)
from lit_asyncfl.schedulers.selection import RandomSelection
from lit_asyncfl.server.stale_aware import BETA, SCALE, StaleAwareAverage


class REFL(Algorithm):
    r"""Resource-efficient FL (Abdelmoniem et al., 2023): rounds with a deadline whose stragglers are not wasted
    (stale-aware aggregation, SAA) and participants chosen among the devices predicted to leave soon (intelligent
    participant selection, IPS).

    .. math::
        w \leftarrow w + \frac{\sum_{i \in F} \Delta_i + \sum_{c \in S} \Lambda_c \Delta_c}{|F| + \sum_{c \in S}
        \Lambda_c}, \qquad
        \Lambda_c = \frac{1 - \beta}{\tau_c + 1} + \beta \Big(1 - \frac{e^{-r_c / r_{max}}}{s}\Big), \qquad
        r_c = \frac{\|\Delta_c - \bar\Delta_F\|^2}{(|F| + 1)^2 \|\bar\Delta_F\|^2}

    :math:`F` are the round's fresh updates, :math:`S` the stale ones (stragglers of earlier rounds that arrived
    during it), :math:`\tau_c` their lateness in versions. Composition:
    :class:`~lit_asyncfl.schedulers.deadline_rounds.DeadlineRounds` (rounds of ``deadline`` seconds, stragglers
    kept training, recently used devices passed over),
    :class:`~lit_asyncfl.schedulers.deadline_rounds.AvailabilityPrioritySelection` reading a
    :class:`~lit_asyncfl.availability.prediction.SessionPredictor` fed only with what the server observed (who is
    online at each round start, which jobs were lost to a device going offline), and
    :class:`~lit_asyncfl.server.stale_aware.StaleAwareAverage` (SAA).

    Resolutions:

    * **Availability prediction**: the authors' IPS asks an oracle (the behaviour trace's future, right with a set
      probability, standing for a time-series model). Here the predictor learns each device's rate of going offline
      from the observed history and predicts exponential sessions; a device is prioritized when it likely stays
      for the coming round but not for the next (the authors' two look-ahead slots of a round each). With devices
      that never leave it prioritizes nobody: the selection is random.
    * **SAA on deltas**: the authors' code averages models; the stale updates here are deltas from their own start
      model (the update's meaning when the global model has moved), averaged with the fresh ones as written above.
      The deviation ratio is the authors' ``val1 / val2`` with deltas for models.
    * **Rounds**: the authors' ``exp_type 0`` (a fixed deadline per round, no round failure); a round without fresh
      updates keeps its stale ones for the next (the authors skip it); :math:`\tau_c` counts versions (rounds that
      aggregated), and is taken at the aggregation.
    * **Deadline in virtual seconds**: the authors' 100 s is measured on FedScale's clock (REFL is built on FedScale),
      whose job durations come from real devices' compute and network traces for their models and datasets; here it
      is reused as virtual seconds of this run's device model, whose job durations differ. What the deadline means
      is the share of a round's jobs that finish by it (the rest become stale updates), so set ``deadline`` from
      the device model's job durations (its ``job_timing`` for the run's shards, e.g. a percentile of their
      totals) rather than reading 100 s as the paper's setting.
    * **Re-selection**: devices still training (stragglers) are never selected; a device that trained in the last
      ``prohibit_reselect`` rounds is passed over while enough others are available (the authors replace such picks
      at random among online devices).
    * **Defaults** from the authors' REFL settings (``run_exps.sh``, ``argParser.py``): 10 devices per round,
      deadline 100 s, :math:`\beta = 0.35`, :math:`s = 1` (``scalecoff=1``), ``prohibit_reselect = 5``, uniform
      weights.

    **Rounds within a budget** (measured): SAA averages, so a round moves the model by about one averaged client
    update whatever the number of participants, and a round lasts the deadline. On the FedHist digits suite (seed 0;
    10 devices a round, deadline 40 s, 3,000 virtual s) that is 75 rounds (741 jobs, against 9,470 for FedHist with
    every client training): the loss moves from 2.306 to 2.281 and the accuracy stays at 0.10. 100 devices a round
    leave it there (75 rounds, 5,256 jobs); a 16 s deadline gives 153 rounds and 0.42, 10 s 184 rounds and 0.52.
    With ten times the budget (30,000 s, 749 rounds) it reaches 0.8 at round 225 and ends at 0.97 (seeds 0-2:
    0.8 after 208 +- 29 rounds, final 0.975 +- 0.006): per aggregation it keeps pace with FedHist (0.8 after
    333 +- 101 versions), in virtual time it is slower because a
    K-async aggregation comes every ~3 s with all clients training (FedHist's authors compare methods in rounds).

    Sources: the authors' code (github.com/ahmedcs/REFL: ``core/aggregator.py`` ``update_importance``,
    ``core/client_manager.py`` ``resampleClients``/``getPriority``, ``run_exps.sh``) and the paper's abstract (the
    full text was not available offline).

    Args:
        clients_per_round, deadline, prohibit_reselect: The rounds' devices, duration (virtual seconds) and
            rounds during which a device that trained is passed over
            (:class:`~lit_asyncfl.schedulers.DeadlineRounds`'s arguments, see there).
        beta, scale: SAA's :math:`\beta` and :math:`s` (:class:`~lit_asyncfl.server.StaleAwareAverage`'s arguments,
            see there).
        confidence: The predictor's probability threshold
            (:class:`~lit_asyncfl.availability.SessionPredictor`'s, see there).
        ips: Prioritize devices predicted to leave soon (``False``: random selection, REFL's SAA alone).

    Example:
        >>> algo = REFL()
        >>> algo.scheduler.deadline, algo.aggregator.beta, type(algo.scheduler.selection).__name__
        (100.0, 0.35, 'AvailabilityPrioritySelection')
    """

    def __init__(
        self,
        clients_per_round: int | float = CLIENTS_PER_ROUND,
        deadline: float = DEADLINE,
        beta: float = BETA,
        scale: float = SCALE,
        prohibit_reselect: int = 5,  # the authors' setting (DeadlineRounds' default: no such rule)
        confidence: float = CONFIDENCE,
        ips: bool = True,
    ) -> None:
        hparams = hyperparameters(locals())
        check_bool("ips", ips)
        predictor = SessionPredictor(confidence)
        selection = AvailabilityPrioritySelection(predictor) if ips else RandomSelection()
        super().__init__(
            scheduler=DeadlineRounds(clients_per_round, deadline, selection, predictor, prohibit_reselect),
            aggregator=StaleAwareAverage(beta, scale),
            hparams=hparams,
        )
