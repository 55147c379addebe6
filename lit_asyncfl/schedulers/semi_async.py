"""Semi-asynchronous rounds over a mobile edge network (ASFL, Chen et al. ICPP 2023; also SAFA, FedCS, Oort).

Round ``k`` (1..K) starts when round ``k-1`` ends:

1. a :class:`~lit_asyncfl.rl.controllers.RoundController` chooses ``(M_k, tau_k)`` from the round state;
2. devices move; the selection picks ``S`` idle devices; they and the devices deprecated at the end of the last
   round receive the global model, all copies done after :math:`T_{dist}^k = (S + m_{syn}^k) G / b_s`; each then
   trains (:math:`T^{cmp}_i`) and uploads (:math:`\\Gamma / b_i^k`);
3. the server waits for the first ``M_k`` arrivals among all devices training (new and asynchronous; an
   asynchronous device that finished before :math:`T_{dist}^k` counts as arriving at :math:`T_{dist}^k`, Eq. 3), and
   aggregates them (the algorithm's server callbacks: staleness decay, data-size weights);
4. devices still training whose staleness then exceeds ``tau_k`` are deprecated: their work is dropped and they
   restart from the current model next round (counted in :math:`m_{syn}^{k+1}`);
5. the new model is evaluated; the round's latency :math:`T^k = T_{dist}^k + r_{max}^k` and reward
   :math:`acc^k (T_{lim}^k / T^k)^\\vartheta` go to the controller and the loggers.

With devices that come and go (:mod:`lit_asyncfl.availability`), only devices online at a round's start are
selected or re-sent the model (a deprecated device that is offline does not restart); a dropped job counts towards
the round's quota without an update, so the round closes with the updates that did arrive; when no device is
online and nothing is in flight, the round starts when one comes back (the wait counts in its latency).

After round ``K`` the run ends (in-flight work is dropped) and the summary reports the objective
:math:`acc^K (T_{max} / \\sum_k T^k)^\\theta`. With ``deadline=True`` (SAFA) a round instead lasts until every device
could have reported (:math:`T_{dist}^k + \\max_i (T^{cmp}_i + T^U_i)`); the first ``M_k`` arrivals are aggregated
and the later ones are cached and aggregated with the next round's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.checks import check_bool, check_choice, check_count_or_fraction, check_int, check_number
from lit_asyncfl.core.update import JobTiming
from lit_asyncfl.functional.asfl import (
    deprecated_devices,
    distribution_latency,
    latency_objective,
    round_latency_limit,
    round_reward,
    upload_latency,
)
from lit_asyncfl.mobility import MobileEdgeDevices
from lit_asyncfl.rl.controllers import FixedAction, RoundController
from lit_asyncfl.schedulers.base import Scheduler, resolve_count
from lit_asyncfl.schedulers.selection import Selection, UtilitySelection
from lit_asyncfl.schedulers.semi_async_feedback import round_record, state_features
from lit_asyncfl.schedulers.semi_async_state import SemiAsyncRoundState

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.schedulers.view import SchedulerView


#: What a controller may learn from (see ``SemiAsyncRounds(reward=...)``).
REWARDS = ("round", "objective_gain")

#: The defaults of :class:`SemiAsyncRounds` and of every semi-asynchronous preset (ASFL, SAFA, FedCS, Oort): ASFL's
#: task II, ``S = 10`` devices selected per round, ``K = 50`` rounds, :math:`T_{max} = 5000` virtual seconds,
#: latency preferences :math:`\alpha = 0.07` within the limit and :math:`\beta = 0.09` beyond it.
SELECTED, ROUNDS, MAX_LATENCY, ALPHA_PREF, BETA_PREF = 10, 50, 5000.0, 0.07, 0.09


class SemiAsyncRounds(SemiAsyncRoundState, Scheduler):
    r"""ASFL's semi-asynchronous rounds (see the module docstring for one round's steps).

    Needs a :class:`~lit_asyncfl.mobility.MobileEdgeDevices` device model and an aggregator that buffers until the
    round ends (``ModelAverage(buffer_size=None)``); evaluates the global model after every round.

    Args:
        selected: Devices selected per round ``S`` (count, or fraction of the devices).
        rounds: Number of rounds ``K``; the run ends after the ``K``-th aggregation.
        max_latency: Latency limit :math:`T_{max}` of the whole run (virtual seconds).
        alpha_pref: Latency preference :math:`\alpha` within the limit.
        beta_pref: Latency preference :math:`\beta` beyond the limit.
        controller: Chooses ``(M_k, tau_k)`` each round (default: ``FixedAction(5, 2)``).
        selection: Chooses the ``S`` devices (default: :class:`~lit_asyncfl.schedulers.selection.UtilitySelection`).
        deadline: SAFA's rounds: last until every device could have reported, cache late arrivals.
        reward: What the controller learns from: ``"round"``, the paper's per-round reward
            :math:`acc^k (T_{lim}^k / T^k)^\vartheta` (Eq. 8), or ``"objective_gain"``, the change of the objective so
            far :math:`O^{k+1} - O^k` (the state's third feature), whose sum over a run is the run's objective minus
            the initial accuracy — the per-round reward favours fast rounds more than the run objective does.

    Example:
        >>> s = SemiAsyncRounds(selected=10, rounds=50, max_latency=5000.0)
        >>> s.setup(100)
        >>> s.count, s.limit
        (10, 100.0)
    """

    needs_accuracy = True  # the paper's objective and reward read the evaluation's accuracy

    def __init__(
        self,
        selected: int | float = SELECTED,
        rounds: int = ROUNDS,
        max_latency: float = MAX_LATENCY,
        alpha_pref: float = ALPHA_PREF,
        beta_pref: float = BETA_PREF,
        controller: RoundController | None = None,
        selection: Selection | None = None,
        deadline: bool = False,
        reward: str = "round",
    ) -> None:
        check_count_or_fraction("selected", selected)
        check_choice("reward", reward, REWARDS)
        check_int("rounds", rounds, 1)
        check_number("max_latency", max_latency, 0, open_min=True, unit=" virtual seconds")
        check_number("alpha_pref", alpha_pref, 0)
        check_number("beta_pref", beta_pref, 0)
        check_bool("deadline", deadline)
        self.selected = selected
        self.rounds = rounds
        self.max_latency = max_latency
        self.alpha_pref = alpha_pref
        self.beta_pref = beta_pref
        self.controller = controller if controller is not None else FixedAction(5, 2)
        self.selection = selection if selection is not None else UtilitySelection()
        self.deadline = deadline
        self.reward = reward
        self.count = 0
        self._reset()

    @property
    def limit(self) -> float:
        """The average round latency limit :math:`T_{max} / K`."""
        return self.max_latency / self.rounds

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("selected", self.selected, num_clients)
        self.controller.setup(self.count)

    def on_fit_start(self, sim: SchedulerView) -> None:
        if not isinstance(sim.device_model, MobileEdgeDevices):
            raise ValueError(
                f"SemiAsyncRounds needs device_model=MobileEdgeDevices(...), got {type(sim.device_model).__name__}"
            )
        self._reset()
        self.rng = np.random.default_rng([sim.seed, 0xA5F1])
        self.positions = sim.device_model.initial_positions(sim.num_clients, self.rng)
        self.selection.on_fit_start(sim.num_clients)
        self.controller.on_episode_start()
        self._start_round(sim, self._state(sim))

    # -- the round --------------------------------------------------------------------------------------------------
    def _state(self, sim: SchedulerView) -> list[float]:
        """The state :math:`s^k` at the start of round ``k = self.round + 1`` (evaluates the current model)."""
        metrics = sim.evaluate()
        self.accuracy = float(metrics["accuracy"])
        return state_features(
            metrics["loss"],
            self.accuracy,
            self.round,
            self.spent,
            self.max_latency,
            self.alpha_pref,
            self.beta_pref,
            self.deprecated_total,
            self.variance_total,
        )

    @staticmethod
    def _latencies(sim: SchedulerView, bandwidth: np.ndarray, size: float) -> tuple[np.ndarray, np.ndarray]:
        """Each device's computation and upload latency this round (:math:`T^{cmp}_i`, :math:`T^U_i`).

        The paper's rules, not the device model's :meth:`~lit_asyncfl.devices.DeviceModel.job_timing`, on purpose:
        :math:`T^{cmp}_i = \\Delta_i E / g_i` counts the whole shard :math:`\\Delta_i = n_i` every epoch (the
        device model counts the samples a job processes, fewer with ``drop_last=True``), multiplied as
        ``(time_per_sample * n_i) * E`` (for ``E > 1`` not always the same float as the device model's
        ``time_per_sample * (n_i E)``: unifying them would move ASFL's runs by a rounding), and the upload uses
        this round's bandwidth at the device's current position.
        """
        compute = sim.profiles.time_per_sample * sim.num_samples * sim.local_epochs
        return compute, np.array([upload_latency(size, float(b)) for b in bandwidth])

    def _start_round(self, sim: SchedulerView, state: list[float], since: float | None = None) -> None:
        online = sim.availability.online(sim.now)
        syn = [c for c in self.deprecated if online[c]]  # a deprecated device that is offline does not restart
        held = [update.client for _, update in sim.waiting.values()]  # arrived, counted in the coming round
        candidates = np.setdiff1d(np.flatnonzero(~sim.busy & online), np.asarray([*syn, *held], dtype=np.int64))
        if not len(candidates) and not syn and not sim.in_flight and not sim.waiting:  # nobody to run a round with
            self.deferred = (state, sim.now if since is None else since)
            sim.wake_when_online()
            return
        self.round += 1
        self.round_start = sim.now if since is None else since
        self.state = state
        picked, tau = self.controller.act(state)
        net = sim.device_model
        assert isinstance(net, MobileEdgeDevices)
        if self.round > 1:
            self.positions = net.move(self.positions, self.rng)
        bandwidth = net.bandwidths(self.positions)
        size = net.size_of(sim.model_bytes)
        compute, upload = self._latencies(sim, bandwidth, size)
        latency = compute + upload
        self.deprecated = []
        expected = latency + distribution_latency(self.count + len(syn), 0, size, net.server_bandwidth)
        chosen = self.selection.select(candidates, self.count, expected, self.limit, self.rng)
        self.dist_latency = distribution_latency(len(chosen), len(syn), size, net.server_bandwidth)
        self.open_time = sim.now + self.dist_latency
        for client in sorted([*syn, *(int(c) for c in chosen)]):
            sim.dispatch(client, timing=JobTiming(self.dist_latency, float(compute[client]), float(upload[client])))
        self.arrivals, self.closing, self.picked_versions = 0, False, []
        waiting = 0 if self.deadline else len(sim.waiting)  # held early arrivals count in ASFL, are cache in SAFA
        training = sim.num_training + waiting
        self.action = (training if picked is None else min(picked, training), tau)
        self.requested = 0 if picked is None else picked
        if self.deadline:  # every device could have reported (the selected ones exactly: their own arrival times)
            arrivals = [job.arrival_time for job in sim.in_flight.values() if job.dispatch_time == sim.now]
            end = max(self.open_time + float(latency.max()), *arrivals)
            sim.schedule(end, "round_end", round=self.round)
        elif self.action[0] == 0:  # nobody to wait for
            sim.schedule(self.open_time, "round_end", round=self.round)
        sim.release_arrivals()  # the held arrivals of the last round are this round's

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        self._answered(sim, job, arrived=True)

    def on_online(self, sim: SchedulerView) -> None:
        if self.deferred is not None and not self.finished:
            (state, since), self.deferred = self.deferred, None
            self._start_round(sim, state, since)

    def on_drop(self, sim: SchedulerView, job: ClientJob, reason: str) -> None:
        """A dropped member counts towards the round's quota without an update: the round closes with the
        updates that did arrive, rather than waiting for one that never will."""
        self._answered(sim, job, arrived=False)

    def _answered(self, sim: SchedulerView, job: ClientJob, arrived: bool) -> None:
        if self.finished:
            return
        cached = arrived and self.deadline and job.arrival_time <= self.round_start  # SAFA: came last round
        if not cached:
            self.arrivals += 1
            if arrived:
                self.picked_versions.append(job.base_version)
        if self.closing or cached or self.arrivals < self.action[0]:
            return
        self.closing = True
        if not self.deadline and sim.now >= self.open_time:
            self._end_round(sim)
            return
        # the quota is met before the round can end (SAFA's deadline, or ASFL's distribution still going on):
        # later arrivals wait for the next round
        sim.hold_arrivals()
        if not self.deadline:
            sim.schedule(self.open_time, "round_end", round=self.round)

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        if event.kind == "round_end" and event.data.get("round") == self.round and not self.finished:
            self._end_round(sim)

    def on_arrival(self, sim: SchedulerView, update: ClientUpdate) -> None:
        self.selection.observe(update.client, update.num_samples, update.train_loss)

    def _end_round(self, sim: SchedulerView) -> None:
        latency = sim.now - self.round_start
        tau = self.action[1]
        sim.flush()
        variance = float(np.var(self.picked_versions)) if self.picked_versions else 0.0
        version = sim.server.version
        # devices still training, and updates held for the next round (ASFL's early arrivals, SAFA's cache): too
        # stale ones are dropped and their devices re-sent the model
        pending = [*sim.in_flight.values(), *(job for job, _ in sim.waiting.values())]
        jobs = {job.client: job.job_id for job in pending}
        self.deprecated = deprecated_devices(version, {job.client: job.base_version for job in pending}, tau)
        for client in self.deprecated:
            sim.cancel(jobs[client])
        limit = round_latency_limit(self.max_latency, self.spent, self.rounds, self.round)
        self.spent += latency
        self.deprecated_total += len(self.deprecated)
        self.variance_total += variance
        metrics = sim.evaluate()
        accuracy = float(metrics["accuracy"])
        # a round that took no time (its quota met by held arrivals, nobody to send to) counts as a thousandth of
        # its limit, so the ratio stays finite
        reward = round_reward(accuracy, max(latency, 1e-3 * limit), limit, self.alpha_pref, self.beta_pref)
        self.total_reward += reward
        done = self.round == self.rounds
        if done:
            self.objective = latency_objective(accuracy, self.spent, self.max_latency, self.alpha_pref, self.beta_pref)
        record = round_record(self, latency, limit, reward, variance, done)
        next_state = self._state(sim)
        learnt = reward if self.reward == "round" else next_state[2] - self.state[2]
        stats = self.controller.feedback(learnt, next_state, done)
        if stats:
            record.update({f"sac/{k}": v for k, v in stats.items()})
        sim.log(record)
        if done:
            self.finished = True
            for job_id in sorted(sim.in_flight):
                sim.cancel(job_id)
            sim.release_arrivals()
            return
        self._start_round(sim, next_state)

    def summary(self) -> dict[str, Any]:
        """Run-level results: the objective, total latency, rounds done and the sum of rewards."""
        return {
            "objective": self.objective,
            "total_latency": self.spent,
            "rounds": self.round if self.finished else self.round - 1,
            "episode_return": self.total_reward,
            "deprecated_total": self.deprecated_total,
        }
