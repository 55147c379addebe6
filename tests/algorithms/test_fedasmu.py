"""FedASMU: the fresh-model request in virtual time, ablations, whole runs (merges, order of computation, exact
resume), momentum and frozen parameters (its formulas: functional/test_fedasmu.py; its parts:
server/test_dynamic_weight.py, client_callbacks/test_fresh_merge.py, rl/test_time_slots.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from builders import ReversedExecutor
from conftest import global_weights, make_trainer, run

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import Algorithm, FedASMU, FedASMU_0, FedASMU_DA, FedASMU_FA, FedAsync
from lit_asyncfl.client.callbacks import ClientCallback
from lit_asyncfl.core.server import Server
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import DeviceModel
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.schedulers import KeepConcurrency, PeriodicTrigger
from lit_asyncfl.server import Mixing
from lit_asyncfl.server.base import ServerCallback

# ---------------------------------------------------------------------------------------------- formulas


# ---------------------------------------------------------------------------------------------- server weight


# ---------------------------------------------------------------------------------------------- device merge


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
