"""FedADT: the held-out distillation set, server time, composition with FedBuff, determinism across executors and
exact resume while the server is busy, the paper's composition (its formula: functional/test_distillation.py; its
server callback: server/test_distillation.py)."""

from __future__ import annotations

import pytest
import torch
from builders import ReversedExecutor
from conftest import global_weights, make_trainer, run

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import FedADT, FedBuff
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.distillation import DistillationCorrection


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
