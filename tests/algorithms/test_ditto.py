"""Ditto (``Ditto``, ``PersonalModel``): the personal model's update against SGD by hand, lambda = 0 against plain
local training, the global weights against FedAvg's and FedAsync's, the personal models in the per-client
evaluation, determinism and exact resume (with per-client evaluation and differential privacy), the cohort engine's
refusal; and the per-client evaluation's held-out split leaving no trace on the user's data module."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import PRESETS, Ditto, FedAsync, FedAvg
from lit_asyncfl.callbacks import Callback, PerClientEvaluation
from lit_asyncfl.client_callbacks import PersonalModel
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.engines import LocalTrainer
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.privacy import DifferentiallyPrivate


def _trainer(tmp_path, algorithm, callbacks=(), **kwargs) -> FederatedTrainer:
    kwargs.setdefault("num_clients", 6)
    return FederatedTrainer(
        algorithm, logger=False, enable_progress_bar=False, print_summary=False, default_root_dir=str(tmp_path),
        callbacks=list(callbacks), **kwargs,
    )  # fmt: skip


def _job(job_id: int, seed: int, steps: int = 1) -> ClientJob:
    return ClientJob(job_id, 0, job_id, 0.0, JobTiming(0.0, 0.0, 0.0), seed, local_epochs=steps, num_steps=steps)


def _sgd_by_hand(module, start, anchor, x, y, lam, lr, steps):
    """``steps`` full-batch SGD steps on CE(v) + lam/2 ||v - anchor||^2 from ``start`` (flat parameters)."""
    sizes = [p.numel() for p in module.parameters()]
    shapes = [p.shape for p in module.parameters()]
    v = start.clone().double()
    for _ in range(steps):
        v = v.detach().requires_grad_(True)
        weight, bias = (t.reshape(s) for t, s in zip(torch.split(v, sizes), shapes))
        loss = F.cross_entropy(x.double() @ weight.T + bias, y) + lam / 2 * (v - anchor.double()).square().sum()
        (grad,) = torch.autograd.grad(loss, v)
        v = v - lr * grad
    return v.detach()


class KeepsPersonalModels(Callback):
    """Every client's personal model at the end of the run (``None`` where it never trained)."""

    def on_fit_end(self, trainer):
        personal = next(cb for cb in trainer.algorithm.client_callbacks if isinstance(cb, PersonalModel))
        self.models = [personal.personal_weights(c) for c in range(trainer.num_clients)]


# -- the personal model's update ------------------------------------------------------------------------------------
def test_personal_model_update_equals_sgd_on_the_regularised_objective_by_hand():
    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.arange(8) % 3
    model = LogisticRegression(input_dim=4, num_classes=3, lr=0.3)
    lam, s = 0.5, 3
    personal = PersonalModel(lam=lam, steps=s)
    engine = LocalTrainer(model, ClientShards(x, y, [np.arange(8)]), batch_size=8, callbacks=[personal])
    w0 = engine.flat.read().clone()
    # the first job: v_0 starts from w^0 (the global model it receives)
    first = engine.train(_job(0, seed=11, steps=2), w0)
    v1 = personal.personal_weights(0)
    expected_v1 = _sgd_by_hand(model, w0, w0, x, y, lam, 0.3, s)
    torch.testing.assert_close(v1.double(), expected_v1, rtol=1e-5, atol=1e-6)
    # the global update is the job's plain local training (2 epochs), not the personal one
    plain = LocalTrainer(model, ClientShards(x, y, [np.arange(8)]), batch_size=8).train(_job(0, 11, 2), w0)
    assert torch.equal(first.weights, plain.weights)
    # the second job starts v from v_1, anchored at the new global model w^1
    w1 = first.weights.clone() * 0.5
    engine.train(_job(1, seed=12, steps=2), w1)
    expected_v2 = _sgd_by_hand(model, v1, w1, x, y, lam, 0.3, s)
    torch.testing.assert_close(personal.personal_weights(0).double(), expected_v2, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(expected_v2, _sgd_by_hand(model, v1, w1, x, y, 0.0, 0.3, s))  # the term mattered


def test_lambda_zero_is_plain_local_training_of_the_personal_model():
    torch.manual_seed(0)
    x, y = torch.randn(20, 4), torch.arange(20) % 3
    shards = ClientShards(x, y, [np.arange(20)])
    model = LogisticRegression(input_dim=4, num_classes=3, lr=0.2)
    personal = PersonalModel(lam=0.0)  # steps=None: the job's own (2 epochs of 3 batches), its batches
    engine = LocalTrainer(model, shards, batch_size=7, callbacks=[personal])
    plain = LocalTrainer(model, shards, batch_size=7)
    w0 = engine.flat.read().clone()
    engine.train(_job(0, seed=5, steps=2), w0)
    v1 = personal.personal_weights(0).clone()
    assert torch.equal(v1, plain.train(_job(0, 5, 2), w0).weights)
    engine.train(_job(1, seed=6, steps=2), w0 + 1.0)  # another global model: lambda = 0 ignores it
    assert torch.equal(personal.personal_weights(0), plain.train(_job(1, 6, 2), v1).weights)


def test_settings_are_checked():
    with pytest.raises(ValueError, match="lam"):
        Ditto(lam=-1.0)
    with pytest.raises(ValueError, match="steps"):
        Ditto(steps=0)
    with pytest.raises(ValueError, match="concurrency"):
        Ditto(concurrency=2)
    with pytest.raises(ValueError, match="clients_per_round"):
        Ditto(asynchronous=True, clients_per_round=0.5)
    assert PRESETS["ditto"] is Ditto


# -- the global model is FedAvg's / FedAsync's --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ditto", "base", "engine"),
    [
        (lambda: Ditto(lam=1.0, clients_per_round=3), lambda: FedAvg(3), "fast"),
        (lambda: Ditto(asynchronous=True, concurrency=3), lambda: FedAsync(concurrency=3), "fast"),
        (lambda: Ditto(lam=0.1, steps=2, clients_per_round=2), lambda: FedAvg(2), "lightning"),
    ],
    ids=["fedavg", "fedasync", "lightning"],
)
def test_the_global_weights_are_those_of_the_algorithm_without_personal_models(tmp_path, ditto, base, engine):
    def fit(path, algorithm, callbacks=()):
        trainer = _trainer(path, algorithm, callbacks, max_versions=4 if engine == "fast" else 2, eval_every=2,
                           engine=engine)  # fmt: skip
        torch.manual_seed(3)
        model = LeNet5(lr=0.05) if engine == "fast" else LogisticRegression(input_dim=64)
        trainer.fit(model, datamodule=DigitsDataModule(partition="dirichlet"))
        return trainer

    kept = KeepsPersonalModels()
    with_personal, without = fit(tmp_path / "ditto", ditto(), [kept]), fit(tmp_path / "base", base())
    assert torch.equal(with_personal.simulator.server.weights, without.simulator.server.weights)
    assert [r["accuracy"] for r in with_personal.history] == [r["accuracy"] for r in without.history]
    trained = [v for v in kept.models if v is not None]
    assert trained and all(not torch.equal(v, with_personal.simulator.server.weights) for v in trained)


# -- the personal models in the per-client evaluation ---------------------------------------------------------------
def test_per_client_evaluation_evaluates_each_clients_personal_model(tmp_path):
    kept = KeepsPersonalModels()
    per_client = PerClientEvaluation(holdout=0.3)
    trainer = _trainer(tmp_path, Ditto(clients_per_round=2), [per_client, kept], num_clients=6, max_versions=2,
                       eval_every=2)  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(partition="dirichlet"))
    last = per_client._last
    evaluator = per_client._evaluator
    global_weights = trainer.simulator.server.weights
    trained = [c for c in range(6) if kept.models[c] is not None]
    assert 0 < len(trained) < 6  # 2 rounds of 2 clients: some never trained
    for client in range(6):
        weights = global_weights if kept.models[client] is None else kept.models[client]
        evaluator.workspace.flat.load(weights)
        held = per_client.held_out[client]
        x = trainer.datamodule.prepare_inputs(per_client._shards.inputs[held])
        with torch.no_grad():
            acc = (evaluator.module(x).argmax(-1) == per_client._shards.targets[held]).double().mean().item()
        assert last["personal_val_acc"][client] == pytest.approx(acc, abs=1e-12)
        if kept.models[client] is None:  # never trained: the global model
            assert last["personal_val_acc"][client] == last["client_val_acc"][client]
    row = trainer.history[-1]
    assert row["personal_acc_mean"] == pytest.approx(float(np.mean(last["personal_val_acc"])))
    assert trainer.summary["personal_acc_mean"] == row["personal_acc_mean"]


# -- determinism, exact resume, engines -------------------------------------------------------------------------
def test_determinism_and_exact_resume_with_per_client_evaluation_and_privacy(tmp_path):
    def fit(path, versions, ckpt=None):
        kept = KeepsPersonalModels()
        algorithm = DifferentiallyPrivate(Ditto(clients_per_round=3), clip_norm=1.0, noise_multiplier=0.5)
        trainer = _trainer(path, algorithm, [PerClientEvaluation(every=2, personalize_steps=2), kept], num_clients=8,
                           max_versions=versions, eval_every=2)  # fmt: skip
        torch.manual_seed(1)
        trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet"), ckpt_path=ckpt)
        return trainer, kept.models

    def rows(trainer):
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in trainer.history]

    def same_models(a, b):
        return all((u is None and v is None) or (u is not None and v is not None and torch.equal(u, v))
                   for u, v in zip(a, b, strict=True))  # fmt: skip

    (full, full_models), (again, again_models) = fit(tmp_path / "full", 6), fit(tmp_path / "again", 6)
    assert torch.equal(full.simulator.server.weights, again.simulator.server.weights)
    assert rows(full) == rows(again) and same_models(full_models, again_models)
    assert any(m is not None for m in full_models) and "personal_acc_mean" in full.history[-1]
    fit(tmp_path / "first", 3)
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed, resumed_models = fit(tmp_path / "resumed", 6, str(ckpt))
    assert torch.equal(resumed.simulator.server.weights, full.simulator.server.weights)
    assert rows(resumed) == rows(full)
    assert same_models(resumed_models, full_models)


def test_the_cohort_engine_refuses_it_naming_the_fast_engine(tmp_path):
    trainer = _trainer(tmp_path, Ditto(), engine="cohort", max_versions=2)
    with pytest.raises(ValueError, match=r"PersonalModel.*engine='fast'"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())


# -- per-client evaluation: the split leaves no trace on the data module -------------------------------------------
def test_a_failed_fit_leaves_no_holdout_on_the_data_module(tmp_path):
    dm = DigitsDataModule()

    def fit(path, callbacks, versions, ckpt=None):
        trainer = _trainer(path, FedAsync(concurrency=2), callbacks, max_versions=versions, eval_every=2,
                           num_clients=5)  # fmt: skip
        trainer.fit(LogisticRegression(input_dim=64), datamodule=dm, ckpt_path=ckpt)
        return trainer

    fit(tmp_path / "plain", [], 2)
    plain = next((tmp_path / "plain").rglob("last.ckpt"))
    with pytest.raises(ValueError, match="client_holdout"):  # refused after the split, before on_fit_start
        fit(tmp_path / "a", [PerClientEvaluation(holdout=0.2)], 4, str(plain))
    assert not hasattr(dm, "client_holdout")
    assert fit(tmp_path / "b", [], 4, str(plain)).history[-1]["version"] == 4  # the same data module resumes


def test_the_per_client_page_example_reports_the_personal_models(capsys, tmp_path, monkeypatch):
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "per_client.md").read_text()
    code = re.search(r"<!-- test: ditto -->\n```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_ditto"}
    exec(compile(code, "docs/per_client.md", "exec"), namespace)
    summary = namespace["trainer"].summary
    assert summary["clients_evaluated"] == 20 and 0 <= summary["personal_acc_mean"] <= 1
    assert len(capsys.readouterr().out.split()) == 2


@pytest.mark.parametrize("asynchronous", [False, True], ids=["rounds", "async"])
def test_personal_models_spilled_to_disk_resume_exactly(tmp_path, asynchronous):
    def fit(path, versions, budget, ckpt=None):
        kept = KeepsPersonalModels()
        algorithm = Ditto(asynchronous=True, concurrency=4) if asynchronous else Ditto(clients_per_round=4)
        trainer = _trainer(path, algorithm, [kept], num_clients=8, max_versions=versions, eval_every=2,
                           client_state_budget=budget)  # fmt: skip
        torch.manual_seed(2)
        trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet"), ckpt_path=ckpt)
        return trainer, kept.models

    memory, memory_models = fit(tmp_path / "memory", 8, None)
    _, disk_models = fit(tmp_path / "disk", 8, 0)
    fit(tmp_path / "first", 4, 0)
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    state = torch.load(ckpt, weights_only=True)["lit_asyncfl"]["simulation"]["client_state"]
    assert state["tensors"] == [] and len(state["files"]) > 0  # the personal models are on disk
    resumed, resumed_models = fit(tmp_path / "resumed", 8, 0, str(ckpt))
    assert torch.equal(resumed.simulator.server.weights, memory.simulator.server.weights)
    trained = [c for c, v in enumerate(memory_models) if v is not None]
    assert (
        trained
        == [c for c, v in enumerate(resumed_models) if v is not None]
        == [c for c, v in enumerate(disk_models) if v is not None]
    )
    for c in trained:
        assert torch.equal(memory_models[c], disk_models[c]) and torch.equal(memory_models[c], resumed_models[c])
