"""FedASMU: formulas against autograd and hand values, the fresh-model request in virtual time, RL, ablations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import ReversedExecutor, make_update
from conftest import global_weights, make_trainer, run

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import Algorithm, FedASMU, FedASMU_0, FedASMU_DA, FedASMU_FA, FedAsync
from lit_asyncfl.client.callbacks import ClientCallback
from lit_asyncfl.client.fresh_merge import FreshModelMerge
from lit_asyncfl.client.time_slots import TimeSlotSelector, first_request
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import DeviceModel
from lit_asyncfl.functional.fedasmu import (
    fedasmu_alpha,
    fedasmu_alpha_grads,
    fedasmu_beta,
    fedasmu_beta_grads,
    fedasmu_phi,
    fedasmu_xi,
)
from lit_asyncfl.functional.rl import epsilon_greedy, q_learning_update
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.schedulers import KeepConcurrency, PeriodicTrigger
from lit_asyncfl.server import Mixing
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.dynamic_weight import DynamicStalenessWeight

# ---------------------------------------------------------------------------------------------- formulas


@pytest.mark.parametrize(
    ("lam", "sigma", "iota", "t", "s", "mu"),
    [(1.0, 1.0, 0.2, 100, 5, 1.0), (2.5, 0.3, 0.0, 7, 1, 3.0), (0.4, 2.0, 1.5, 0, 2, 0.5)],
)
def test_alpha_and_its_hyper_gradients_match_autograd(lam, sigma, iota, t, s, mu):
    params = torch.tensor([lam, sigma, iota], dtype=torch.float64, requires_grad=True)
    xi = params[0] / torch.sqrt(torch.tensor(float(max(t, 1) * s), dtype=torch.float64) * params[1]) + params[2]
    alpha = mu * xi / (1 + mu * xi)
    alpha.backward()
    xi, alpha = float(xi.detach()), float(alpha.detach())
    assert fedasmu_xi(lam, sigma, iota, t, s) == pytest.approx(xi)
    assert fedasmu_alpha(xi, mu) == pytest.approx(alpha)
    inner = -0.37  # <g, Delta_prev>
    grads = fedasmu_alpha_grads(lam, sigma, iota, t, s, mu, inner)
    assert grads == pytest.approx((inner * params.grad).tolist(), rel=1e-10)


@pytest.mark.parametrize(("gamma", "upsilon", "g", "o", "mu"), [(10.0, 0.5, 50, 41, 1.0), (3.0, 1.7, 4, 1, 2.0)])
def test_beta_and_its_hyper_gradients_match_autograd(gamma, upsilon, g, o, mu):
    params = torch.tensor([gamma, upsilon], dtype=torch.float64, requires_grad=True)
    phi = params[0] / math.sqrt(g) * (1 - params[1] / math.sqrt(g - o + 1))
    beta = mu * phi / (1 + mu * phi)
    beta.backward()
    phi, beta = float(phi.detach()), float(beta.detach())
    assert fedasmu_phi(gamma, upsilon, g, o) == pytest.approx(phi)
    assert fedasmu_beta(phi, mu) == pytest.approx(beta)
    inner = 2.5
    assert fedasmu_beta_grads(gamma, upsilon, g, o, mu, inner) == pytest.approx((inner * params.grad).tolist())


def test_hand_values_and_clamps():
    # xi = 2 / sqrt(4 * 1 * 1) + 0.5 = 1.5; alpha = 2 * 1.5 / (1 + 3) = 0.75
    assert fedasmu_alpha(fedasmu_xi(2.0, 1.0, 0.5, 4, 1), mu_alpha=2.0) == 0.75
    # g = 4, o = 1: phi = 4 / sqrt(4) * (1 - 1 / sqrt(4 - 1 + 1)) = 1; beta = 3 * 1 / (1 + 3) = 0.75
    assert fedasmu_beta(fedasmu_phi(4.0, 1.0, 4, 1), mu_beta=3.0) == 0.75
    # negative xi / phi are clamped to 0: zero weight and zero hyper-gradient
    assert fedasmu_xi(1.0, 1.0, -5.0, 4, 1) == 0.0 and fedasmu_alpha_grads(1.0, 1.0, -5.0, 4, 1, 1.0, 3.0) == (0, 0, 0)
    assert fedasmu_phi(1.0, 9.0, 4, 1) == 0.0 and fedasmu_beta_grads(1.0, 9.0, 4, 1, 1.0, 3.0) == (0, 0)
    with pytest.raises(ValueError, match="must be newer"):
        fedasmu_phi(1.0, 0.5, 3, 3)


# ---------------------------------------------------------------------------------------------- server weight


def _update(client, weights, base, base_version, lr=0.1, steps=2):
    return make_update(client, weights, base, base_version, num_steps=steps, info={"lr": lr})


def test_dynamic_weight_updates_control_parameters_from_the_previous_aggregation():
    cb = DynamicStalenessWeight(
        mu_alpha=1.0, lambda0=1.0, sigma0=1.0, iota0=0.2, lr_lambda=0.1, lr_sigma=0.1, lr_iota=0.1
    )
    server = Server(torch.tensor([0.0, 0.0]), Mixing(alpha=1.0), [cb], 1)
    server.on_fit_start()
    server.version = 3
    # first upload of device 0: initial controls; t = 3, s = 3 - 2 + 1 = 2
    first = _update(0, [1.0, 2.0], [0.0, 0.0], base_version=2)
    xi1 = 1.0 / math.sqrt(3 * 2 * 1.0) + 0.2
    alpha1 = xi1 / (1 + xi1)
    server.receive(first)
    assert first.info["alpha"] == pytest.approx(alpha1)
    assert torch.allclose(server.weights, torch.tensor([1.0, 2.0]) * alpha1)
    assert cb.controls(0) == (1.0, 1.0, 0.2)
    delta_prev = torch.tensor([1.0, 2.0])  # w_i - w_before (w_before = 0)
    # second upload: g = (w_o - w_i) / (lr * steps) = ([0.5, 0.5] - [0.3, 0.9]) / 0.2 = [1, -2]
    w_before = server.weights.clone()
    second = _update(0, [0.3, 0.9], [0.5, 0.5], base_version=4)
    server.receive(second)
    inner = float(torch.dot(torch.tensor([1.0, -2.0]), delta_prev))  # = -3
    d = fedasmu_alpha_grads(1.0, 1.0, 0.2, 3, 2, 1.0, inner)
    lam, sigma, iota = 1.0 - 0.1 * d[0], 1.0 - 0.1 * d[1], 0.2 - 0.1 * d[2]
    assert cb.controls(0) == pytest.approx((lam, sigma, iota))
    alpha2 = fedasmu_alpha(fedasmu_xi(lam, sigma, iota, 4, 1), 1.0)  # t = 4, s = 4 - 4 + 1 = 1
    assert second.info["alpha"] == pytest.approx(alpha2)
    assert torch.allclose(server.weights, (1 - alpha2) * w_before + alpha2 * torch.tensor([0.3, 0.9]))


# ---------------------------------------------------------------------------------------------- device merge


def test_fresh_merge_matches_an_independent_computation():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    torch.manual_seed(0)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    shards = ClientShards(x, y, [np.arange(12)])
    model = LogisticRegression(input_dim=4, num_classes=3, lr=0.1)
    selector = TimeSlotSelector(num_slots=2)
    merge = FreshModelMerge(mu_beta=1.0, gamma0=4.0, upsilon0=1.0, lr_gamma=0.5, lr_upsilon=0.5, selector=selector)
    local = LocalTrainer(model, shards, batch_size=6, callbacks=[merge])
    start = local.flat.read()
    fresh = start + 0.5
    job = ClientJob(7, 0, 1, 0.0, JobTiming(0, 1, 0), seed=11, local_epochs=1, num_steps=2)
    job.request_step = merge.request_step(job)
    assert job.request_step in (1, 2)
    update = local.train(job, start, fresh=(fresh, 4))

    # Independent replay with plain tensors: the same batches, merge after request_step steps.
    w = start.clone()
    order = torch.randperm(12, generator=torch.Generator().manual_seed(11))
    batches = [order[:6], order[6:]]

    def loss_at(vec, idx):
        return F.cross_entropy(x[idx] @ vec[:12].view(3, 4).T + vec[12:], y[idx])

    for i, idx in enumerate(batches):
        w_var = w.clone().requires_grad_(True)
        loss_at(w_var, idx).backward()
        w = w - 0.1 * w_var.grad
        if i + 1 == job.request_step:
            phi = 4.0 / math.sqrt(4) * (1 - 1.0 / math.sqrt(4 - 1 + 1))  # g = 4, o = 1
            beta = phi / (1 + phi)
            before = loss_at(w, idx).item()
            merged = (1 - beta) * w + beta * fresh
            m_var = merged.clone().requires_grad_(True)
            after = loss_at(m_var, idx)
            after.backward()
            inner = float(torch.dot(m_var.grad, fresh - w))
            dg, du = fedasmu_beta_grads(4.0, 1.0, 4, 1, 1.0, inner)
            expected_controls = (4.0 - 0.5 * dg, 1.0 - 0.5 * du)
            expected_reward = before - after.item()
            w = merged
    assert torch.allclose(update.weights, w, atol=1e-6)
    assert update.info["beta"] == pytest.approx(beta)
    assert update.info["reward"] == pytest.approx(expected_reward, abs=1e-6)
    assert merge.controls(0) == pytest.approx(expected_controls, abs=1e-6)
    assert 0 in selector.q_tables  # first reward trained the meta-policy and started the device's Q-table


# ---------------------------------------------------------------------------------------------- virtual time


class FixedDevices(DeviceModel):
    """Client 0 is the reference device, client 1 four times slower (compute and network)."""

    def slowness(self, num_clients, rng):
        return np.array([1.0, 4.0])


class RequestHalfway(ClientCallback):
    """Client 1 requests after 4 of its 8 steps; records what the server answered."""

    def __init__(self):
        self.answers = []

    def request_step(self, job):
        return 4 if job.client == 1 else None

    def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
        self.answers.append((job.job_id, fresh_version, fresh_weights.clone()))


class VersionLog(ServerCallback):
    def __init__(self):
        self.weights = {}
        self.times = {}

    def on_aggregated(self, server, updates):
        self.weights[server.version] = server.weights.clone()
        self.times[server.version] = server.now


@pytest.mark.parametrize("slow_partner", [False, True])
def test_fresh_model_request_happens_at_the_right_virtual_time_with_the_version_current_then(tmp_path, slow_partner):
    requester, log = RequestHalfway(), VersionLog()
    algo = Algorithm(KeepConcurrency(2), Mixing(alpha=0.5), [log], [requester])
    bytes_per_model = sum(p.numel() for p in LeNet5().parameters()) * 4
    devices = FixedDevices(time_per_sample=0.01 if not slow_partner else 0.2, bandwidth=bytes_per_model / 2.0)
    trainer = make_trainer(tmp_path, algo, num_clients=2, max_virtual_time=80.0, device_model=devices)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="iid", batch_size=100))
    sim = trainer.simulator
    n0, _n1 = sim.num_samples  # 719 and 718 samples: 8 steps of <= 100 samples
    tps = devices.time_per_sample
    if not slow_partner:
        # Client 0 (tps 0.01): download 2 s, compute 7.19 s, upload 2 s: versions at 11.19, 22.38, 33.57, ...
        assert log.times[1] == pytest.approx(2 + n0 * tps + 2) and log.times[2] == pytest.approx(2 * log.times[1])
        # Client 1 (4x slower): download 8 s, 400 of 718 samples at 0.04 s before the request: t = 8 + 16 = 24 s
        request_time = 8 + 400 * 4 * tps
        assert request_time == pytest.approx(24.0)
        (_job_id, version, weights), *_ = requester.answers
        assert version == 2 and log.times[2] < request_time < log.times[3]
        assert torch.equal(weights, log.weights[2])  # exactly the global model current at the request
        # arrival: fresh download (8 s) + remaining 318 samples + upload (8 s)
        arrival = request_time + 8 + 318 * 4 * tps + 8
        slow_versions = [v for v, t in log.times.items() if t == pytest.approx(arrival)]
        assert len(slow_versions) == 1
        # every dispatch downloads a model, and so does every answered request
        assert sim.server.stats.bytes_down == (sim.next_job_id + len(requester.answers)) * bytes_per_model
    else:
        # Client 0 is now slow too (tps 0.2: 2 + 143.8 + 2 s): nothing newer at client 1's request (t = 8 + 320)
        # ... but client 1 never gets there within 80 s; check the request event is pending at the right time.
        job = next(j for j in sim.in_flight.values() if j.client == 1)
        assert job.request_time == pytest.approx(8 + 400 * 4 * tps)
        assert requester.answers == [] and job.fresh_version is None


def test_no_newer_model_means_no_download_and_no_merge(tmp_path):
    requester, log = RequestHalfway(), VersionLog()
    algo = Algorithm(KeepConcurrency(2), Mixing(alpha=0.5), [log], [requester])
    bytes_per_model = sum(p.numel() for p in LeNet5().parameters()) * 4

    class SlowFirst(DeviceModel):
        def slowness(self, num_clients, rng):
            return np.array([20.0, 1.0])  # client 0 arrives long after client 1's request

    devices = SlowFirst(time_per_sample=0.01, bandwidth=bytes_per_model / 2.0)
    trainer = make_trainer(tmp_path, algo, num_clients=2, max_virtual_time=30.0, device_model=devices)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="iid", batch_size=100))
    n1 = trainer.simulator.num_samples[1]
    # client 1: 2 + 7.18 + 2 = 11.18 s, no extra download; arrives first: version 1 at 11.18
    assert requester.answers == []
    assert log.times[1] == pytest.approx(2 + n1 * 0.01 + 2)


# ---------------------------------------------------------------------------------------------- RL


def test_q_learning_on_a_fixed_reward_sequence_matches_hand_computation():
    q = np.zeros((3, 3))
    q = q_learning_update(q, 0, 2, reward=1.0, next_state=1, lr=0.5, discount=0.9)  # H(0,2) = 0.5
    q = q_learning_update(q, 1, 2, reward=2.0, next_state=2, lr=0.5, discount=0.9)  # H(1,2) = 1.0
    q = q_learning_update(q, 0, 2, reward=1.0, next_state=1, lr=0.5, discount=0.9)
    # H(0,2) = 0.5 + 0.5 * (1 + 0.9 * max H(1,.) - 0.5) = 0.5 + 0.5 * (1 + 0.9 - 0.5) = 1.2
    assert q[0, 2] == pytest.approx(1.2) and q[1, 2] == pytest.approx(1.0)
    assert q.sum() == pytest.approx(2.2)


def test_epsilon_greedy_frequencies():
    rng = np.random.default_rng(0)
    values = np.array([0.0, 3.0, 1.0])
    assert {epsilon_greedy(values, 0.0, rng) for _ in range(200)} == {1}
    picks = np.array([epsilon_greedy(values, 0.3, rng) for _ in range(20_000)])
    assert np.mean(picks != 1) == pytest.approx(0.3 * 2 / 3, abs=0.015)  # random picks land elsewhere 2/3 of the time
    picks = np.array([epsilon_greedy(values, 1.0, rng) for _ in range(30_000)])
    assert np.bincount(picks) / len(picks) == pytest.approx([1 / 3] * 3, abs=0.015)


def test_selector_switches_from_meta_policy_to_q_learning_and_learns_from_rewards():
    sel = TimeSlotSelector(num_slots=4, epsilon=0.0, q_lr=0.5, discount=0.9, baseline_rate=0.5)
    first = sel.choose(client=3, job_id=0, seed=1)
    assert "meta" in sel.pending[0]
    sel.reward(0, reward=2.0)
    assert sel.baseline == 1.0 and sel.slots[3] == first and np.all(sel.q_tables[3] == 0)
    second = sel.choose(client=3, job_id=1, seed=2)  # greedy on an all-zero row: a random tie-break
    action = sel.pending[1]["action"]
    assert second == min(4, max(1, first + (-1, 0, 1)[action]))
    sel.reward(1, reward=1.0)
    # H(first, action) = 0 + 0.5 * (1 + 0.9 * 0 - 0) = 0.5, nothing else changes
    assert sel.q_tables[3][first - 1, action] == pytest.approx(0.5) and sel.q_tables[3].sum() == pytest.approx(0.5)
    assert sel.slots[3] == second
    sel.choose(client=3, job_id=2, seed=3)
    sel.forget(2)  # no reward: nothing learned
    assert sel.pending == {} and sel.slots[3] == second


def test_reinforce_moves_the_meta_policy_toward_the_rewarded_slot():
    sel = TimeSlotSelector(num_slots=4, rl_lr=0.3, baseline_rate=0.2)
    before = sel.request_probabilities()
    assert sum(before) == pytest.approx(1.0)
    for job in range(400):
        slot = sel.choose(client=job, job_id=job, seed=job)  # new client each time: always the meta-policy
        sel.reward(job, reward=1.0 if slot == 3 else 0.0)
    after = sel.request_probabilities()
    assert after[2] > before[2] + 0.3 and after[2] > 0.5, (before, after)


def test_first_request_slot():
    assert first_request([0, 0, 1, 0]) == 3 and first_request([1, 1]) == 1 and first_request([0, 0]) == 2


# ---------------------------------------------------------------------------------------------- whole runs


def test_fedasmu_0_equals_fedasync_polynomial_with_the_same_bound_under_the_periodic_trigger(tmp_path):
    asmu0 = run(tmp_path / "a", FedASMU_0(period=10, clients_per_trigger=3, max_parallel=4, tau_max=5), max_versions=30)
    fedasync = FedAsync(alpha=0.6, staleness="polynomial", a=0.5, max_staleness=4)
    fedasync.scheduler = PeriodicTrigger(period=10, clients_per_trigger=3, max_parallel=4)
    reference = run(tmp_path / "b", fedasync, max_versions=30)
    assert torch.equal(global_weights(asmu0), global_weights(reference))
    assert asmu0.summary["updates_discarded"] == reference.summary["updates_discarded"]


@pytest.mark.parametrize(
    ("preset", "dynamic", "fresh"),
    [(FedASMU, True, True), (FedASMU_DA, False, True), (FedASMU_FA, True, False), (FedASMU_0, False, False)],
)
def test_ablation_presets_switch_the_right_parts(preset, dynamic, fresh):
    algo = preset()
    names = {type(cb).__name__ for cb in algo.server_callbacks}
    assert ("DynamicStalenessWeight" in names) == dynamic and ("StalenessWeight" in names) != dynamic
    assert bool(algo.client_callbacks) == fresh
    assert algo.hparams["dynamic_weights"] == dynamic and algo.hparams["fresh_merge"] == fresh


def _fedasmu():
    return FedASMU(clients_per_trigger=3, max_parallel=4, num_slots=3, lr_gamma=1e-2, lr_lambda=1e-2)


def test_fedasmu_run_merges_fresh_models(tmp_path):
    infos = []

    class Info(ServerCallback):
        def on_aggregated(self, server, updates):
            infos.extend(u.info for u in updates)

    algo = _fedasmu()
    algo.server_callbacks.append(Info())
    first = run(tmp_path / "a", algo, max_versions=40, data_kwargs={"partition": "dirichlet"})
    merged = [i for i in infos if "beta" in i]
    assert len(merged) > 10 and all(0 < i["beta"] < 1 and i["fresh_version"] >= 1 for i in merged)
    assert all(0 < i["alpha"] < 1 for i in infos)
    sim = first.simulator
    answered = len(merged) + sum(j.fresh_version is not None for j in sim.in_flight.values())  # + not yet arrived
    assert first.summary["bytes_down"] == (sim.next_job_id + answered) * sim.model_bytes


@pytest.mark.parametrize("preset", [FedASMU_FA, FedASMU_DA], ids=["no-requests", "requests"])
def test_fedasmu_runs_are_identical_whatever_order_jobs_are_computed_in(tmp_path, monkeypatch, preset):
    """Without requests (FA) jobs are computed newest-first in batches; with requests at their request events."""

    def algo():
        return preset(clients_per_trigger=3, max_parallel=4, num_slots=3, lr_lambda=1e-2)

    kwargs = {"max_versions": 30, "data_kwargs": {"partition": "dirichlet"}}
    first = run(tmp_path / "a", algo(), **kwargs)
    executors = []
    monkeypatch.setattr(
        trainer_module, "SequentialExecutor", lambda t: executors.append(ReversedExecutor(t)) or executors[-1]
    )
    second = run(tmp_path / "b", algo(), **kwargs)
    if preset is FedASMU_FA:
        assert executors[0].compute_order != sorted(executors[0].compute_order)
    assert torch.equal(global_weights(first), global_weights(second))


def test_fedasmu_resume_is_exact_with_all_its_state(tmp_path):
    data = {"partition": "dirichlet"}
    windows = []

    class Windows(ServerCallback):
        def on_aggregated(self, server, updates):
            windows.extend((u.job.request_time, u.job.arrival_time) for u in updates if u.job.fresh_version)

    algo = _fedasmu()
    algo.server_callbacks.append(Windows())
    full = run(tmp_path / "full", algo, max_versions=40, data_kwargs=data)
    request, arrival = windows[len(windows) // 2]
    stop = (request + arrival) / 2  # a merged job is computed and waits for its arrival
    first = run(tmp_path / "first", _fedasmu(), max_virtual_time=stop, data_kwargs=data)
    sim, merge = first.simulator, first.algorithm.client_callbacks[0]
    assert sim.ready  # an update computed at its request, not yet arrived
    assert merge.selector.pending  # jobs dispatched whose request has not come yet
    assert merge.selector.q_tables and merge._controls and first.algorithm.server_callbacks[1]._previous
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", _fedasmu(), max_versions=40)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    a, b = resumed.algorithm.client_callbacks[0], full.algorithm.client_callbacks[0]
    assert a._controls == b._controls and a.selector.baseline == b.selector.baseline
    assert a.selector.slots == b.selector.slots and a.selector.pending == b.selector.pending
    assert all(np.array_equal(a.selector.q_tables[c], b.selector.q_tables[c]) for c in b.selector.q_tables)
    for p, q in zip(a.selector.policy.parameters(), b.selector.policy.parameters()):
        assert torch.equal(p, q)
    da, db = resumed.algorithm.server_callbacks[1], full.algorithm.server_callbacks[1]
    assert da._controls == db._controls and da._previous.keys() == db._previous.keys()
    assert all(torch.equal(da._previous[c]["delta"], db._previous[c]["delta"]) for c in db._previous)


# ---------------------------------------------------------------------------------------------- edge cases


class DropoutBatchNormNet(LogisticRegression):
    def __init__(self):
        super().__init__(input_dim=4, num_classes=3, lr=0.1)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)
        )


def test_a_merge_with_an_identical_fresh_model_changes_nothing():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    merge = FreshModelMerge(selector=TimeSlotSelector(num_slots=2))
    local = LocalTrainer(DropoutBatchNormNet(), ClientShards(x, y, [np.arange(8)]), batch_size=8, callbacks=[merge])
    local.module.train()
    job = ClientJob(3, 0, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1, num_steps=1)
    merge.request_step(job)
    local.job_info = {}
    weights = local.flat.read()
    rng = torch.random.get_rng_state()
    merge.on_fresh_model(local, job, weights.clone(), 5, [x, y])
    assert local.job_info["reward"] == 0.0  # same weights, same dropout masks
    assert torch.equal(local.flat.read(), weights)  # BatchNorm statistics untouched by the extra passes
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_request_after_the_last_step_uploads_the_merged_model(tmp_path):
    fresh_by_job, uploads = {}, []

    class TakeFresh(ClientCallback):
        def request_step(self, job):
            return job.num_steps

        def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
            trainer.flat.flat.copy_(fresh_weights)
            fresh_by_job[job.job_id] = fresh_weights.clone()

    class Uploads(ServerCallback):
        def reject_update(self, server, update):
            uploads.append((update.job, update.weights.clone(), server.now))

    algo = Algorithm(KeepConcurrency(2), Mixing(alpha=0.5), [Uploads()], [TakeFresh()])
    bytes_per_model = sum(p.numel() for p in LeNet5().parameters()) * 4
    devices = FixedDevices(time_per_sample=0.01, bandwidth=bytes_per_model / 2.0)
    trainer = make_trainer(tmp_path, algo, num_clients=2, max_versions=8, device_model=devices)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="iid", batch_size=100))
    merged = [(job, w, now) for job, w, now in uploads if job.job_id in fresh_by_job]
    assert merged
    for job, weights, now in merged:
        assert job.request_step == job.num_steps and job.request_fraction == 1.0
        assert job.request_time == pytest.approx(job.dispatch_time + job.timing.download + job.timing.compute)
        assert now == pytest.approx(job.request_time + job.timing.download + job.timing.upload)  # fresh download
        assert torch.equal(weights, fresh_by_job[job.job_id])  # no step after the merge: uploaded as merged


def test_tau_max_bounds_t_minus_o_plus_one_and_discarded_updates_teach_nothing():
    algo = FedASMU(tau_max=3)
    _, dynamic = algo.server_callbacks
    server = Server(torch.zeros(2), algo.aggregator, algo.server_callbacks, 1)
    server.on_fit_start()
    server.version = 10
    assert not server.receive(_update(0, [1.0, 1.0], [0.0, 0.0], base_version=7))  # 10 - 7 + 1 = 4 > 3
    assert server.stats.discarded == 1 and dynamic._previous == {} and dynamic._controls == {}
    assert server.receive(_update(0, [1.0, 1.0], [0.0, 0.0], base_version=8))  # 10 - 8 + 1 = 3: kept
    assert 0 in dynamic._previous


def test_slots_map_to_valid_steps_even_with_more_slots_than_steps():
    merge = FreshModelMerge(selector=TimeSlotSelector(num_slots=20))
    steps = []
    for slot in range(1, 21):
        job = ClientJob(slot, 0, 0, 0.0, JobTiming(0, 1, 0), seed=slot, local_epochs=1, num_steps=3)
        merge.selector.choose = lambda client, job_id, seed, slot=slot: slot
        steps.append(merge.request_step(job))
    assert steps == sorted(steps) and set(steps) == {1, 2, 3}


def test_fedasmu_with_momentum_and_frozen_parameters_runs(tmp_path):
    model = LeNet5(lr=0.05, momentum=0.9)
    model.net[0][0].weight.requires_grad_(False)
    frozen = model.net[0][0].weight.detach().clone()
    trainer = make_trainer(tmp_path, _fedasmu(), max_versions=15)
    trainer.fit(model, datamodule=DigitsDataModule())
    assert trainer.summary["versions"] == 15
    assert torch.equal(trainer.global_model.net[0][0].weight, frozen)


def test_two_requesting_callbacks_share_the_earliest_request():
    seen = []

    class Ask(ClientCallback):
        def __init__(self, step):
            self.step = step

        def request_step(self, job):
            return self.step

        def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
            seen.append((self.step, job.request_step))

    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.client.sequential import SequentialExecutor
    from lit_asyncfl.core.simulator import Simulator
    from lit_asyncfl.data import ClientShards

    shards = ClientShards(torch.randn(40, 64), torch.randint(0, 10, (40,)), [np.arange(20), np.arange(20, 40)])
    callbacks = [Ask(3), Ask(2)]
    local = LocalTrainer(LogisticRegression(input_dim=64), shards, batch_size=5, callbacks=callbacks)
    server = Server(local.flat.read(), Mixing(0.5), [], 2)
    sim = Simulator(
        server,
        KeepConcurrency(2),
        SequentialExecutor(local),
        FixedDevices(bandwidth=math.inf),  # client 1 asks (at 40 s) after client 0 arrived (at 20 s)
        [20, 20],
        local_epochs=1,
        batch_size=5,
        seed=0,
        model_bytes=4,
        client_callbacks=callbacks,
    )
    sim.scheduler.setup(2)
    sim.start()
    assert [j.request_step for j in sim.in_flight.values()] == [2, 2]
    sim.run(max_versions=2)
    assert seen and {s for _, s in seen} == {2} and {a for a, _ in seen} == {2, 3}
