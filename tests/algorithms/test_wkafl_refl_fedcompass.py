"""WKAFL, REFL and FedCompass (issue 19), and the mechanisms they brought: per-job numbers of local steps (every
engine), an availability predictor fed only by what the server observed, grouped and stale-aware aggregation.
Formulas against hand values and independent implementations, whole runs replayed by hand from the recorded
uploads, determinism, exact resume, refused settings, configs that run."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import yaml
from builders import ROOT
from conftest import RecordsVersions, check_determinism_and_exact_resume, global_weights, make_trainer, run

from lit_asyncfl.algorithms import PRESETS, REFL, WKAFL, FedCompass
from lit_asyncfl.availability import MarkovOnOff
from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.client.ray_executor import ray_available
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import samples_before_step
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.functional.compass import compass_update, join_steps, new_group_steps, speed_estimate
from lit_asyncfl.functional.refl import deviation_ratio, ips_priority, offline_rate, saa_weight
from lit_asyncfl.functional.wkafl import adaptive_lr, clip_norm, two_stage_aggregate
from lit_asyncfl.models import LeNet5
from lit_asyncfl.schedulers.compass import CompassScheduler
from lit_asyncfl.schedulers.deadline_rounds import AvailabilityPrioritySelection, DeadlineRounds
from lit_asyncfl.schedulers.selection import RandomSelection
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.grouped import GroupedDeltaStep
from lit_asyncfl.server.stale_aware import StaleAwareAverage
from lit_asyncfl.server.two_stage import TwoStageWeightedStep

DATA = {"partition": "dirichlet"}


# ---------------------------------------------------------------------------------------------------------- formulas


def test_compass_formulas_by_hand():
    assert speed_estimate(None, 12.0, 4, 0.9) == 3.0
    assert math.isclose(speed_estimate(3.0, 20.0, 4, 0.9), 0.1 * 3.0 + 0.9 * 5.0)
    assert join_steps(41.0, 2.0, 20, 100) == 20 and join_steps(39.0, 2.0, 20, 100) is None
    assert join_steps(202.0, 2.0, 20, 100) is None and join_steps(200.0, 2.0, 20, 100) == 100
    # two open groups: (latest 10, fastest 0.2) -> floor((10 + 20 - 0) / 1) = 30; (latest 50, 0.1) -> 60: max 60
    assert new_group_steps(0.0, 1.0, [(10.0, 0.2), (50.0, 0.1)], 20, 100) == 60
    assert new_group_steps(0.0, 1.0, [(200.0, 1.0)], 20, 100) == 100  # beyond Q_max: none qualifies -> Q_max
    assert new_group_steps(20.0, 1.0, [(10.0, 0.2)], 20, 100) == 100  # the group is closed (latest passed)
    assert new_group_steps(0.0, 1.0, [(3.0, 0.05)], 20, 100) == 20  # 8 steps raised to Q_min
    deltas = [torch.tensor([4.0, 0.0]), torch.tensor([0.0, 4.0])]
    w = compass_update(torch.tensor([1.0, 1.0]), deltas, [0, 8], 0.5, 0.5, 4)
    assert torch.allclose(w, torch.tensor([1.0 + 0.5 * 4 / 4, 1.0 + 0.5 * (1 / 3) * 4 / 4]))


def test_compass_joins_the_group_reachable_with_the_most_steps_ties_the_later():
    sched = CompassScheduler(q_min=2, q_max=10)
    sim = type("Sim", (), {"now": 0.0})()
    group = lambda expected: {"clients": [5], "arrived": [], "expected": expected, "latest": 99.0}  # noqa: E731
    sched.groups = {0: group(9.0), 1: group(8.2), 2: group(10.8)}  # 9, 8 and 10 steps at 1 s per step
    assert sched._join(sim, 1.0) == (10, 2)
    sched.groups = {0: group(9.0), 1: group(8.2), 2: group(9.7)}  # 9, 8, 9: a tie, the later group
    assert sched._join(sim, 1.0) == (9, 2)
    sched.groups = {0: group(1.5), 1: group(12.0)}  # 1 < q_min, 12 > q_max: none
    assert sched._join(sim, 1.0) == (-1, None)


def reference_two_stage(grads, taus, c1, b, theta, temp=10.0, in_place=True):
    """An independent WKAFL stage one and two, written from the authors' loops (whose stage-one TensorClip rewrites
    the buffered gradients in place: ``in_place``)."""
    grads = list(grads)
    e = math.e
    raw = [(e / 2) ** (-t) for t in taus]
    w = [r / sum(raw) for r in raw]
    freshest = int(np.argsort(np.asarray(taus, dtype=float), kind="stable")[0])
    std = float(torch.linalg.vector_norm(grads[freshest]))
    est = torch.zeros_like(grads[0])
    for i, (wi, g) in enumerate(zip(w, list(grads))):
        n = float(torch.linalg.vector_norm(g))
        clipped = g * (c1 * std / n) if c1 * std < n else g
        est += wi * clipped
        if in_place:
            grads[i] = clipped
    sims = [float((g * est).sum() / (torch.linalg.vector_norm(g) * torch.linalg.vector_norm(est))) for g in grads]
    sel = [i for i, s in enumerate(sims) if s > theta]
    if not sel:
        return est
    tot = [math.exp(sims[i] * temp) * w[i] for i in sel]
    out = torch.zeros_like(est)
    bound = b * float(torch.linalg.vector_norm(est))
    for t, i in zip(tot, sel):
        g, n = grads[i], float(torch.linalg.vector_norm(grads[i]))
        out += (t / sum(tot)) * (g * (bound / n) if bound < n else g)
    return out


def test_wkafl_formulas_by_hand_and_against_an_independent_implementation():
    assert clip_norm(torch.tensor([6.0, 8.0]), 5.0).tolist() == [3.0, 4.0]
    assert adaptive_lr(0.5, 3) == 0.5 / 1.3
    # by hand: the two first agree with the estimate, the third points away and is dropped
    g = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.1]), torch.tensor([-1.0, 0.0])]
    out, est, kept = two_stage_aggregate(g, [1, 1, 1], 100.0, 10.0, 0.3)
    assert torch.allclose(est, torch.tensor([1.0 / 3, 0.1 / 3])) and kept == [True, True, False]
    s = [float(torch.nn.functional.cosine_similarity(x, est, dim=0)) for x in g[:2]]
    q = [math.exp(10 * x) for x in s]
    assert torch.allclose(out, (q[0] * g[0] + q[1] * g[1]) / sum(q))
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        grads = [torch.randn(6, generator=gen) * (1 + 3 * (i % 3)) + 0.5 for i in range(5)]
        taus = [int(t) for t in torch.randint(1, 6, (5,), generator=gen)]
        c1, b, theta = (1.5, 0.8, 0.1) if trial % 2 else (100.0, 10.0, 0.3)
        for in_place in (True, False):
            mine, _, _ = two_stage_aggregate(grads, taus, c1, b, theta, clip_in_place=in_place)
            expected = reference_two_stage(grads, taus, c1, b, theta, in_place=in_place)
            assert torch.allclose(mine, expected, atol=1e-6), (trial, in_place)


def test_refl_formulas_by_hand():
    mean = torch.tensor([1.0, 1.0])  # two fresh updates; a stale one at [3, 1]: |[2, 0]|^2 / (9 * 2)
    assert math.isclose(deviation_ratio(torch.tensor([3.0, 1.0]), mean, 2), 4.0 / 18.0, rel_tol=1e-6)
    assert deviation_ratio(torch.tensor([3.0, 1.0]), torch.zeros(2), 2) == 1.0
    assert math.isclose(saa_weight(2, 0.5, 1.0, beta=0.35, scale=10.0), 0.65 / 3 + 0.35 * (1 - math.exp(-0.5) / 10))
    assert math.isclose(saa_weight(1, 1.0, 1.0, beta=0.0), 0.5)  # damping alone: 1 / (tau + 1)
    assert offline_rate(3, 60.0) == 0.05 and offline_rate(0, 60.0) == 0.0
    w = 10.0  # e^{-lambda w} >= 0.5 > e^{-2 lambda w}: lambda in (ln 2 / 20, ln 2 / 10]
    assert not ips_priority(math.log(2) / 20 - 1e-9, w) and ips_priority(math.log(2) / 20 + 1e-9, w)
    assert ips_priority(math.log(2) / 10, w) and not ips_priority(math.log(2) / 10 + 1e-9, w)


def test_session_predictor_learns_only_from_what_it_observed():
    p = SessionPredictor()
    p.reset(3)
    p.observe(0.0, np.array([True, True, False]))
    p.observe(10.0, np.array([True, False, True]))  # 0 stayed 10 s, 1 left (5 s counted), 2 came back
    p.observe(30.0, np.array([True, True, True]))  # 0 stayed 20 s more, 2 stayed 20 s
    p.observe_offline(2, 34.0)  # 2's job was lost at 34: 4 s more, one end
    assert p.ends.tolist() == [0, 1, 1] and p.exposure.tolist() == [30.0, 5.0, 24.0]
    assert p.rate(0) == 0.0 and p.rate(1) == 0.2 and p.rate(2) == 1 / 24
    assert p.stays_online(0, 1e6) == 1.0  # never seen leaving: predicted to stay
    again = SessionPredictor()
    again.load_state_dict(p.state_dict())
    assert again.rate(2) == p.rate(2) and again.seen_at.tolist() == p.seen_at.tolist()


def test_ips_selects_the_devices_about_to_leave_first_then_at_random():
    p = SessionPredictor()
    p.reset(6)
    p.observe(0.0, np.ones(6, bool))
    p.observe(20.0, np.array([False, False, True, True, True, True]))  # 0 and 1 left once, ~10 s online: 0.1/s
    p.observe(40.0, np.ones(6, bool))
    sel = AvailabilityPrioritySelection(p)
    for seed in range(5):
        picked = sel.select(np.arange(6), 3, np.zeros(6), 5.0, np.random.default_rng(seed)).tolist()
        assert {0, 1} <= set(picked) and len(picked) == 3
    # a round window long enough that they would not last it: no priority, a random pick
    counts = np.zeros(6)
    for seed in range(60):
        counts[sel.select(np.arange(6), 2, np.zeros(6), 100.0, np.random.default_rng(seed))] += 1
    assert counts.min() > 0


# ------------------------------------------------------------------------------- per-job local steps (the mechanism)


class JobLog(ServerCallback):
    """Records each accepted upload's job and weights, and which jobs made each version."""

    def __init__(self) -> None:
        self.uploads: dict[int, dict] = {}
        self.versions: list[dict] = []

    @property
    def state_key(self) -> str:
        return "test-job-log"

    def weight_update(self, server, update, weight):
        self.uploads[update.job.job_id] = {"job": update.job, "weights": update.weights, "base": update.base_weights,
                                           "steps": update.num_steps, "client": update.client}  # fmt: skip
        assert weight == 1.0
        return weight

    def on_aggregated(self, server, updates):
        self.versions.append({"jobs": [u.job.job_id for u in updates], "version": server.version - 1,
                              "before": server.previous_weights, "after": server.weights})  # fmt: skip


def compass_run(tmp_path, **kwargs):
    algo = FedCompass(q_min=2, q_max=7, latest_time_factor=1.3)
    log = JobLog()
    algo.server_callbacks.append(log)
    kwargs.setdefault("max_versions", 14)
    trainer = run(tmp_path, algo, num_clients=6, data_kwargs=DATA, **kwargs)
    return trainer, log


def test_jobs_run_their_own_steps_and_virtual_time_follows_them(tmp_path):
    trainer, log = compass_run(tmp_path)
    sim = trainer.simulator
    steps = {u["steps"] for u in log.uploads.values()}
    assert len(steps) > 2 and min(steps) >= 2 and max(steps) <= 7  # different numbers of steps were assigned
    for u in log.uploads.values():
        job = u["job"]
        assert u["steps"] == job.num_steps == job.local_steps  # the engine ran exactly the assigned steps
        n = int(sim.num_samples[job.client])
        per_epoch = -(-n // sim.batch_size)
        assert job.local_epochs == -(-job.local_steps // per_epoch)
        # UniformRatio: compute time = time per sample x samples the steps process
        expected = sim.profiles.time_per_sample[job.client] * samples_before_step(n, sim.batch_size, job.local_steps)
        assert math.isclose(job.timing.compute, expected, rel_tol=1e-9)


@pytest.mark.parametrize("engine", ["lightning", "cohort"])
def test_every_engine_runs_the_assigned_steps_as_the_fast_one(tmp_path, engine):
    fast, log_fast = compass_run(tmp_path / "fast", max_versions=6)
    other, log_other = compass_run(tmp_path / engine, max_versions=6, engine=engine)
    assert log_fast.uploads.keys() == log_other.uploads.keys()
    for job_id, u in log_fast.uploads.items():
        v = log_other.uploads[job_id]
        assert v["steps"] == u["steps"] == u["job"].local_steps
        assert torch.allclose(u["weights"], v["weights"], atol=1e-5), job_id
    assert torch.allclose(global_weights(fast), global_weights(other), atol=1e-5)


@pytest.mark.skipif(not ray_available(), reason="ray is not installed")
def test_the_ray_executor_ships_the_job_steps(tmp_path):
    fast, log_fast = compass_run(tmp_path / "seq", max_versions=5)
    ray, log_ray = compass_run(tmp_path / "ray", max_versions=5, executor="ray")
    assert {k: u["steps"] for k, u in log_ray.uploads.items()} == {k: u["steps"] for k, u in log_fast.uploads.items()}
    assert torch.equal(global_weights(fast), global_weights(ray))


def test_a_bad_number_of_steps_is_refused_naming_it(tmp_path):
    class Bad(CompassScheduler):
        def on_fit_start(self, sim):
            sim.dispatch(0, local_steps=0)

    algo = FedCompass()
    algo.scheduler = Bad()
    with pytest.raises(ValueError, match="local_steps must be >= 1, got 0"):
        run(tmp_path, algo, num_clients=4, max_versions=2)


# ------------------------------------------------------------------------------------------- runs replayed by hand


def test_fedcompass_run_replayed_from_the_recorded_uploads(tmp_path):
    trainer, log = compass_run(tmp_path, max_versions=14)
    n, alpha, a = 6, 0.9, 0.5
    sizes = [len(v["jobs"]) for v in log.versions]
    firsts = [v for v in log.versions if min(v["jobs"]) < n]  # the first jobs have ids 0..n-1
    assert len(firsts) == n and all(len(v["jobs"]) == 1 for v in firsts)  # a first update is aggregated alone
    assert max(sizes) > 1  # groups of clients did arrive together
    weights = log.versions[0]["before"].clone()
    for v in log.versions:
        assert torch.equal(v["before"], weights) or torch.allclose(v["before"], weights, atol=1e-6)
        step = torch.zeros_like(weights)
        for job_id in v["jobs"]:
            u = log.uploads[job_id]
            tau = v["version"] - u["job"].base_version
            step += alpha * (tau + 1) ** (-a) / n * (u["weights"] - u["base"])
        weights = v["before"] + step
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6)
    sched = trainer.algorithm.scheduler
    assert all(s > 0 for s in sched.speed.values()) and len(sched.speed) == n


class LoggedCompass(CompassScheduler):
    """Records what the scheduler decided (dispatches with their group) and saw (arrivals), with the time."""

    def on_fit_start(self, sim):
        self.events: list[tuple] = []
        super().on_fit_start(sim)

    def _dispatch(self, sim, client, steps):
        super()._dispatch(sim, client, steps)
        gid = self.group_of.get(client)
        latest = None if gid is None else self.groups[gid]["latest"]
        self.events.append(("dispatch", sim.now, client, sim.next_job_id - 1, steps, gid, latest))

    def on_arrival(self, sim, update):
        super().on_arrival(sim, update)
        self.events.append(("arrival", sim.now, update.client, update.job.job_id))


class VersionTimes(ServerCallback):
    def __init__(self) -> None:
        self.versions: list[tuple[float, list[int]]] = []

    @property
    def state_key(self) -> str:
        return "test-version-times"

    def on_aggregated(self, server, updates):
        self.versions.append((server.now, [u.job.job_id for u in updates]))


def test_fedcompass_schedule_replayed_from_the_recorded_times(tmp_path):
    """The Compass rules checked against the recorded dispatch and arrival times, independently of the scheduler:
    speeds, on-time members aggregated with their group by its latest time (a timer when one is late), late updates
    buffered for a later group while their client restarts at once, members restarted fastest first."""
    m = 0.9
    algo = FedCompass(q_min=2, q_max=7, latest_time_factor=1.05, speed_momentum=m)
    algo.scheduler = sched = LoggedCompass(2, 7, m, 1.05)
    times = VersionTimes()
    algo.server_callbacks.append(times)
    devices = UniformResponse(low=10.0, high=40.0, bandwidth=2e4)  # compute drawn per job (some late), ~4 s links
    trainer = run(tmp_path, algo, num_clients=6, max_versions=30, data_kwargs=DATA, device_model=devices)
    end = trainer.simulator.now
    dispatches = {e[3]: e for e in sched.events if e[0] == "dispatch"}
    arrivals = {e[3]: e for e in sched.events if e[0] == "arrival"}
    version_of = {job: (t, jobs) for t, jobs in times.versions for job in jobs}
    speed: dict[int, float] = {}
    late = on_time_in_timer = 0
    for job_id, (_, t_arr, client, _) in sorted(arrivals.items()):
        _, t_disp, _, _, steps, gid, latest = dispatches[job_id]
        rate = (t_arr - t_disp) / steps  # the server's estimate: dispatch to arrival, download and upload included
        speed[client] = rate if client not in speed else (1 - m) * speed[client] + m * rate
        if gid is None:  # a client's first update: aggregated alone, at once
            assert version_of[job_id] == (t_arr, [job_id])
            continue
        restarts = [e for e in sched.events if e[0] == "dispatch" and e[2] == client and e[3] > job_id]
        if t_arr > latest:  # late: buffered for the next group aggregation, its client restarted at once
            late += 1
            assert restarts and restarts[0][1] == t_arr
            if job_id in version_of:
                t_v, jobs = version_of[job_id]
                assert t_v > t_arr and len(jobs) > 1
        elif latest < end:  # on time: aggregated with its group when the last member arrives or at the latest time
            t_v, jobs = version_of[job_id]
            assert t_arr <= t_v <= latest + 1e-9
            on_time_in_timer += math.isclose(t_v, latest) and t_v > t_arr
            assert restarts and restarts[0][1] == t_v
    assert late > 0 and on_time_in_timer > 0  # the run exercised late arrivals and the group timer
    assert all(math.isclose(speed[c], sched.speed[c], rel_tol=1e-9) for c in speed)
    # the members a group aggregation restarts are dispatched fastest first (as estimated at that moment)
    for t_v, jobs in times.versions:
        members = [arrivals[j][2] for j in jobs if dispatches[j][5] is not None and arrivals[j][1] <= dispatches[j][6]]
        order = [e[2] for e in sched.events if e[0] == "dispatch" and e[1] == t_v and e[2] in members]
        assert len(order) == len(members)
        assert order == sorted(members, key=lambda c: (trainer_speed_at(sched, arrivals, dispatches, c, t_v), c))


def trainer_speed_at(sched, arrivals, dispatches, client, t):
    """The speed estimate of ``client`` from its arrivals up to time ``t`` (recomputed from the recorded times)."""
    m, speed = sched.speed_momentum, None
    for job_id, (_, t_arr, c, _) in sorted(arrivals.items()):
        if c == client and t_arr <= t:
            rate = (t_arr - dispatches[job_id][1]) / dispatches[job_id][4]
            speed = rate if speed is None else (1 - m) * speed + m * rate
    return speed


class Uploads(RecordsVersions):
    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[dict] = []

    def weight_update(self, server, update, weight):
        self.uploads.append({"client": update.client, "base_version": update.base_version, "version": server.version,
                             "delta": update.delta})  # fmt: skip
        return weight


def test_wkafl_run_replayed_from_the_recorded_uploads(tmp_path):
    k, lr, beta = 3, 0.8, 0.1
    algo = WKAFL(k=k, server_lr=lr, momentum=beta, second_clip=0.9, threshold=0.2)
    record = Uploads()
    algo.server_callbacks.append(record)
    run(tmp_path, algo, num_clients=6, max_versions=8, data_kwargs=DATA)
    assert [v["count"] for v in record.versions] == [k] * 8
    weights, previous = record.versions[0]["before"].clone(), torch.zeros_like(record.versions[0]["before"])
    for t, v in enumerate(record.versions):
        batch = record.uploads[t * k : (t + 1) * k]
        grads = [clip_norm(-u["delta"] + beta * previous, 100.0) for u in batch]
        taus = [t - u["base_version"] + 1 for u in batch]
        step = reference_two_stage(grads, taus, 100.0, 0.9, 0.2)
        weights = weights - lr / (1 + 0.1 * min(taus)) * step
        previous = step
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6), t
    assert max(u["version"] - u["base_version"] for u in record.uploads) > 0  # stale gradients were weighted


def wkafl_update(client: int, weights, base, base_version: int = 0) -> ClientUpdate:
    job = ClientJob(0, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.tensor(weights), torch.tensor(base), 10, 1, 0.0)


def test_a_refused_wkafl_step_teaches_the_global_direction_nothing():
    agg = TwoStageWeightedStep(buffer_size=1, momentum=0.5)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    # a finite upload whose delta overflows: the step is NaN and refused; G_{t-1} must stay 0 (not NaN)
    assert not server.receive(wkafl_update(1, [3e38, 0.0], [-3e38, 0.0]))
    assert server.stats.reasons["non_finite_aggregate"] == 1 and agg.previous is None
    assert server.receive(wkafl_update(0, [1.0, 0.0], [0.0, 0.0]))  # g = -(1, 0) + 0.5 * 0, tau 1: eta 1/1.1
    assert torch.allclose(server.weights, torch.tensor([1.0 / 1.1, 0.0]))
    assert torch.equal(agg.previous, torch.tensor([-1.0, 0.0]))
    # the momentum of an applied step is used: g = -(1, 0) + 0.5 * (-1, 0), tau 1
    assert server.receive(wkafl_update(2, [2.0, 0.0], [1.0, 0.0], base_version=1))
    assert torch.allclose(server.weights, torch.tensor([1.0 / 1.1 + 1.5 / 1.1, 0.0]))


def test_wkafl_clips_each_gradient_to_c1_before_both_stages():
    agg = TwoStageWeightedStep(buffer_size=1, first_clip=1.0)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    assert server.receive(wkafl_update(0, [-3.0, -4.0], [0.0, 0.0]))  # g = (3, 4), norm 5, clipped to norm C1 = 1
    assert torch.allclose(server.weights, -torch.tensor([0.6, 0.8]) / 1.1)


def test_refl_run_replayed_from_the_recorded_uploads(tmp_path):
    algo = REFL(clients_per_round=4, deadline=30.0, beta=0.35, scale=2.0, prohibit_reselect=1)
    record = Uploads()
    algo.server_callbacks.append(record)
    trainer = run(tmp_path, algo, num_clients=10, max_versions=8, data_kwargs=DATA)
    weights = record.versions[0]["before"].clone()
    seen, stale_total = 0, 0
    for t, v in enumerate(record.versions):
        batch = record.uploads[seen : seen + v["count"]]
        seen += v["count"]
        fresh = [u["delta"] for u in batch if u["base_version"] == t]
        assert fresh  # a round aggregates only with fresh updates
        mean = sum(fresh) / len(fresh)
        ratios = [0.0 if u["base_version"] == t else
                  float(((u["delta"] - mean) ** 2).sum()) / ((len(fresh) + 1) ** 2 * float((mean ** 2).sum()))
                  for u in batch]  # fmt: skip
        top = max(ratios)
        q = [1.0 if u["base_version"] == t else
             0.65 / (t - u["base_version"] + 1) + 0.35 * (1 - math.exp(-r / top) / 2.0)
             for u, r in zip(batch, ratios)]  # fmt: skip
        stale_total += sum(u["base_version"] != t for u in batch)
        weights = weights + sum(qi * u["delta"] for qi, u in zip(q, batch)) / sum(q)
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6), t
    assert stale_total > 0  # stragglers' late updates were aggregated
    assert trainer.simulator.cancelled == 0  # stragglers are never cancelled


def test_refl_learns_availability_from_drops_and_round_starts(tmp_path):
    algo = REFL(clients_per_round=3, deadline=30.0, prohibit_reselect=1)
    trainer = run(tmp_path, algo, num_clients=8, max_versions=12, data_kwargs=DATA,
                  availability=MarkovOnOff(mean_on=150.0, mean_off=100.0))  # fmt: skip
    p = algo.scheduler.predictor
    assert p.ends.sum() > 0 and trainer.simulator.dropped["offline"] > 0  # it saw jobs lost to devices leaving
    rates = [p.rate(c) for c in range(8) if p.exposure[c] > 0 and p.ends[c] > 0]
    assert rates and 1 / 600 < float(np.median(rates)) < 1 / 30  # near the true 1/150 per second
    quiet = REFL(clients_per_round=3, deadline=30.0)
    run(tmp_path / "always", quiet, num_clients=8, max_versions=3, data_kwargs=DATA)
    assert quiet.scheduler.predictor.ends.sum() == 0  # always available: nothing predicted to leave


def test_refl_scheduler_feeds_lost_jobs_to_the_predictor_and_passes_over_recent_devices(tmp_path):
    rounds = DeadlineRounds(2, deadline=30.0, predictor=SessionPredictor())
    rounds.predictor.reset(3)
    rounds.predictor.observe(0.0, np.ones(3, bool))
    job = lambda c: ClientJob(0, c, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)  # noqa: E731
    sim = type("Sim", (), {"now": 40.0})()
    rounds.on_drop(sim, job(1), "offline")  # the server saw client 1's connection drop at 40 s
    rounds.on_drop(sim, job(2), "crash")  # a crash says nothing about availability
    assert rounds.predictor.ends.tolist() == [0, 1, 0] and rounds.predictor.exposure.tolist() == [0, 40.0, 0]

    class LoggedRounds(DeadlineRounds):
        def _start_round(self, sim):
            before = sim.busy.copy()
            super()._start_round(sim)
            self.chosen.append(set(np.flatnonzero(sim.busy & ~before).tolist()))

    algo = REFL(clients_per_round=3, deadline=1e6, prohibit_reselect=2)  # every job ends within its round
    algo.scheduler = sched = LoggedRounds(3, 1e6, RandomSelection(), None, prohibit_reselect=2)
    sched.chosen = []
    run(tmp_path, algo, num_clients=10, max_versions=8, data_kwargs=DATA)
    assert len(sched.chosen) >= 8 and all(len(c) == 3 for c in sched.chosen)
    for r in range(2, len(sched.chosen)):  # 4 others were always available: the last two rounds' devices rest
        assert not sched.chosen[r] & (sched.chosen[r - 1] | sched.chosen[r - 2]), r


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "wkafl": (lambda: WKAFL(k=3), {}, 8),
    "refl": (lambda: REFL(clients_per_round=4, deadline=30.0, prohibit_reselect=1), {}, 8),
    "fedcompass": (lambda: FedCompass(q_min=2, q_max=7, latest_time_factor=1.3), {}, 14),
}


def server_state_is_midway(name: str, algorithm) -> bool:
    aggregator = algorithm.aggregator
    if name == "wkafl":
        return aggregator.previous is not None and len(aggregator.buffer) > 0
    if name == "refl":
        return len(aggregator.buffer) > 0 and algorithm.scheduler.round > 1
    return bool(aggregator.held) and any(g["arrived"] for g in algorithm.scheduler.groups.values())


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, extra, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: server_state_is_midway(name, algorithm), data=DATA,
        fractions=(0.45, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8), num_clients=8, **extra,
    )  # fmt: skip
    assert resumed.algorithm.scheduler.state_dict().keys() == full.algorithm.scheduler.state_dict().keys()


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WKAFL(k=0), r"buffer_size must be >= 1, got 0|k must be >= 1, got 0"),
        (lambda: WKAFL(k=0.5), r"buffer_size must be an integer >= 1, got 0.5"),
        (lambda: WKAFL(momentum=1.5), r"momentum must be in \[0, 1\], got 1.5"),
        (lambda: WKAFL(threshold=1.0), r"threshold must be in \[-1, 1\), got 1.0"),
        (lambda: WKAFL(first_clip=0.0), r"first_clip must be > 0, got 0.0"),
        (lambda: WKAFL(server_lr=float("nan")), r"server_lr must be a finite number > 0, got nan"),
        (lambda: REFL(deadline=0.0), r"deadline must be > 0 virtual seconds, got 0.0"),
        (lambda: REFL(beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
        (lambda: REFL(scale=0.5), r"scale must be >= 1, got 0.5"),
        (lambda: REFL(prohibit_reselect=-1), r"prohibit_reselect must be >= 0, got -1"),
        (lambda: REFL(confidence=1.0), r"confidence must be in \(0, 1\), got 1.0"),
        (lambda: REFL(ips="yes"), r"ips must be True or False, got 'yes'"),
        (lambda: REFL(clients_per_round=0), r"clients_per_round must be >= 1, got 0"),
        (lambda: FedCompass(q_min=0), r"q_min must be >= 1, got 0"),
        (lambda: FedCompass(q_min=50, q_max=20), r"q_min.*50.*q_max.*20"),
        (lambda: FedCompass(speed_momentum=0.0), r"speed_momentum must be in \(0, 1\], got 0.0"),
        (lambda: FedCompass(latest_time_factor=0.9), r"latest_time_factor must be >= 1, got 0.9"),
        (lambda: FedCompass(alpha=0.0), r"alpha must be > 0, got 0.0"),
        (lambda: FedCompass(staleness_exponent=-1.0), r"staleness_exponent must be >= 0, got -1.0"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_schedulers_refuse_an_aggregator_they_cannot_drive(tmp_path):
    from lit_asyncfl.algorithms import Algorithm
    from lit_asyncfl.server import DeltaAverage

    with pytest.raises(ValueError, match="needs the GroupedDeltaStep aggregator, got DeltaAverage"):
        run(tmp_path / "c", Algorithm(CompassScheduler(2, 4), DeltaAverage(None)), num_clients=4, max_versions=2)
    with pytest.raises(ValueError, match=r"flush-only aggregator \(buffer_size=None\), got buffer_size=5"):
        run(tmp_path / "r", Algorithm(DeadlineRounds(2, 10.0), DeltaAverage(5)), num_clients=4, max_versions=2)


def test_presets_are_registered_and_are_the_papers_compositions():
    assert PRESETS["wkafl"] is WKAFL and PRESETS["refl"] is REFL and PRESETS["fedcompass"] is FedCompass
    w = WKAFL()
    assert isinstance(w.aggregator, TwoStageWeightedStep) and w.scheduler.k == 10 and w.server_callbacks == []
    agg = w.aggregator
    assert (agg.buffer_size, agg.server_lr, agg.momentum, agg.first_clip, agg.second_clip, agg.threshold,
            agg.temperature, agg.lr_decay) == (10, 1.0, 0.1, 100.0, 10.0, 0.3, 10.0, 0.1)  # fmt: skip
    r = REFL()
    assert isinstance(r.aggregator, StaleAwareAverage) and isinstance(r.scheduler, DeadlineRounds)
    assert (r.aggregator.beta, r.aggregator.scale, r.scheduler.deadline, r.scheduler.prohibit_reselect) == (
        0.35, 1.0, 100.0, 5)  # fmt: skip
    assert r.scheduler.selection.predictor is r.scheduler.predictor
    assert type(REFL(ips=False).scheduler.selection).__name__ == "Selection"
    c = FedCompass()
    assert isinstance(c.aggregator, GroupedDeltaStep) and isinstance(c.scheduler, CompassScheduler)
    s = c.scheduler
    assert (s.q_min, s.q_max, s.speed_momentum, s.latest_time_factor, c.aggregator.alpha,
            c.aggregator.staleness_exponent) == (20, 100, 0.9, 1.5, 0.9, 0.5)  # fmt: skip


def test_comparison_specs_and_the_benchmark_suites_include_the_presets():
    fedhist = yaml.safe_load((ROOT / "configs" / "compare" / "fedhist_table1.yaml").read_text())
    assert {"WKAFL", "REFL"} <= set(fedhist["methods"])
    fedadt = yaml.safe_load((ROOT / "configs" / "compare" / "fedadt_table1.yaml").read_text())
    assert "FedCompass" in fedadt["methods"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench_algorithms.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert {"WKAFL", "REFL"} <= set(bench.SUITES["fedhist"]["methods"])
    assert "FedCompass" in bench.SUITES["fedadt"]["methods"]


@pytest.mark.parametrize("name", ["wkafl", "refl", "fedcompass"])
def test_config_parses_and_runs(tmp_path, name):
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    overrides = {
        "wkafl": ["--trainer.algorithm.init_args.k=4"],
        "refl": ["--trainer.algorithm.init_args.clients_per_round=4", "--trainer.algorithm.init_args.deadline=40.0"],
        "fedcompass": ["--trainer.algorithm.init_args.q_max=4"],
    }[name]
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", "--trainer.eval_every=3", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false", *overrides]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    changed = {o.split("=")[0].rsplit(".", 1)[1] for o in overrides}
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key not in changed:
            assert algorithm.hparams[key] == value, key
    summary = cli.trainer.summary
    assert summary["versions"] == 3 and summary["stop_reason"] == "max_versions"
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0


def test_fedcompass_refuses_local_epochs_it_would_ignore(tmp_path):
    trainer = make_trainer(tmp_path, FedCompass(q_min=2, q_max=4), num_clients=6, max_versions=2, local_epochs=3)
    with pytest.raises(ValueError, match=r"local_epochs=3 would be ignored: leave local_epochs at 1 and set q_min"):
        trainer.fit(LeNet5(lr=0.05), DigitsDataModule())
