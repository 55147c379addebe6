"""Per-client evaluation (``PerClientEvaluation``): the held-out split, the statistics against hand computations,
never-trained clients, batched vs per-client loops, personalization against fine-tuning by hand, determinism and
exact resume (with differential privacy too), and the CLI."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync, FedBuff
from lit_asyncfl.callbacks import Callback, PerClientEvaluation
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.per_client import ClientEvaluator, client_statistics, hold_out, personalization_seed
from lit_asyncfl.privacy import DifferentiallyPrivate


class RecordsClients(Callback):
    """Which clients' updates reached the server."""

    def __init__(self) -> None:
        self.trained: set[int] = set()

    def on_client_update(self, trainer, update, aggregated):
        self.trained.add(update.job.client)


def _trainer(tmp_path, algorithm, callbacks, **kwargs) -> FederatedTrainer:
    kwargs.setdefault("num_clients", 5)
    return FederatedTrainer(
        algorithm, logger=False, enable_progress_bar=False, print_summary=False, default_root_dir=str(tmp_path),
        callbacks=callbacks, **kwargs,
    )  # fmt: skip


# -- the split ----------------------------------------------------------------------------------------------------
def test_hold_out_draws_the_documented_number_per_client_disjoint_and_seeded():
    shards = [np.arange(0, 10), np.arange(10, 12), np.arange(12, 19), np.arange(19, 119)]
    train, held = hold_out(shards, 0.25, seed=3)
    # h_i = min(n_i - 1, max(1, floor(f n_i + 1/2))): 10 -> 3 (2.5 rounds up), 2 -> 1, 7 -> 2, 100 -> 25
    assert [len(h) for h in held] == [3, 1, 2, 25]
    for whole, t, h in zip(shards, train, held):
        assert np.array_equal(np.sort(np.concatenate([t, h])), whole) and not set(t) & set(h)
    again = hold_out(shards, 0.25, seed=3)[1]
    assert all(np.array_equal(a, b) for a, b in zip(held, again))
    assert not all(np.array_equal(a, b) for a, b in zip(held, hold_out(shards, 0.25, seed=4)[1]))
    with pytest.raises(ValueError, match="client 1 holds 1 sample"):
        hold_out([np.arange(5), np.array([7])], 0.2, seed=0)


def test_statistics_by_hand():
    values = np.array([0.2, 0.9, 0.5, 1.0, 0.7, 0.4, 0.8, 0.6, 0.3, 0.1, 0.95])  # K = 11
    sizes = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    stats = client_statistics(values, sizes, target=0.75)
    k = len(values)
    mean = sum(values) / k
    assert stats["client_acc_mean"] == pytest.approx(mean)
    assert stats["client_acc_weighted"] == pytest.approx(sum(values * sizes) / sum(sizes))
    assert stats["client_acc_std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in values) / k))
    assert stats["client_acc_worst10"] == pytest.approx((0.1 + 0.2) / 2)  # ceil(11 / 10) = 2 worst
    assert stats["client_acc_best10"] == pytest.approx((1.0 + 0.95) / 2)
    assert stats["client_acc_p50"] == pytest.approx(0.6)
    assert stats["client_reaching_target"] == 4 and stats["clients_evaluated"] == 11  # 0.9, 1.0, 0.8, 0.95
    low = client_statistics(values, sizes, target=0.25, mode="min", prefix="personalized")
    assert low["personalized_acc_worst10"] == pytest.approx((1.0 + 0.95) / 2)
    assert low["personalized_reaching_target"] == 2  # 0.2 and 0.1 at or below 0.25
    assert low["clients_evaluated"] == 11


# -- a tiny federation by hand ------------------------------------------------------------------------------------
def test_a_tiny_federation_by_hand_never_trained_clients_included(tmp_path):
    clients = RecordsClients()
    per_client = PerClientEvaluation(every=1, holdout=0.2)
    trainer = _trainer(tmp_path, FedAsync(concurrency=1), [clients, per_client], max_versions=2, eval_every=1,
                       target_accuracy=0.3)  # fmt: skip
    dm = DigitsDataModule()
    trainer.fit(LogisticRegression(input_dim=64), datamodule=dm)
    assert len(clients.trained) < 5  # some clients never trained, and are evaluated all the same
    # the held-out samples are out of each client's training data
    full = dm.client_shards(5, seed=0).indices_numpy()
    assert [int(n) for n in trainer.simulator.num_samples] == [len(f) - len(h) for f, h in
                                                                zip(full, per_client.held_out)]  # fmt: skip
    for whole, held in zip(full, per_client.held_out):
        assert set(held) <= set(whole)
    trained_on = per_client._shards.indices_numpy()
    assert all(not set(t) & set(h) for t, h in zip(trained_on, per_client.held_out))
    # the final global model on each client's held-out samples, by hand
    x, y = dm.train_set.tensors
    model = trainer.global_model.eval()
    with torch.no_grad():
        accs = np.array([(model(x[h]).argmax(-1) == y[h]).double().mean().item() for h in per_client.held_out])
        losses = np.array([F.cross_entropy(model(x[h]), y[h]).item() for h in per_client.held_out])
    sizes = np.array([len(h) for h in per_client.held_out])
    row = trainer.history[-1]
    assert row["clients_evaluated"] == 5
    assert row["client_acc_mean"] == pytest.approx(accs.mean(), abs=1e-12)
    assert row["client_acc_weighted"] == pytest.approx((accs * sizes).sum() / sizes.sum(), abs=1e-12)
    assert row["client_acc_std"] == pytest.approx(accs.std(), abs=1e-12)
    assert row["client_acc_worst10"] == pytest.approx(accs.min()) and row["client_acc_best10"] == accs.max()
    assert row["client_reaching_target"] == int((accs >= 0.3).sum())
    assert row["client_loss_mean"] == pytest.approx(losses.mean(), rel=1e-5)
    assert all("client_acc_mean" in r for r in trainer.history)  # every=1: every evaluation
    for key in ("client_acc_mean", "client_acc_weighted", "client_acc_std", "client_acc_worst10",
                "client_acc_best10", "client_reaching_target", "clients_evaluated"):  # fmt: skip
        assert trainer.summary[key] == row[key]
    with open(f"{trainer.log_dir}/clients.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["client"]) for r in rows] == [0, 1, 2, 3, 4]
    assert [float(r["client_val_acc"]) for r in rows] == pytest.approx(accs.tolist())
    assert (tmp_path / "FedAsync").rglob("clients.png")


def test_every_n_evaluations_and_always_at_the_end(tmp_path):
    trainer = _trainer(tmp_path, FedAsync(concurrency=2), [PerClientEvaluation(every=3)], max_versions=9,
                       eval_every=2)  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    evaluated = [r["version"] for r in trainer.history if "client_acc_mean" in r]
    assert [r["version"] for r in trainer.history] == [0, 2, 4, 6, 8, 9]
    assert evaluated == [0, 6, 9]  # rows 0 and 3, and the final model


# -- batched vs per-client loops ----------------------------------------------------------------------------------
def _evaluator(module, clients=6):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(120, 1, 8, 8, generator=gen), torch.randint(0, 10, (120,), generator=gen)
    train, held = hold_out(np.array_split(np.arange(120), clients), 0.3, seed=0)
    return ClientEvaluator(module, ClientShards(x, y, train), held, lambda v: v, 7, torch.device("cpu"))


def test_batched_evaluation_equals_one_evaluation_loop_per_client():
    torch.manual_seed(0)
    evaluator = _evaluator(LeNet5(input_size=8))
    weights = evaluator.workspace.flat.read()
    clients = np.arange(6)
    assert evaluator.check_decomposes(0, "val_acc")
    batched = evaluator.evaluate(weights, clients)
    evaluator.decomposes = False
    loops = evaluator.evaluate(weights, clients)  # the module's own validation_step, client by client
    assert sorted(batched) == sorted(loops) == ["val_acc", "val_loss"]
    assert np.allclose(batched["val_acc"], loops["val_acc"], atol=1e-7)
    assert np.allclose(batched["val_loss"], loops["val_loss"], rtol=1e-5)


class TopTwoAccuracy(LeNet5):
    """A validation_step whose accuracy is not the per-sample correctness the base class reports."""

    def validation_step(self, batch, batch_idx):
        x, y = batch
        top2 = self(x).topk(2, dim=-1).indices
        self.log("val_acc", (top2 == y[:, None]).any(-1).float().mean(), batch_size=len(y))


def test_a_module_whose_validation_step_disagrees_falls_back_to_its_own_loop():
    torch.manual_seed(0)
    evaluator = _evaluator(TopTwoAccuracy(input_size=8))
    weights = evaluator.workspace.flat.read()
    assert not evaluator.check_decomposes(0, "val_acc")
    values = evaluator.evaluate(weights, np.arange(6))
    x, y = evaluator.shards.inputs, evaluator.shards.targets
    with torch.no_grad():
        evaluator.module.eval()
        expected = [(evaluator.module(x[h]).topk(2, -1).indices == y[h][:, None]).any(-1).double().mean().item()
                    for h in evaluator.held_out]  # fmt: skip
    assert np.allclose(values["val_acc"], expected, atol=1e-7)


# -- personalization ----------------------------------------------------------------------------------------------
def test_personalized_evaluation_equals_fine_tuning_by_hand(tmp_path):
    steps = 3
    per_client = PerClientEvaluation(every=1, holdout=0.25, personalize_steps=steps)
    trainer = _trainer(tmp_path, FedAsync(concurrency=2), [per_client], num_clients=4, max_versions=3, eval_every=3)
    dm = DigitsDataModule(batch_size=8)
    trainer.fit(LogisticRegression(input_dim=64, lr=0.1), datamodule=dm)
    x, y = dm.train_set.tensors
    version = trainer.simulator.server.version
    for client in range(4):
        model = LogisticRegression(input_dim=64, lr=0.1)
        model.load_state_dict(trainer.global_model.state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        train_idx = torch.as_tensor(per_client._shards.indices_numpy()[client])
        generator = torch.Generator().manual_seed(personalization_seed(0, version, client))
        done = 0
        while done < steps:  # epochs of the client's shuffled training batches, as a job draws them
            order = train_idx[torch.randperm(len(train_idx), generator=generator)]
            for start in range(0, len(order), 8):
                if done == steps:
                    break
                chunk = order[start : start + 8]
                loss = F.cross_entropy(model(x[chunk]), y[chunk])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                done += 1
        held = per_client.held_out[client]
        with torch.no_grad():
            logits = model(x[held])
        acc = (logits.argmax(-1) == y[held]).double().mean().item()
        assert per_client._last["personalized_val_acc"][client] == pytest.approx(acc, abs=1e-12)
        expected_loss = F.cross_entropy(logits, y[held]).item()
        assert per_client._last["personalized_val_loss"][client] == pytest.approx(expected_loss, rel=1e-5)
    global_loss = per_client._last["client_val_loss"]
    assert not np.allclose(global_loss, per_client._last["personalized_val_loss"])  # fine-tuning did something
    assert trainer.summary["clients_evaluated"] == 4
    assert "personalized_acc_mean" in trainer.summary


# -- determinism and exact resume ---------------------------------------------------------------------------------
ALGORITHMS = {
    "fedasync": lambda: FedAsync(concurrency=3),
    "dp_fedbuff": lambda: DifferentiallyPrivate(
        FedBuff(buffer_size=2, concurrency=3), clip_norm=1.0, noise_multiplier=0.5
    ),
}


def _rows(trainer):
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in trainer.history]


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_determinism_and_exact_resume_with_per_client_evaluation(tmp_path, name):
    def fit(path, versions, ckpt=None):
        trainer = _trainer(path, ALGORITHMS[name](), [PerClientEvaluation(every=3, personalize_steps=2)],
                           num_clients=8, max_versions=versions, eval_every=2)  # fmt: skip
        torch.manual_seed(1)
        trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet"), ckpt_path=ckpt)
        return trainer

    full, again = fit(tmp_path / "full", 8), fit(tmp_path / "again", 8)
    assert torch.equal(full.simulator.server.weights, again.simulator.server.weights)
    assert _rows(full) == _rows(again)
    first = fit(tmp_path / "first", 4)
    assert "client_acc_mean" in first.history[-1]  # the end of the first part was evaluated per client ...
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = fit(tmp_path / "resumed", 8, str(ckpt))
    assert torch.equal(resumed.simulator.server.weights, full.simulator.server.weights)
    assert _rows(resumed) == _rows(full)  # ... which the uninterrupted run's row 2 (version 4) is not
    assert "client_acc_mean" not in full.history[2] and "personalized_acc_mean" in full.history[-1]
    assert resumed.summary["client_acc_mean"] == full.summary["client_acc_mean"]


def test_a_resume_with_another_holdout_or_without_the_split_is_refused(tmp_path):
    def fit(path, callbacks, versions, ckpt=None):
        trainer = _trainer(path, FedAsync(concurrency=2), callbacks, max_versions=versions, eval_every=2)
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=ckpt)
        return trainer

    fit(tmp_path / "plain", [], 2)
    fit(tmp_path / "split", [PerClientEvaluation(holdout=0.2)], 2)
    plain, split = (next((tmp_path / d).rglob("last.ckpt")) for d in ("plain", "split"))
    with pytest.raises(ValueError, match="client_holdout"):
        fit(tmp_path / "a", [PerClientEvaluation(holdout=0.2)], 4, str(plain))
    with pytest.raises(ValueError, match="client_holdout"):
        fit(tmp_path / "b", [PerClientEvaluation(holdout=0.3)], 4, str(split))
    with pytest.raises(ValueError, match="client_holdout"):
        fit(tmp_path / "c", [], 4, str(split))
    assert fit(tmp_path / "d", [PerClientEvaluation(holdout=0.2, every=5)], 4, str(split)).history[-1]["version"] == 4


def test_settings_are_checked_at_construction():
    refused = [({"every": 0}, "every"), ({"holdout": 1.0}, "holdout"), ({"holdout": 0}, "holdout"),
               ({"personalize_steps": -1}, "personalize_steps"), ({"max_clients": 0}, "max_clients")]  # fmt: skip
    for kwargs, name in refused:
        with pytest.raises(ValueError, match=name):
            PerClientEvaluation(**kwargs)


def test_max_clients_evaluates_a_fixed_subset(tmp_path):
    per_client = PerClientEvaluation(max_clients=3)
    trainer = _trainer(tmp_path, FedAsync(concurrency=2), [per_client], num_clients=8, max_versions=4, eval_every=2)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert len(per_client.clients) == 3 and all(r["clients_evaluated"] == 3 for r in trainer.history)


# -- the command line ---------------------------------------------------------------------------------------------
def test_the_per_client_config_runs_from_the_command_line(tmp_path):
    cli = FederatedCLI(
        args=["fit", "--config", "configs/per_client.yaml", "--trainer.max_virtual_time=600",
              "--trainer.num_clients=20", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]
    )  # fmt: skip
    callbacks = [cb for cb in cli.trainer.callbacks if isinstance(cb, PerClientEvaluation)]
    assert len(callbacks) == 1 and callbacks[0].personalize_steps == 5 and callbacks[0].every == 10
    summary = cli.trainer.summary
    assert summary["clients_evaluated"] == 20 and 0 <= summary["personalized_acc_mean"] <= 1
    assert next(tmp_path.rglob("clients.png")).is_file()
    with open(next(tmp_path.rglob("history.csv"))) as fh:
        assert "client_acc_worst10" in next(csv.reader(fh))


class SquaredLogits(LogisticRegression):
    """A loss of its own and no sample_loss: per-client evaluation cannot decompose it."""

    def loss(self, logits, y):
        return (logits**2).mean()


def test_per_sample_metrics_average_to_what_validation_step_logs_else_the_loop_is_used():
    from lit_asyncfl.loops.validation_loop import run_evaluation
    from lit_asyncfl.models import LinearSVM

    gen = torch.Generator().manual_seed(0)
    batch = [torch.randn(9, 1, 8, 8, generator=gen), torch.randint(0, 10, (9,), generator=gen)]
    for model in (LeNet5(input_size=8), LinearSVM(input_dim=64, num_classes=10)):
        logged = run_evaluation(model, [[batch]], "val")[0]
        per_sample = model.per_sample_metrics(batch)
        assert {k: v.mean().item() for k, v in per_sample.items()} == pytest.approx(logged, rel=1e-6)
    evaluator = _evaluator(SquaredLogits(input_dim=64))
    assert not evaluator.check_decomposes(0, "val_acc")  # sample_loss refuses: one loop per client
    values = evaluator.evaluate(evaluator.workspace.flat.read(), np.arange(6))
    x = evaluator.shards.inputs
    with torch.no_grad():
        expected = [(evaluator.module(x[h]) ** 2).mean().item() for h in evaluator.held_out]
    assert np.allclose(values["val_loss"], expected, rtol=1e-6)


def test_the_loggers_get_the_rows_and_the_summary_also_for_the_end_of_run_evaluation(tmp_path):
    trainer = FederatedTrainer(FedAsync(concurrency=2), num_clients=5, max_versions=4, eval_every=2, logger=True,
                               callbacks=[PerClientEvaluation(every=5)], enable_progress_bar=False,
                               print_summary=False, default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    with open(f"{trainer.log_dir}/metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    logged = {int(r["step"]): float(r["client_acc_mean"]) for r in rows if r.get("client_acc_mean")}
    assert logged == pytest.approx(
        {0: trainer.history[0]["client_acc_mean"], 4: trainer.history[-1]["client_acc_mean"]}
    )
    assert any(r.get("summary/client_acc_worst10") for r in rows)


def test_personalization_under_the_lightning_engine_equals_the_fast_engine(tmp_path):
    def fit(engine):
        per_client = PerClientEvaluation(every=1, personalize_steps=2)
        trainer = _trainer(tmp_path / engine, FedAsync(concurrency=2), [per_client], num_clients=3, max_versions=2,
                           eval_every=2, engine=engine)  # fmt: skip
        torch.manual_seed(0)
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        return per_client._last

    fast, lightning = fit("fast"), fit("lightning")
    assert fast.keys() == lightning.keys()
    for key in fast:
        assert np.array_equal(fast[key], lightning[key]), key


def test_a_dataset_read_sample_by_sample_is_evaluated_per_client_by_hand(tmp_path):
    import lightning as L
    from torch.utils.data import DataLoader, Dataset

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(90, 64, generator=gen), torch.randint(0, 10, (90,), generator=gen)

    class Pairs(Dataset):  # not a TensorDataset: the clients' shards read it sample by sample
        def __len__(self):
            return 60

        def __getitem__(self, i):
            return x[i], y[i]

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(Pairs(), batch_size=4)

        def val_dataloader(self):
            return DataLoader(list(zip(x[60:], y[60:])), batch_size=16)

    per_client = PerClientEvaluation(holdout=0.3)
    trainer = _trainer(tmp_path, FedAsync(concurrency=2), [per_client], num_clients=4, max_versions=3, eval_every=3,
                       engine="cohort")  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=Data())
    assert type(per_client._shards).__name__ == "DatasetShards"
    model = trainer.global_model.eval()
    with torch.no_grad():
        accs = [(model(x[h]).argmax(-1) == y[h]).double().mean().item() for h in per_client.held_out]
    assert per_client._last["client_val_acc"] == pytest.approx(accs, abs=1e-12)
    assert trainer.history[-1]["client_acc_mean"] == pytest.approx(np.mean(accs), abs=1e-12)


# -- the clients' settings carry over; what it needs is refused at fit start -------------------------------------
def test_a_loader_without_shuffle_keeps_each_clients_batches_in_order_with_the_split(tmp_path):
    """DataLoader(shuffle=False): every job iterates its client's training shard (held-out samples removed) in
    dataset order, as without PerClientEvaluation (the split used to rebuild the shards shuffled)."""
    from torch.utils.data import DataLoader, TensorDataset

    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 64, generator=gen), torch.randint(0, 10, (40,), generator=gen)
    seen: list[torch.Tensor] = []  # outside the module: the engines train copies of it

    class RecordsBatches(LogisticRegression):
        def training_step(self, batch, batch_idx):
            seen.append(batch[0].detach().clone())
            return super().training_step(batch, batch_idx)

    per_client = PerClientEvaluation(holdout=0.25)
    trainer = _trainer(tmp_path, FedAsync(concurrency=2), [per_client], num_clients=2, max_versions=4, eval_every=2)
    train = DataLoader(TensorDataset(x[:30], y[:30]), batch_size=3, shuffle=False)
    trainer.fit(RecordsBatches(input_dim=64), train, DataLoader(TensorDataset(x[30:], y[30:]), batch_size=8))
    shards = [s.tolist() for s in per_client._shards.indices_numpy()]
    assert seen and all(s == sorted(s) for s in shards)
    for batch in seen:
        ids = (batch[:, None, :] == x[None, :30]).all(-1).nonzero()[:, 1].tolist()
        assert len(ids) == len(batch)
        own = next(s for s in shards if ids[0] in s)
        start = own.index(ids[0])
        assert start % 3 == 0 and ids == own[start : start + len(ids)]  # a slice of the shard, in order
    assert per_client._shards.shuffle is False


class LogsNoAccuracy(LogisticRegression):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


def test_what_per_client_evaluation_needs_is_refused_at_fit_start(tmp_path):
    """No validation_step, no validation loader or no monitored metric: it used to do nothing, silently."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    class NoValidation(L.LightningModule):  # a logistic regression's training, without its validation_step
        def __init__(self):
            super().__init__()
            self.classifier = LogisticRegression(input_dim=64)

        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self.classifier(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(name, model, *data, **kwargs):
        trainer = _trainer(tmp_path / name, FedAsync(concurrency=2), [PerClientEvaluation()], max_versions=2,
                           **kwargs)  # fmt: skip
        trainer.fit(model, *data, **({} if data else {"datamodule": DigitsDataModule()}))

    with pytest.warns(UserWarning, match="no validation_step"):
        with pytest.raises(ValueError, match=r"validation_step, but NoValidation has none: define .*val_acc"):
            fit("step", NoValidation())
    gen = torch.Generator().manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(40, 64, generator=gen), torch.arange(40) % 10), batch_size=4)
    with pytest.raises(ValueError, match=r"no validation loader .* pass val_dataloaders"):
        fit("loader", LogisticRegression(input_dim=64), loader)
    with pytest.warns(UserWarning, match="no logged metric ends in acc"):
        with pytest.raises(ValueError, match=r"needs a monitored metric, .* FederatedTrainer\(monitor=\.\.\."):
            fit("monitor", LogsNoAccuracy(input_dim=64))
    fit("named", LogsNoAccuracy(input_dim=64), monitor="val_loss", mode="min", target_accuracy=0.1)  # named: runs
