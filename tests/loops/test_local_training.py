"""Local training: user modules and data modules, optimizers, client callbacks."""

from __future__ import annotations

import copy

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import global_weights, make_trainer
from torch.utils.data import DataLoader, Dataset, TensorDataset

from lit_asyncfl.algorithms import FedAsync, FedProx
from lit_asyncfl.client.callbacks import ProximalTerm
from lit_asyncfl.client.fast_engine import LocalTrainer, parse_optimizers
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import ClientShards, DigitsDataModule


class UserModel(L.LightningModule):
    """A plain user LightningModule: its own steps, logging and optimizer with a scheduler."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.layer(x.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("valid/accuracy", (logits.argmax(1) == y).float().mean())
        self.log("valid/loss", F.cross_entropy(logits, y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


class UserData(L.LightningDataModule):
    """A plain user LightningDataModule over the digits."""

    def setup(self, stage):
        dm = DigitsDataModule()
        dm.setup("fit")
        self.train, self.val = dm.train_set, dm.test_set

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=100)


def test_user_module_and_datamodule_work_unchanged(tmp_path):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=3), num_clients=8, max_versions=60, eval_every=20)
    trainer.fit(UserModel(), datamodule=UserData())
    assert [r["version"] for r in trainer.history] == [0, 20, 40, 60]
    assert trainer.history[-1]["accuracy"] == trainer.history[-1]["valid/accuracy"]
    assert trainer.history[-1]["accuracy"] > 0.5 > trainer.history[0]["accuracy"]
    assert trainer.datamodule.batch_size == 16  # read from the user's train loader
    # validate() on the trained global model matches the last history row
    (metrics,) = trainer.validate()
    assert metrics["valid/accuracy"] == pytest.approx(trainer.history[-1]["accuracy"])


class ListDataset(Dataset):
    """Not a TensorDataset: read through the generic path (labels returned as Python numbers)."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        label = self.y[i]
        return self.x[i], label.item() if isinstance(label, torch.Tensor) else label


def test_generic_map_style_dataset_gives_the_same_run_as_tensors(tmp_path):
    digits = DigitsDataModule()
    digits.setup("fit")
    x, y = digits.train_set.tensors

    class Wrapped(UserData):
        def setup(self, stage):
            super().setup(stage)
            self.train = ListDataset(x, y)

    runs = []
    for i, dm in enumerate([UserData(), Wrapped()]):
        torch.manual_seed(0)
        trainer = make_trainer(tmp_path / str(i), FedAsync(concurrency=2), num_clients=5, max_versions=5)
        trainer.fit(UserModel(), datamodule=dm)
        runs.append(global_weights(trainer))
    assert torch.equal(runs[0], runs[1])


def _job(client=0, epochs=1, seed=3):
    return ClientJob(0, client, 0, 0.0, JobTiming(0, 1, 0), seed=seed, local_epochs=epochs)


def test_epoch_schedulers_step_once_per_local_epoch():
    shards = ClientShards(torch.randn(20, 64), torch.randint(0, 10, (20,)), [np.arange(20)])
    local = LocalTrainer(UserModel(), shards, batch_size=10)
    start = local.flat.read()
    one = local.train(_job(epochs=1), start).delta
    two = local.train(_job(epochs=2), start).delta
    assert one.abs().sum() > 0 and not torch.equal(one, two)
    # By hand: epoch 1 at lr 0.1, epoch 2 at lr 0.05 (StepLR gamma 0.5). Re-run the same batches manually.
    model = UserModel()
    model.load_state_dict(copy.deepcopy(local.module.state_dict()))
    with torch.no_grad():
        for p, v in zip(model.parameters(), local.flat.param_views(start)):
            p.copy_(v)
    generator = torch.Generator().manual_seed(3)
    for lr in (0.1, 0.05):
        order = torch.randperm(20, generator=generator)
        for s in (0, 10):
            idx = order[s : s + 10]
            model.zero_grad()
            F.cross_entropy(model(shards.inputs[idx]), shards.targets[idx]).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
    expected = torch.cat([p.detach().reshape(-1) for p in model.parameters()]) - start
    assert torch.allclose(two, expected, atol=1e-6)


def test_proximal_term_adds_mu_times_the_distance_to_the_global_model_to_the_gradient():
    """One full-batch step on a linear model, checked against autograd of loss + mu/2 ||w - w_g||^2."""
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    shards = ClientShards(x, y, [np.arange(8)])

    class NoScheduler(UserModel):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    local = LocalTrainer(NoScheduler(), shards, batch_size=8, callbacks=[ProximalTerm(mu=0.7)])
    start = local.flat.read()
    anchor = start + 0.3  # the global model differs from the start point
    # Train from `start` with anchor `anchor`: patch the callback's anchor after on_train_start.
    prox = local.callbacks[0]
    original = prox.on_train_start
    prox.on_train_start = lambda trainer, job, w: original(trainer, job, anchor)
    update = local.train(_job(), start)

    w = start.clone().requires_grad_(True)
    weight, bias = w[:640].view(10, 64), w[640:650]
    order = torch.randperm(8, generator=torch.Generator().manual_seed(3))
    loss = F.cross_entropy(x[order] @ weight.T + bias, y[order]) + 0.7 / 2 * (w - anchor).pow(2).sum()
    loss.backward()
    assert torch.allclose(update.weights, start - 0.1 * w.grad, atol=1e-6)


def test_fedprox_with_large_mu_stays_closer_to_the_global_model(tmp_path):
    drift = {}
    for mu in (0.0, 5.0):
        trainer = make_trainer(
            tmp_path / str(mu), FedProx(mu=mu, clients_per_round=1), num_clients=1, max_versions=1, local_epochs=3
        )
        torch.manual_seed(0)
        model = UserModel()
        start = torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])
        trainer.fit(model, datamodule=UserData())
        drift[mu] = (global_weights(trainer) - start).norm().item()
    assert drift[5.0] < 0.7 * drift[0.0], drift


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(lambda opt: opt, id="optimizer"),
        pytest.param(lambda opt: [opt], id="list"),
        pytest.param(lambda opt: {"optimizer": opt}, id="dict"),
        pytest.param(lambda opt: ([opt], []), id="tuple-of-lists"),
    ],
)
def test_configure_optimizers_return_forms_are_understood(config):
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    assert parse_optimizers(config(opt))[0] is opt


def test_two_optimizers_are_refused_with_a_clear_message():
    a = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="exactly one optimizer, got 2"):
        parse_optimizers([a, a])


def test_manual_optimization_is_refused():
    model = UserModel()
    model.automatic_optimization = False
    shards = ClientShards(torch.randn(4, 64), torch.zeros(4, dtype=torch.long), [np.arange(4)])
    with pytest.raises(ValueError, match="manual optimization"):
        LocalTrainer(model, shards, batch_size=2)


def test_tensor_dataset_shards_do_not_copy_per_client():
    x = torch.randn(100, 3)
    shards = ClientShards(x, torch.arange(100), [np.arange(50), np.arange(50, 100)])
    assert shards.inputs.data_ptr() == x.data_ptr()  # one resident copy, indexed per batch


def test_a_generic_dataset_is_batched_as_its_dataloader_batches_it():
    from torch.utils.data import DataLoader

    from lit_asyncfl.data.shards import DatasetShards, dataset_tensors

    for targets in ([0.6, 0.85, 1.1, 1.35], [2, 0, 1, 3]):
        data = ListDataset(torch.arange(8.0).view(4, 2), targets)
        assert dataset_tensors(data) is None  # never cached: its __getitem__ runs at every draw
        ours = next(DatasetShards(data, [np.arange(4)]).batches(0, 4, torch.Generator().manual_seed(0)))
        theirs = next(iter(DataLoader(data, batch_size=4)))
        assert ours[1].dtype == theirs[1].dtype and sorted(ours[1].tolist()) == sorted(theirs[1].tolist())
    _, y_tensor = dataset_tensors(TensorDataset(torch.zeros(2, 1), torch.tensor([0.5, 1.5])))
    assert y_tensor.tolist() == [0.5, 1.5]
