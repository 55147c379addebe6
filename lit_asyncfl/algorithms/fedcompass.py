"""FedCompass (Li et al., ICLR 2024): a computing-power-aware scheduler that makes groups of clients arrive together."""

from __future__ import annotations

from lit_asyncfl.algorithms.base import Algorithm, hyperparameters
from lit_asyncfl.schedulers.compass import LATEST_TIME_FACTOR, Q_MAX, Q_MIN, SPEED_MOMENTUM, CompassScheduler
from lit_asyncfl.server.grouped import ALPHA, LATEST_PER_CLIENT, STALENESS_EXPONENT, GroupedDeltaStep


class FedCompass(Algorithm):
    r"""Semi-asynchronous FL with the Compass scheduler (Li et al., 2024): per-client numbers of local steps
    :math:`Q_i \in [Q_{min}, Q_{max}]` so that the clients of an arrival group reach the server together, and one
    global update per group.

    .. math:: \hat v_i \leftarrow (1 - m)\, \hat v_i + m\, \frac{T_i}{Q_i}, \qquad
        Q_i = \Big\lfloor \frac{T^{exp}_g - now}{\hat v_i} \Big\rfloor, \qquad
        w \leftarrow w + \sum_{i \in \mathcal{G}} \frac{\alpha\, (\tau_i + 1)^{-a}}{N} \Delta_i

    :math:`T_i` is the virtual time from a job's dispatch to its arrival, :math:`T^{exp}_g` the expected arrival
    of the group client :math:`i` joins, :math:`\mathcal{G}` a group's updates plus the late ones buffered since,
    :math:`\tau_i` their staleness at the aggregation, :math:`\Delta_i = w_i - w_{o_i}`, :math:`N` the number of
    clients. Composition: :class:`~lit_asyncfl.schedulers.compass.CompassScheduler` (groups, steps, when to
    aggregate) and :class:`~lit_asyncfl.server.grouped.GroupedDeltaStep` (the update); jobs carry their own number
    of local steps (``ClientJob.local_steps``), which every engine runs and the device model times.

    Resolutions:

    * **Schedule**: as the authors' ``CompassScheduler`` (APPFL), in virtual time: a client's first update is
      aggregated alone at once; joining picks the group reachable with the most steps (ties: the later group);
      a new group's steps aim at the next arrival of the fastest member of an open group; a group is aggregated
      on its last arrival or at its latest arrival time (a timer), its arrived members restarting fastest first;
      a late update waits in the general buffer for the next group aggregation while its client restarts at once.
    * **One update per client per aggregation**: APPFL keys its buffers by client, so of two late updates of one
      client only the newer is aggregated, and a late update is dropped when the same client's update to the group
      being aggregated comes with it; the same here (counted as discarded, reason ``"superseded"``).
      ``latest_per_client=False`` aggregates every update.
    * **Update** in the authors' ``gradient_based`` form, :math:`w - \alpha s(\tau)/N \cdot (w_o - w_i)` with equal
      weights :math:`1/N` (``weights: equal``) and :math:`s(\tau) = (\tau + 1)^{-a}` (``polynomial``), the
      staleness counted in global versions at the aggregation (the authors' ``global_timestamp``).
    * **Speed** :math:`T_i` includes the job's download and upload (the authors measure wall time between
      sending the model and receiving the update); all clients train (cross-silo).
    * **Devices that come and go** (not in the paper): a client offline when it should restart restarts when it is
      back; a dropped member leaves its group.
    * **Defaults** from the authors' example configuration (APPFL ``server_fedcompass.yaml``): :math:`Q_{min} =
      20`, :math:`Q_{max} = 100`, :math:`m = 0.9`, :math:`\lambda = 1.5`, :math:`\alpha = 0.9`, :math:`a = 0.5`.
      They are counted in local steps (mini-batches): on small shards 100 steps are many epochs, scale them to
      the data (the benchmark suite does).

    **Where it cannot work** (measured): the scheduler relies on each client's time per local step being stable
    (cross-silo devices). Under the FedADT digits suite's devices, each job's time drawn afresh from
    :math:`U(0, 5000)` s whatever the client and its number of steps, the speed estimate predicts nothing: groups do
    not arrive together and arrived members wait for their group's last member or latest time: 103 jobs per client
    in 600,000 virtual s (jobs of 2,510 s on average), the clients training 43% of the time and idle the rest.
    With the :math:`1/N` weights a pass of all :math:`N` clients moves the model by at most :math:`\alpha`
    averaged updates: the run's 479 aggregations add up to :math:`\sum \alpha s(\tau_i)/N = 51` averaged updates
    (FedBuff needs ~280 to reach 0.8 there) and end at 0.25 (seed 0, Dirichlet 0.1, the loss at 2.20). With
    persistent device speeds (the FedASMU suite's ``UniformRatio(5)``, 20,000 s, :math:`Q \in [1, 5]`) it ends at
    0.85 after 1,841 aggregations (251 averaged updates), every client training.

    Sources: the authors' code (APPFL: ``compass_scheduler.py``, ``fedcompass_aggregator.py``, the FedCompass
    repository's ``examples/config/server_fedcompass.yaml``) and the paper's abstract and summaries (the full text
    was not available offline).

    Args:
        q_min, q_max, speed_momentum, latest_time_factor: The scheduler's
            (:class:`~lit_asyncfl.schedulers.CompassScheduler`'s arguments, see there).
        alpha, staleness_exponent, latest_per_client: The aggregation's
            (:class:`~lit_asyncfl.server.GroupedDeltaStep`'s arguments, see there; ``latest_per_client``: APPFL's
            buffers keyed by client).

    Example:
        >>> algo = FedCompass(q_min=2, q_max=8)
        >>> algo.scheduler.q_min, algo.scheduler.q_max, algo.aggregator.alpha
        (2, 8, 0.9)
    """

    def __init__(
        self,
        q_min: int = Q_MIN,
        q_max: int = Q_MAX,
        speed_momentum: float = SPEED_MOMENTUM,
        latest_time_factor: float = LATEST_TIME_FACTOR,
        alpha: float = ALPHA,
        staleness_exponent: float = STALENESS_EXPONENT,
        latest_per_client: bool = LATEST_PER_CLIENT,
    ) -> None:
        hparams = hyperparameters(locals())
        super().__init__(
            scheduler=CompassScheduler(q_min, q_max, speed_momentum, latest_time_factor),
            aggregator=GroupedDeltaStep(alpha, staleness_exponent, latest_per_client),
            hparams=hparams,
        )
