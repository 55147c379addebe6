"""The simulator: its event queue orders by (virtual time, sequence number); the design invariants, each against an
independent computation."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import ReversedExecutor
from conftest import global_weights, make_trainer, run

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import FedAsync, FedAvg, FedBuff, FedProx
from lit_asyncfl.core.simulator import EventQueue
from lit_asyncfl.core.update import derive_seed
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import DeviceModel, UniformResponse
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server import DeltaAverage


def test_events_pop_in_time_order_whatever_the_push_order():
    rng = random.Random(0)
    times = [rng.choice([0.0, 1.5, 2.0, 7.25, 10.0]) + rng.random() * 0.01 * rng.randint(0, 1) for _ in range(200)]
    q = EventQueue()
    for i, t in enumerate(times):
        q.push(t, "arrival", idx=i)
    popped = [q.pop() for _ in range(len(times))]
    expected = sorted(range(len(times)), key=lambda i: (times[i], i))  # time, then insertion order
    assert [e.data["idx"] for e in popped] == expected


def test_state_dict_round_trip_preserves_order_and_sequence():
    q = EventQueue()
    for t in [3.0, 1.0, 3.0, 2.0]:
        q.push(t, "trigger")
    q.pop()
    restored = EventQueue()
    restored.load_state_dict(q.state_dict())
    assert [(e.time, e.seq) for e in restored] == [(e.time, e.seq) for e in q]
    new = restored.push(3.0, "trigger")
    assert new.seq == 4  # numbering continues after the restored events


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_event_times_are_rejected(bad):
    with pytest.raises(ValueError, match="event time must be finite and >= 0"):
        EventQueue().push(bad, "arrival")


def test_same_seed_gives_bit_identical_weights_and_another_seed_does_not(tmp_path):
    runs = [
        run(
            tmp_path / str(i),
            FedAsync(concurrency=3),
            seed=s,
            max_versions=25,
            data_kwargs={"partition": "dirichlet", "alpha": 0.5},
        )
        for i, s in enumerate([7, 7, 8])
    ]
    a, b, c = (global_weights(t) for t in runs)
    assert torch.equal(a, b)
    assert runs[0].history == [
        {**r, "wall_time": runs[0].history[i]["wall_time"]} for i, r in enumerate(runs[1].history)
    ]
    assert not torch.equal(a, c)
    for name, tensor in runs[0].global_model.state_dict().items():  # the module holds the global weights
        assert torch.equal(tensor, runs[1].global_model.state_dict()[name]), name


def _sgd_reference(model: LeNet5, x, y, jobs: list[int], seed: int, batch_size: int, epochs: int):
    """Plain centralized SGD with the batches the simulator's job seeds define (one client holding all data)."""
    model = copy.deepcopy(model)
    for job_id in jobs:
        job_seed = derive_seed(seed, 0, job_id)
        generator = torch.Generator().manual_seed(job_seed)
        optimizer = torch.optim.SGD(model.parameters(), lr=model.lr)
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(lambda: FedAvg(clients_per_round=1), id="fedavg-one-client"),
        pytest.param(lambda: FedProx(mu=0.0, clients_per_round=1), id="fedprox-mu0-one-client"),
        pytest.param(lambda: FedAsync(alpha=1.0, staleness="constant", concurrency=1), id="fedasync-alpha1"),
    ],
)
def test_single_client_runs_equal_centralized_sgd_over_the_same_batches(tmp_path, algorithm):
    trainer = make_trainer(tmp_path, algorithm(), num_clients=1, max_versions=3, local_epochs=2)
    model = LeNet5(lr=0.05)
    initial = copy.deepcopy(model)
    dm = DigitsDataModule(batch_size=32)
    trainer.fit(model, datamodule=dm)
    x, y = dm.train_set.tensors
    expected = _sgd_reference(initial, x, y, jobs=[0, 1, 2], seed=0, batch_size=32, epochs=2)
    assert torch.equal(global_weights(trainer), expected)


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param(lambda: FedAsync(concurrency=4), id="fedasync"),
        pytest.param(lambda: FedBuff(buffer_size=3, concurrency=5), id="fedbuff-buffer-in-flight"),
        pytest.param(lambda: FedAvg(clients_per_round=4), id="fedavg-mid-round"),
        pytest.param(lambda: FedProx(mu=0.1, clients_per_round=3), id="fedprox"),
    ],
)
def test_resume_from_a_midway_checkpoint_equals_the_uninterrupted_run(tmp_path, algorithm):
    data = {"partition": "dirichlet"}
    full = run(tmp_path / "full", algorithm(), max_versions=8, data_kwargs=data)
    stop_at = 0.47 * full.simulator.now + 0.123  # an arbitrary moment between two events
    first = run(tmp_path / "first", algorithm(), max_virtual_time=stop_at, data_kwargs=data)
    midway = first.simulator
    assert 0 < midway.server.version < 8 and midway.in_flight  # really midway, with clients training
    if isinstance(midway.server.aggregator, DeltaAverage):
        assert midway.server.aggregator.buffer  # FedBuff: the checkpoint holds buffered updates
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", algorithm(), max_versions=8)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed.simulator.server.stats == full.simulator.server.stats
    assert resumed.simulator.now == full.simulator.now


def test_checkpoint_written_every_k_events_resumes_exactly(tmp_path):
    """A checkpoint taken at an arbitrary event (not at a budget boundary) resumes to the same weights."""
    full = run(tmp_path / "full", FedBuff(buffer_size=2, concurrency=4), max_versions=12)
    saved = {}

    class Spy(trainer_module.FederatedTrainer):
        def save_checkpoint(self, path):
            super().save_checkpoint(path)
            if self.simulator.events_processed == 13:
                saved["path"] = str(path) + ".at13"
                super().save_checkpoint(saved["path"])

    spy = Spy(
        FedBuff(buffer_size=2, concurrency=4),
        num_clients=10,
        max_versions=12,
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        default_root_dir=str(tmp_path / "spy"),
        checkpoint_every=1,
    )
    spy.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule())
    assert torch.equal(global_weights(spy), global_weights(full))  # checkpointing does not perturb the run
    resumed = make_trainer(tmp_path / "resumed", FedBuff(buffer_size=2, concurrency=4), max_versions=12)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=saved["path"])
    assert torch.equal(global_weights(resumed), global_weights(full))


def test_resume_with_another_configuration_is_refused(tmp_path):
    first = run(tmp_path / "a", FedAsync(concurrency=2), max_versions=3)
    ckpt = next((tmp_path / "a").rglob("last.ckpt"))
    other = make_trainer(tmp_path / "b", FedAsync(concurrency=2), num_clients=12, max_versions=5)
    with pytest.raises(ValueError, match=r"different configuration: num_clients: checkpoint 10 vs trainer 12"):
        other.fit(LeNet5(), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert first.summary["versions"] == 3


def test_updates_computed_out_of_order_are_consumed_in_virtual_time_order(tmp_path, monkeypatch):
    device_model = UniformResponse(low=0.0, high=100.0)  # arrival order unrelated to dispatch order
    reference = run(tmp_path / "seq", FedAsync(concurrency=5), max_versions=30, device_model=device_model)
    executors = []

    def make(trainer):
        executors.append(ReversedExecutor(trainer))
        return executors[-1]

    monkeypatch.setattr(trainer_module, "SequentialExecutor", make)
    reversed_run = run(tmp_path / "rev", FedAsync(concurrency=5), max_versions=30, device_model=device_model)
    order = executors[0].compute_order
    assert order != sorted(order)  # really computed out of order
    assert torch.equal(global_weights(reversed_run), global_weights(reference))


class Recorder:
    """Server callback recording (client, dispatch time, arrival time, base version) of every update."""

    def __init__(self):
        self.rows = []

    def __call__(self, algorithm):
        from lit_asyncfl.server.base import ServerCallback

        rows = self.rows

        class _Record(ServerCallback):
            def reject_update(self, server, update):
                rows.append((update.client, update.job.dispatch_time, server.now, update.base_version))

        algorithm.server_callbacks.insert(0, _Record())
        return algorithm


def test_periodic_trigger_dispatches_on_schedule_and_respects_max_parallel(tmp_path):
    from lit_asyncfl.algorithms import Algorithm
    from lit_asyncfl.schedulers import PeriodicTrigger
    from lit_asyncfl.server import Mixing

    recorder = Recorder()
    algo = recorder(Algorithm(PeriodicTrigger(period=4.0, clients_per_trigger=1, max_parallel=2), Mixing(0.5)))
    device_model = DeviceModel(time_per_sample=1.0, bandwidth=float("inf"))
    trainer = make_trainer(tmp_path, algo, num_clients=4, max_virtual_time=40.0, device_model=device_model)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="iid"))
    sizes = [trainer.simulator.num_samples[c] for c in range(4)]
    # Triggers at 0, 4, 8, ...: one client each while fewer than 2 train. Jobs last n_i seconds (>= 359 s), so
    # within 40 s only the triggers at t=0 and t=4 dispatch; later triggers find 2 clients training.
    assert trainer.simulator.num_training == 2 and not recorder.rows  # nothing arrived before 40 s
    jobs = sorted(trainer.simulator.in_flight.values(), key=lambda j: j.dispatch_time)
    assert [j.dispatch_time for j in jobs] == [0.0, 4.0]
    assert all(j.arrival_time == j.dispatch_time + sizes[j.client] for j in jobs)


def test_periodic_trigger_refills_after_arrivals(tmp_path):
    from lit_asyncfl.algorithms import Algorithm
    from lit_asyncfl.schedulers import PeriodicTrigger
    from lit_asyncfl.server import Mixing

    recorder = Recorder()
    algo = recorder(Algorithm(PeriodicTrigger(period=4.0, clients_per_trigger=1, max_parallel=2), Mixing(0.5)))
    device_model = DeviceModel(time_per_sample=10.0 / 144, bandwidth=float("inf"))  # ~10 s per job
    trainer = make_trainer(tmp_path, algo, num_clients=10, max_virtual_time=30.0, device_model=device_model)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="iid"))
    # IID 1437 samples over 10 clients: 143 or 144 samples, so every job lasts 9.93-10 s.
    # t=0: A starts; t=4: B starts; t=8: full (2 training); ~t=10: A arrives; t=12: C starts; ~t=14: B arrives;
    # t=16: D starts; t=20: full; ~t=22: C arrives; t=24: E starts; ~t=26: D arrives; t=28: F starts.
    starts = sorted(round(d) for _, d, _, _ in recorder.rows) + sorted(
        round(j.dispatch_time) for j in trainer.simulator.in_flight.values()
    )
    assert starts == [0, 4, 12, 16, 24, 28]
    arrivals = [round(a) for _, _, a, _ in recorder.rows]
    assert arrivals == [10, 14, 22, 26]


def test_keep_concurrency_always_has_the_requested_number_training(tmp_path):
    counts = []

    from lit_asyncfl.server.base import ServerCallback

    class Count(ServerCallback):
        def on_aggregated(self, server, updates):
            counts.append(trainer.simulator.num_training)

    algo = FedAsync(concurrency=0.3)
    algo.server_callbacks.append(Count())
    trainer = make_trainer(tmp_path, algo, num_clients=10, max_versions=40)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule())
    # During aggregation the arriving client has left and not yet been replaced: 3 - 1 in flight.
    assert counts == [2] * 40 and trainer.simulator.num_training == 3


def test_synchronous_rounds_wait_for_every_selected_client(tmp_path):
    recorder = Recorder()
    algo = recorder(FedAvg(clients_per_round=3))
    trainer = make_trainer(tmp_path, algo, num_clients=10, max_versions=4)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(partition="quantity"))
    by_round = {}
    for client, dispatched, arrived, base in recorder.rows:
        by_round.setdefault(base, []).append((client, dispatched, arrived))
    assert sorted(by_round) == [0, 1, 2, 3]
    for version, rows in by_round.items():
        assert len(rows) == 3 and len({c for c, _, _ in rows}) == 3
        assert len({d for _, d, _ in rows}) == 1  # all dispatched together
        if version + 1 in by_round:  # next round starts when the last one of this round arrived
            assert by_round[version + 1][0][1] == max(a for _, _, a in rows)
    assert trainer.summary["mean_staleness"] == 0.0


def test_bytes_and_counters_add_up(tmp_path):
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=20)
    s, sim = trainer.summary, trainer.simulator
    model_bytes = sim.model_bytes
    assert s["updates_received"] == s["updates_aggregated"] == 20
    assert s["bytes_up"] == 20 * model_bytes
    assert s["bytes_down"] == sim.next_job_id * model_bytes == 23 * model_bytes  # 20 finished + 3 in flight
    assert np.isclose(s["virtual_time"], trainer.history[-1]["virtual_time"])


def test_the_stop_reason_is_max_versions_when_it_is_reached_with_every_client_retired():
    """Both ends reached at once give one reason whether events are still queued or not (the two checks came in
    opposite orders in and after the loop, so the reason depended on the queue)."""
    from types import SimpleNamespace

    from lit_asyncfl.core.simulator import Simulator

    gate = SimpleNamespace(retire_reason="privacy_budget")
    for queue in ([object()], []):
        sim = SimpleNamespace(queue=queue, server=SimpleNamespace(version=5), _retiring=[gate],
                              _all_retired=lambda: True)  # fmt: skip
        assert Simulator.run(sim, max_versions=5) == "max_versions"
        assert Simulator.run(sim, max_versions=6) == "privacy_budget"


def test_sampling_one_idle_client_draws_as_numpy_choice():
    """``sample_idle(1)`` (each arrival's refill) takes its cheaper draw, ``rng.integers``: the client that
    ``np.sort(rng.choice(idle, size=1, replace=False))`` picks, and the generator left in the same state, on streams
    at several offsets (PCG64 buffers half of a 64-bit draw) and idle sets of every size."""
    from types import SimpleNamespace

    from lit_asyncfl.core.simulator import Simulator

    for seed in range(300):
        for n in (2, 3, 10, 99, 1000, 70_000):
            reference, rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 1])
            reference.integers(0, 5, size=seed % 3), rng.integers(0, 5, size=seed % 3)  # the buffered half or not
            idle = np.flatnonzero(np.arange(2 * n) % 2 == seed % 2)
            sim = SimpleNamespace(
                idle_online=lambda idle=idle: idle, num_clients=2 * n, num_training=n, rng=rng,
                wake_when_online=lambda: None,
            )  # fmt: skip
            got = Simulator.sample_idle(sim, 1)
            want = np.sort(reference.choice(idle, size=1, replace=False))
            assert np.array_equal(got, want) and got.dtype == want.dtype
            assert rng.bit_generator.state == reference.bit_generator.state
            assert rng.random() == reference.random()
