"""FedADT: the distillation loss and weight by hand, the correction, the held-out set, server time, composition."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import ReversedExecutor, make_update
from conftest import global_weights, make_trainer, run

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import FedADT, FedBuff
from lit_asyncfl.client.callbacks import LearningRateDecay
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.functional.distillation import adaptive_distillation_weight, distillation_loss
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.server import Mixing
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.distillation import DistillationCorrection


def test_distillation_loss_equals_a_hand_computation():
    student = torch.tensor([[1.0, 2.0, 0.0], [0.5, -1.0, 1.5]])
    teacher = torch.tensor([[2.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    y = torch.tensor([1, 2])
    a, temp = 0.3, 2.0

    def softmax(z):
        e = [math.exp(v) for v in z]
        return [v / sum(e) for v in e]

    kl = ce = 0.0
    for s_row, t_row, label in zip(student.tolist(), teacher.tolist(), y.tolist()):
        p = softmax([v / temp for v in t_row])
        q = softmax([v / temp for v in s_row])
        kl += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
        ce += -math.log(softmax(s_row)[label])
    expected = a * kl / 2 + (1 - a) * ce / 2  # both averaged over the batch of 2
    assert float(distillation_loss(student, teacher, y, a, temp)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(("t", "expected"), [(0, 0.2), (500, 0.4), (1000, 0.6), (2000, 0.6)])
def test_adaptive_weight_at_0_half_full_and_twice_the_ramp(t, expected):
    assert adaptive_distillation_weight(t, 0.2, 0.6, 1000) == pytest.approx(expected)
    assert DistillationCorrection(weight_min=0.2, weight_max=0.6, ramp_versions=1000).weight(t) == pytest.approx(
        expected
    )
    assert DistillationCorrection(fixed_weight=0.6).weight(t) == 0.6


def _server_with_data(model, n=64, threshold=1, **kwargs):
    torch.manual_seed(0)
    cb = DistillationCorrection(staleness_threshold=threshold, **kwargs)
    x = torch.randn(n, 1, 8, 8)
    server = Server(
        ModelWorkspace(model).flat.read(),
        Mixing(alpha=1.0),
        [cb],
        1,
        data=(x, torch.randint(0, 10, (n,))),
        workspace_factory=lambda: ModelWorkspace(model),
    )
    server.on_fit_start()
    return server, cb


def _kl_to_teacher(model, student, teacher, x, temp=3.0):
    ws = ModelWorkspace(model)
    with torch.no_grad():
        ws.flat.load(teacher)
        t = ws.module.eval()(x)
        ws.flat.load(student)
        s = ws.module(x)
    return float(
        F.kl_div(F.log_softmax(s / temp, -1), F.log_softmax(t / temp, -1), reduction="batchmean", log_target=True)
    )


def test_each_distillation_pass_lowers_the_kl_to_the_global_model():
    # A fixed init: the test must not depend on the tests that ran before it. At lr 0.5 a pass can overshoot for
    # some inits (the first pass raised the KL for seed 3 of seeds 0-5), so the claim is for this one.
    torch.manual_seed(0)
    model = LeNet5()
    server, cb = _server_with_data(model, fixed_weight=1.0, lr=0.5)  # the KL term alone, the paper's T = 3
    teacher = server.weights
    student = teacher + 0.2 * torch.randn(teacher.shape, generator=torch.Generator().manual_seed(1))
    x = server.data[0]
    kls = [_kl_to_teacher(model, student, teacher, x)]
    for p in range(3):
        student = cb.distill(server, student, client_lr=0.5, seed=p)
        kls.append(_kl_to_teacher(model, student, teacher, x))
    assert kls == sorted(kls, reverse=True) and kls[-1] < 0.8 * kls[0], kls
    assert torch.equal(server.weights, teacher)  # the teacher is not modified


def _update(weights, base_version, lr=0.05):
    return make_update(0, weights, weights.clone(), base_version, info={"lr": lr})


def test_only_updates_staler_than_the_threshold_are_distilled():
    model = LeNet5()
    server, _ = _server_with_data(model, threshold=1)
    server.version = 5
    fresh = _update(server.weights + 0.01, base_version=4)  # staleness 1: not above the threshold
    kept = fresh.weights.clone()
    assert server.processing_time(fresh) == 0.0
    server.receive(fresh)
    assert "distilled" not in fresh.info and torch.equal(fresh.weights, kept)
    stale = _update(server.weights + 0.01, base_version=3)  # staleness 6 - 3 = 3 > 1
    before = stale.weights.clone()
    assert server.processing_time(stale) == pytest.approx(64 * 0.01)
    server.receive(stale)
    assert stale.info["distilled"] and not torch.equal(stale.weights, before)


def test_the_distillation_set_is_held_out_of_clients_and_evaluation(tmp_path):
    trainer = make_trainer(tmp_path, FedADT(concurrency=3, data_fraction=0.05), num_clients=10, max_versions=3)
    dm = DigitsDataModule()
    trainer.fit(LeNet5(), datamodule=dm)
    server_x, server_y = trainer.simulator.server.data
    assert len(server_y) == round(0.05 * 1437) == 72
    train_x = dm.train_set.tensors[0]
    test_x = dm.test_set.tensors[0]
    shards = trainer.simulator.executor.trainer.shards
    client_total = sum(shards.num_samples(c) for c in range(10))
    assert client_total + len(server_y) == 1437 and len(train_x) == client_total  # sizes add up

    def rows(x):
        return {tuple(r.tolist()) for r in x.flatten(1)}

    server_rows = rows(server_x)
    assert not server_rows & rows(train_x)  # no client has them
    assert not server_rows & rows(test_x)  # evaluation never sees them
    assert not server_rows & rows(torch.cat([b[0] for loader in trainer.evaluation.batches for b in loader]))


def test_distillation_time_delays_the_new_version_and_queues_later_arrivals(tmp_path):
    times = []

    class Log(ServerCallback):
        def on_aggregated(self, server, updates):
            times.append((server.now, updates[0].job.arrival_time, updates[0].info.get("distilled", False)))

    algo = FedADT(concurrency=4, data_fraction=0.05, server_time_per_sample=2.0)  # 72 samples: 144 s per distillation
    algo.server_callbacks.append(Log())
    trainer = make_trainer(tmp_path, algo, num_clients=10, max_versions=30, device_model=UniformResponse(0.0, 500.0))
    trainer.fit(LeNet5(), datamodule=DigitsDataModule())
    distilled = [(now, arrival) for now, arrival, d in times if d]
    assert distilled
    previous_end = 0.0
    for now, arrival, d in times:
        start = max(arrival, previous_end)  # the server works on one update at a time, in arrival order
        assert now == pytest.approx(start + (144.0 if d else 0.0))
        previous_end = now


def test_learning_rate_decays_with_the_global_version():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    shards = ClientShards(torch.randn(8, 64), torch.randint(0, 10, (8,)), [np.arange(8)])
    local = LocalTrainer(LogisticRegression(input_dim=64, lr=0.01), shards, 4, callbacks=[LearningRateDecay(0.9999)])
    job = ClientJob(0, 0, 5000, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    update = local.train(job, local.flat.read())
    assert update.info["lr"] == pytest.approx(0.01 * 0.9999**5000)
    assert local.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.9999**5000)


def test_distillation_composes_with_fedbuff(tmp_path):
    algo = FedBuff(buffer_size=3, concurrency=5)
    algo.server_callbacks.insert(0, DistillationCorrection(data_fraction=0.02))
    flags = []

    class Log(ServerCallback):
        def on_aggregated(self, server, updates):
            flags.extend(u.info.get("distilled", False) for u in updates)

    algo.server_callbacks.append(Log())
    trainer = make_trainer(tmp_path, algo, max_versions=10, device_model=UniformResponse(0.0, 100.0))
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert any(flags) and not all(flags)
    assert trainer.simulator.server.data is not None and len(trainer.simulator.server.data[1]) == round(0.02 * 1437)


def _fedadt():
    return FedADT(concurrency=4, data_fraction=0.03, server_time_per_sample=1.0)


def test_fedadt_is_deterministic_across_executors_and_resumes_exactly_while_the_server_is_busy(tmp_path, monkeypatch):
    devices = UniformResponse(0.0, 300.0)
    log = []

    class Log(ServerCallback):
        def on_aggregated(self, server, updates):
            u = updates[0]
            log.append((server.now, u.job.arrival_time, server.processing_time(u) if u.info.get("distilled") else 0))

    algo = _fedadt()
    algo.server_callbacks.append(Log())
    full = run(tmp_path / "full", algo, max_versions=25, device_model=devices)
    # a moment when the server is distilling one update while another has arrived and waits
    stop = next(
        (arrival + end) / 2 for end, _, cost in log if cost for _, arrival, _ in log if end - cost < arrival < end
    )
    first = run(tmp_path / "first", _fedadt(), max_virtual_time=stop, device_model=devices)
    assert first.simulator.server_busy_until > first.simulator.now and first.simulator.waiting
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", _fedadt(), max_versions=25, device_model=devices)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    monkeypatch.setattr(trainer_module, "SequentialExecutor", ReversedExecutor)
    reordered = run(tmp_path / "rev", _fedadt(), max_versions=25, device_model=devices)
    assert torch.equal(global_weights(reordered), global_weights(full))


def test_fedadt_preset_is_the_paper_composition():
    algo = FedADT()
    distill, weight = algo.server_callbacks
    assert (distill.staleness_threshold, distill.temperature, distill.server_data_fraction) == (1, 3.0, 0.005)
    assert weight.function == "polynomial" and weight.a == 0.5  # beta = 1 / sqrt(tau + 1)
    assert algo.scheduler.concurrency == 0.2 and algo.client_callbacks[0].decay == 0.9999
