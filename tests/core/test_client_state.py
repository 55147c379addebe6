"""The per-client state store and the presets built on it (FedAvgM, MOON, FedDyn): formulas against hand values and
an independent implementation, spilled state equal to resident state, exact resume with state on disk,
determinism, refused settings, configs that run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import global_weights, make_trainer, run
from torch import nn

from lit_asyncfl.algorithms import MOON, PRESETS, FedAvgM, FedDyn
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.client import DynamicRegularizer, LocalTrainer, ModelContrastive
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.functional.adaptive import momentum_direction
from lit_asyncfl.functional.contrastive import model_contrastive_loss
from lit_asyncfl.functional.feddyn import feddyn_client_state, feddyn_gradient, feddyn_server_model
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.models.base import ClassificationModule
from lit_asyncfl.server import DynamicCorrection, ServerMomentum
from lit_asyncfl.server.base import ServerCallback

ROOT = Path(__file__).resolve().parents[2]


def make_update(client: int, weights, base, base_version: int = 0) -> ClientUpdate:
    job = ClientJob(0, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    update = ClientUpdate(job, torch.tensor(weights), torch.tensor(base), 10, 1, 0.0)
    update.staleness = 0
    return update


class _Server:
    """What the server callbacks read of a server."""

    def __init__(self, weights, num_clients: int = 4) -> None:
        self.weights = torch.tensor(weights)
        self.num_clients = num_clients
        self.param_numel = len(weights)  # no floating buffers


# ---------------------------------------------------------------------------------------------------------- the store


def test_store_keeps_the_budget_spills_the_least_recently_used_and_reads_back_the_same_bytes(tmp_path):
    store = ClientStateStore(budget_bytes=24, directory=str(tmp_path))
    values = {c: torch.randn(3, dtype=torch.float64) for c in range(3)}  # 24 bytes each
    store.put(0, "a", values[0])
    store.put(1, "a", values[1])
    assert store.resident_bytes == 24 and store.num_spilled == 1 and len(os.listdir(tmp_path)) == 1
    assert torch.equal(store.get(0, "a"), values[0])  # from disk, bit-exact
    store.get(1, "a")
    store.put(2, "a", values[2])  # client 1's entry is the least recently used
    assert store.num_spilled == 2 and torch.equal(store.get(1, "a"), values[1])
    store.put(0, "a", values[0] * 2)  # supersedes client 0's file: deleted (no checkpoint refers to it)
    assert len(os.listdir(tmp_path)) == 2
    assert torch.equal(store.get(0, "a"), values[0] * 2) and store.get(0, "b") is None
    bf = torch.randn(5).to(torch.bfloat16)  # any dtype, bit-exact
    store.put(5, "bf", bf)
    assert torch.equal(store.get(5, "bf"), bf)
    store.release()
    assert not tmp_path.exists() or not os.listdir(tmp_path)


def test_store_checkpoint_is_a_manifest_files_are_kept_for_it_and_checked_on_resume(tmp_path):
    store = ClientStateStore(budget_bytes=0, directory=str(tmp_path / "a"))
    store.put(0, "x", torch.arange(4.0))
    state = store.state_dict()
    assert state["tensors"] == [] and len(state["files"]) == 1  # spilled: the checkpoint refers to a file
    written = store.bytes_written
    store.state_dict()
    assert store.bytes_written == written  # an unchanged entry is never written twice
    store.put(0, "x", torch.zeros(4))  # the old file belongs to the checkpoint: kept
    path = state["files"][0][2]
    assert os.path.isfile(path)
    other = ClientStateStore(budget_bytes=1 << 20, directory=str(tmp_path / "b"))
    other.load_state_dict(state)
    assert torch.equal(other.get(0, "x"), torch.arange(4.0))
    other.put(0, "x", torch.ones(4))
    other.release()
    assert os.path.isfile(path)  # a resumed store never deletes the checkpoint's files
    with open(path, "r+b") as f:  # a changed file is found when read
        f.write(b"\x01")
    third = ClientStateStore(budget_bytes=1 << 20, directory=str(tmp_path / "c"))
    third.load_state_dict(state)
    with pytest.raises(RuntimeError, match="does not hold what was written"):
        third.get(0, "x")
    os.remove(path)
    with pytest.raises(ValueError, match=r"needs 1 file\(s\) .* 1 are missing or changed: .*0_x_1.bin \(missing\)"):
        ClientStateStore(budget_bytes=0, directory=str(tmp_path / "d")).load_state_dict(state)


def test_store_without_a_budget_writes_nothing_and_checkpoints_tensors(tmp_path):
    store = ClientStateStore()
    store.put(3, "x", torch.ones(2))
    state = store.state_dict()
    assert state["files"] == [] and torch.equal(state["tensors"][0][2], torch.ones(2))
    with pytest.raises(ValueError, match=r"budget_bytes must be >= 0, got -1"):
        ClientStateStore(budget_bytes=-1, directory=str(tmp_path))
    with pytest.raises(ValueError, match="state names are"):
        store.put(0, "a/b", torch.ones(1))


# ---------------------------------------------------------------------------------------------------------- formulas


def test_server_momentum_two_steps_by_hand():
    assert torch.allclose(momentum_direction(torch.tensor([1.0]), torch.tensor([0.5]), 0.9), torch.tensor([1.45]))
    opt = ServerMomentum(server_lr=0.5, momentum=0.9)
    server = _Server([0.0, 0.0])
    updates = [make_update(0, [1.0, 1.0], [0.0, 0.0])]
    step = opt.transform_aggregate(server, torch.tensor([1.0, -2.0]), updates)  # v1 = Delta1
    assert torch.allclose(step, torch.tensor([0.5, -1.0]))
    opt.on_aggregated(server, updates)
    step = opt.transform_aggregate(server, torch.tensor([0.0, 2.0]), updates)  # v2 = 0.9 v1 + Delta2
    assert torch.allclose(step, 0.5 * torch.tensor([0.9, -1.8 + 2.0]))
    # a step the server refused teaches the buffer nothing
    step_again = opt.transform_aggregate(server, torch.tensor([0.0, 2.0]), updates)
    assert torch.equal(step, step_again)


def _contrastive_by_hand(z, zg, zp, tau):
    """The paper's formula written out: cosine by dot products and norms, the log-ratio by exp and log."""
    cos = lambda a, b: (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))  # noqa: E731
    pos, neg = torch.exp(cos(z, zg) / tau), torch.exp(cos(z, zp) / tau)
    return (-torch.log(pos / (pos + neg))).mean()


def test_moon_loss_by_hand_and_against_autograd_of_an_independent_implementation():
    # one sample by hand: sim(z, zg) = 1, sim(z, zp) = 0, tau = 0.5 -> -log(e^2 / (e^2 + 1))
    z = torch.tensor([[3.0, 0.0]])
    value = model_contrastive_loss(z, torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 5.0]]), tau=0.5)
    assert value.item() == pytest.approx(-torch.log(torch.tensor(torch.e**2 / (torch.e**2 + 1))).item(), rel=1e-6)
    gen = torch.Generator().manual_seed(0)
    z, zg, zp = (torch.randn(6, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))  # flattened per sample
    z1, z2 = z.clone().requires_grad_(), z.clone().requires_grad_()
    ours = model_contrastive_loss(z1, zg, zp, tau=0.7)
    ref = _contrastive_by_hand(z2.reshape(6, -1), zg.reshape(6, -1), zp.reshape(6, -1), 0.7)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-12)
    ours.backward()
    ref.backward()
    assert torch.allclose(z1.grad, z2.grad, rtol=1e-10, atol=1e-12)


def test_feddyn_formulas_by_hand():
    g = feddyn_gradient(torch.tensor([1.0]), torch.tensor([2.0]), torch.tensor([0.5]), torch.tensor([0.25]), 0.1)
    assert torch.allclose(g, torch.tensor([1.0 - 0.25 + 0.1 * 1.5]))
    state = feddyn_client_state(torch.tensor([1.0]), torch.tensor([3.0]), torch.tensor([1.0]), alpha=0.5)
    assert torch.allclose(state, torch.tensor([1.0 - 0.5 * 2.0]))
    assert torch.allclose(feddyn_server_model(torch.tensor([1.0]), torch.tensor([0.2]), 0.1), torch.tensor([-1.0]))


def test_feddyn_server_update_by_hand():
    alpha, m = 0.5, 4
    cb = DynamicCorrection(alpha)
    server = _Server([1.0, 1.0], num_clients=m)
    updates = [make_update(0, [2.0, 1.0], [1.0, 1.0]), make_update(1, [1.0, 3.0], [1.0, 1.0])]
    mean = torch.tensor([1.5, 2.0])
    step = cb.transform_aggregate(server, mean - server.weights, updates)
    h1 = -alpha / m * torch.tensor([1.0 + 0.0, 0.0 + 2.0])  # h^1 = 0 - alpha/m sum(theta_k - theta^0)
    assert torch.allclose(server.weights + step, mean - h1 / alpha)
    assert cb.h is None  # committed only when applied
    cb.on_aggregated(server, updates)
    assert torch.allclose(cb.h, h1)
    server.weights = mean - h1 / alpha
    updates = [make_update(2, [0.0, 0.0], server.weights.tolist())]
    step = cb.transform_aggregate(server, torch.zeros(2) - server.weights, updates)
    h2 = h1 - alpha / m * (torch.zeros(2) - server.weights)
    assert torch.allclose(server.weights + step, torch.zeros(2) - h2 / alpha)


def _one_client_trainer(module, callbacks, x, y, batch_size):
    shards = ClientShards(x, y, [torch.arange(len(x))])
    return LocalTrainer(module, shards, batch_size=batch_size, callbacks=callbacks)


def _job(client: int = 0, job_id: int = 0) -> ClientJob:
    return ClientJob(job_id, client, 0, 0.0, JobTiming(0, 1, 0), seed=7, local_epochs=1)


def test_feddyn_client_steps_and_state_by_hand():
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    module = LogisticRegression(input_dim=3, num_classes=2, lr=0.1)
    alpha, lr = 0.3, 0.1
    reg = DynamicRegularizer(alpha)
    trainer = _one_client_trainer(module, [reg], x, y, batch_size=4)  # one full batch: one step per job
    theta0 = trainer.flat.read()

    def task_grad(theta):
        w = theta[:6].view(2, 3).clone().requires_grad_()
        b = theta[6:].clone().requires_grad_()
        F.cross_entropy(x @ w.T + b, y).backward()
        return torch.cat([w.grad.reshape(-1), b.grad])

    first = trainer.train(_job(), theta0)
    assert torch.allclose(first.weights, theta0 - lr * task_grad(theta0), atol=1e-7)  # g = 0, theta = theta^{t-1}
    g = -alpha * (first.weights - theta0)
    assert torch.allclose(reg.store.get(0, reg.STATE_NAME), g, atol=1e-8)
    start = first.weights + 0.05  # the next round's server model
    second = trainer.train(_job(job_id=1), start)
    assert torch.allclose(second.weights, start - lr * (task_grad(start) - g), atol=1e-7)
    assert torch.allclose(reg.store.get(0, reg.STATE_NAME), g - alpha * (second.weights - start), atol=1e-7)


class _Rep(ClassificationModule):
    """A two-layer classifier with BatchNorm-free layers for the MOON step check."""

    def __init__(self) -> None:
        super().__init__(num_classes=2, lr=0.1)
        self.net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def test_moon_step_is_the_task_loss_plus_mu_times_the_contrastive_term():
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    module, mu, tau, lr = _Rep(), 2.0, 0.5, 0.1
    cb = ModelContrastive(mu=mu, tau=tau)
    trainer = _one_client_trainer(module, [cb], x, y, batch_size=5)
    theta0 = trainer.flat.read()
    reference = _Rep()
    ref_flat = torch.nn.utils.parameters_to_vector

    def load(net, theta):
        torch.nn.utils.vector_to_parameters(theta, net.parameters())
        return net

    first = trainer.train(_job(), theta0)  # no previous model: the plain task step
    net = load(_Rep(), theta0.clone())
    F.cross_entropy(net(x), y).backward()
    assert torch.allclose(first.weights, theta0 - lr * torch.cat([p.grad.reshape(-1) for p in net.parameters()]))
    start = theta0 + 0.01
    second = trainer.train(_job(job_id=1), start)
    local = load(reference, start.clone())
    glob, prev = load(_Rep(), start.clone()), load(_Rep(), first.weights.clone())
    with torch.no_grad():
        zg, zp = glob.net[:-1](x), prev.net[:-1](x)
    z = local.net[:-1](x)
    loss = F.cross_entropy(local.net[-1](z), y) + mu * _contrastive_by_hand(z, zg, zp, tau)
    loss.backward()
    expected = ref_flat(local.parameters()).detach() - lr * torch.cat([p.grad.reshape(-1) for p in local.parameters()])
    assert torch.allclose(second.weights, expected, atol=1e-7)
    assert second.train_loss == pytest.approx(loss.item(), rel=1e-5)
    assert torch.equal(cb.store.get(0, cb.STATE_NAME), second.weights)


# ------------------------------------------------------------------------------------------------------ whole runs


RUNS = {
    "moon": (lambda: MOON(mu=1.0, clients_per_round=4), 6),
    "moon-async": (lambda: MOON(asynchronous=True, concurrency=4), 10),
    "feddyn": (lambda: FedDyn(alpha=0.05, clients_per_round=4), 6),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_state_spilled_to_disk_gives_the_weights_of_state_in_memory(tmp_path, name):
    make, versions = RUNS[name]
    memory = run(tmp_path / "memory", make(), num_clients=8, max_versions=versions, client_state_budget=None)
    disk = run(tmp_path / "disk", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    assert torch.equal(global_weights(memory), global_weights(disk))
    assert disk.client_state is not None and disk.client_state.bytes_written > 0
    again = run(tmp_path / "again", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    assert torch.equal(global_weights(again), global_weights(disk))  # determinism


@pytest.mark.parametrize("name", ["moon", "feddyn"])
def test_resume_is_exact_with_the_state_on_disk(tmp_path, name):
    make, versions = RUNS[name]
    full = run(tmp_path / "full", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    run(tmp_path / "first", make(), num_clients=8, max_versions=versions // 2, client_state_budget=0)
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    state = torch.load(ckpt, weights_only=True)["lit_asyncfl"]["simulation"]["client_state"]
    assert state["tensors"] == [] and len(state["files"]) > 0  # the checkpoint refers to files
    assert all(not os.path.isabs(f[2]) for f in state["files"])  # relative to the checkpoint: the run dir may move
    assert all(os.path.isfile(ckpt.parent / f[2]) for f in state["files"])  # kept after the run ended
    resumed = make_trainer(tmp_path / "resumed", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))


def test_fedavgm_run_replayed_from_the_recorded_rounds(tmp_path):
    lr, beta = 0.8, 0.7
    trainer = run(tmp_path, FedAvgM(server_lr=lr, momentum=beta, clients_per_round=3), num_clients=8, max_versions=4)
    record = []
    trainer2 = make_trainer(tmp_path / "b", FedAvgM(server_lr=lr, momentum=beta, clients_per_round=3), num_clients=8,
                            max_versions=4)  # fmt: skip
    trainer2.algorithm.server_callbacks.insert(1, _Recorder(record))
    trainer2.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule())
    assert torch.equal(global_weights(trainer), global_weights(trainer2))  # the recorder changes nothing
    v = None
    for before, uploads, after in record:
        total = sum(n for _, n in uploads)
        delta = sum(w * (n / total) for w, n in uploads) - before
        v = delta if v is None else beta * v + delta
        assert torch.allclose(after, before + lr * v, rtol=1e-5, atol=1e-6)
    assert len(record) == 4


class _Recorder(ServerCallback):
    def __init__(self, record) -> None:
        self.record, self.pending = record, None

    @property
    def state_key(self) -> str:
        return "test-recorder"

    def transform_aggregate(self, server, step, updates):
        self.pending = (server.weights, [(u.weights, u.num_samples) for u in updates])
        return step

    def on_aggregated(self, server, updates):
        self.record.append((*self.pending, server.weights))


def test_moon_engines_lightning_equals_fast_and_cohort_is_refused(tmp_path):
    fast = run(tmp_path / "fast", MOON(clients_per_round=3), num_clients=6, max_versions=3)
    light = run(tmp_path / "light", MOON(clients_per_round=3), num_clients=6, max_versions=3, engine="lightning")
    assert torch.equal(global_weights(fast), global_weights(light))
    with pytest.raises(ValueError, match=r"cannot run the client callback ModelContrastive.*engine='fast'"):
        run(tmp_path / "cohort", MOON(clients_per_round=3), num_clients=6, max_versions=3, engine="cohort")
    with pytest.raises(ValueError, match=r"cannot run the client callback DynamicRegularizer.*engine='fast'"):
        run(tmp_path / "cohort2", FedDyn(clients_per_round=3), num_clients=6, max_versions=3, engine="cohort")


class _NoRepresentation(ClassificationModule):
    def __init__(self) -> None:
        super().__init__(num_classes=10)
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x):
        return self.body(x)

    representation = None  # type: ignore[assignment]


def test_moon_refuses_modules_without_a_usable_representation(tmp_path):
    with pytest.raises(ValueError, match=r"has no representation\(x\) method. Add `def representation"):
        run(tmp_path / "a", MOON(clients_per_round=3), num_clients=6, max_versions=2, model=_NoRepresentation())
    for engine in ("fast", "lightning"):  # at fit start, before any job (none is blamed on a client)
        trainer = make_trainer(tmp_path / engine, MOON(clients_per_round=3), num_clients=6, max_versions=2,
                               engine=engine)  # fmt: skip
        with pytest.raises(ValueError, match=r"MOON: the representation of LogisticRegression depends on no trainable"):
            trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        assert not trainer.run_started and trainer.simulator is None


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: FedAvgM(momentum=1.0), r"momentum must be in \[0, 1\), got 1.0"),
        (lambda: FedAvgM(server_lr=0.0), r"server_lr must be > 0, got 0.0"),
        (lambda: FedAvgM(buffer_size=5), r"buffer_size=5 applies to asynchronous=True"),
        (lambda: FedAvgM(asynchronous=True, clients_per_round=0.2), r"clients_per_round=0.2 applies to synchronous"),
        (lambda: FedAvgM(asynchronous="no"), r"asynchronous must be True or False, got 'no'"),
        (lambda: MOON(mu=-1.0), r"MOON mu must be >= 0, got -1.0"),
        (lambda: MOON(tau=0.0), r"MOON tau must be > 0, got 0.0"),
        (lambda: MOON(alpha=0.5), r"alpha=0.5 applies to asynchronous=True"),
        (lambda: FedDyn(alpha=0.0), r"FedDyn alpha must be > 0, got 0.0"),
        (lambda: FedDyn(round_deadline=-1.0), r"round_deadline must be > 0"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_trainer_refuses_a_bad_budget_and_stateful_callbacks_on_workers(tmp_path):
    with pytest.raises(ValueError, match=r"client_state_budget must be >= 0, got -5"):
        make_trainer(tmp_path, MOON(), max_versions=1, client_state_budget=-5)
    algo = MOON()
    algo.client_callbacks[0].runs_on_workers = True
    with pytest.raises(ValueError, match=r"\['ModelContrastive'\] keep per-client state.*runs_on_workers=False"):
        make_trainer(tmp_path, algo, max_versions=1)


def test_presets_registered_in_the_specs_and_the_benchmark():
    assert PRESETS["fedavgm"] is FedAvgM and PRESETS["moon"] is MOON and PRESETS["feddyn"] is FedDyn
    specs = {name: yaml.safe_load((ROOT / "configs" / "compare" / f"{name}.yaml").read_text())["methods"]
             for name in ("fedasmu_table1", "fedadt_table1", "fedhist_table1")}  # fmt: skip
    assert {"MOON", "FedDyn"} <= set(specs["fedasmu_table1"]) and "FedAvgM" in specs["fedadt_table1"]
    assert "MOON" in specs["fedhist_table1"]
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    assert all(f'"{name}"' in text for name in ("FedAvgM", "MOON", "FedDyn"))


@pytest.mark.parametrize("name", ["fedavgm", "moon", "feddyn"])
def test_config_parses_and_runs(tmp_path, name):
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=2",
              "--trainer.max_virtual_time=null", "--trainer.algorithm.init_args.clients_per_round=3",
              "--trainer.eval_every=2", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key != "clients_per_round":
            assert algorithm.hparams[key] == value, key
    assert cli.trainer.summary["versions"] == 2
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0
