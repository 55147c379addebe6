"""Parity with ``lightning.Trainer`` on code from the wild (issue 32, item 6): one client, FedAvg, one round of E local
epochs equals ``Trainer(max_epochs=E).fit`` on the same data — every parameter and buffer identical (``torch.equal``,
``num_batches_tracked`` included) when the user's training loader does not shuffle, the same number of optimizer
steps when it does — for the tutorial-style modules of tests/wild_modules.py, tests/wild_pl_modules.py and
tests/parity_modules.py and for the bundled models, engine by engine, in Python and through the CLI.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import torch
import yaml
from conftest import make_trainer
from lightning.fabric.utilities.seed import seed_everything
from parity_modules import (
    BatchNormClassifier,
    BlobData,
    EpochEndAggregation,
    LitAutoEncoder,
    LogDictClassifier,
    MetricsClassifier,
    OwnDataUnshuffled,
    SetupBuildsDataUnshuffled,
    UnlabelledData,
)
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset
from wild_modules import LClassifier, SelfContained, StructClassifier, StructData, TinyGAN, blobs

from lit_asyncfl import models, namespaces
from lit_asyncfl.algorithms import FedAvg, FedBuff
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data import PartitionedDataModule
from lit_asyncfl.server import ModelAverage
from lit_asyncfl.server.aggregators import DataSizeWeight

EPOCHS = 2


def _loaders(dataset, batch_size=8, n_val=16):
    """``fit(model, train_loader, val_loader)``'s data. Each loader has its own generator: a loader without one draws
    its base seed from the global generator at every epoch under ``lightning.Trainer``, which moves the draws of a
    module that samples in training (dropout, a GAN's noise); client jobs never draw it."""

    def build(shuffle):
        val = TensorDataset(*(t[:n_val] for t in dataset.tensors))
        train = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=torch.Generator())
        return (train, DataLoader(val, batch_size=batch_size)), {}, (train,), {}

    return build


def _datamodule(make):
    def build(shuffle):
        return (), {"datamodule": make(shuffle)}, (), {"datamodule": make(shuffle)}

    return build


def _hooks(shuffle):
    return (), {}, (), {}


def _images(n=16, channels=3, size=32, classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, size, size, generator=g)
    return TensorDataset(x, torch.randint(0, classes, (n,), generator=g))


def _vectors(n=32, dim=16, seed=0, regression=False):
    if regression:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(n, dim, generator=g)
        return TensorDataset(x, x @ torch.randn(dim, generator=g))
    return blobs(n, dim, classes=2, seed=seed)


def _tokens(n=16, length=12, vocab=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDataset(torch.randint(1, vocab, (n, length), generator=g), torch.randint(0, 2, (n,), generator=g))


@dataclass
class Case:
    """A module tried against ``lightning.Trainer``: its source style, how it gets its data, and the engines that
    refuse it at fit start (engine -> the refusal's message)."""

    style: str
    model: Any
    data: Any
    refused: dict[str, str] | None = None


MANUAL = r"uses manual optimization.*engine='lightning'"
CASES = {
    "tutorial-classifier": Case("lightning.pytorch, fit(model, datamodule=dm)", LClassifier,
                                _datamodule(lambda s: BlobData(shuffle=s))),
    "old-namespace": Case("import pytorch_lightning as pl (Flower's quickstart style), fit(model, dm)",
                          lambda: __import__("wild_pl_modules").PLClassifier(),
                          _datamodule(lambda s: __import__("parity_pl_modules").PLBlobData(s))),
    "gan-manual-optimization": Case("Lightning's GAN example: two optimizers, manual_backward, toggle_optimizer",
                                    TinyGAN, _loaders(blobs(40)), {"fast": MANUAL, "cohort": MANUAL}),
    "autoencoder-no-labels": Case("Lightning's autoencoder example on a one-tensor dataset", LitAutoEncoder,
                                  _datamodule(lambda s: UnlabelledData(s))),
    "log_dict": Case("self.log_dict in training_step and validation_step", LogDictClassifier,
                     _loaders(blobs(40))),
    "on_validation_epoch_end": Case("outputs kept in validation_step, logged in on_validation_epoch_end",
                                    EpochEndAggregation, _datamodule(lambda s: BlobData(s))),
    "batchnorm": Case("BatchNorm1d (running average)", BatchNormClassifier, _datamodule(lambda s: BlobData(s)),
                      {"cohort": r"engine='fast'"}),
    "batchnorm-cumulative": Case("BatchNorm1d(momentum=None): reads num_batches_tracked",
                                 lambda: BatchNormClassifier(momentum=None), _loaders(blobs(40)),
                                 {"cohort": r"engine='fast'"}),
    "torchmetrics": Case("torchmetrics.Accuracy objects in training_step and validation_step", MetricsClassifier,
                         _datamodule(lambda s: BlobData(s)),
                         {"cohort": r"engine='cohort' cannot update a torchmetrics object.*engine='fast'"}),
    "namedtuple-batches": Case("namedtuple batches from a collate_fn", lambda: StructClassifier("namedtuple"),
                               _datamodule(lambda s: _struct_data("namedtuple", s))),
    "own-dataloader-hooks": Case("train_dataloader/val_dataloader hooks on the module, fit(model)", OwnDataUnshuffled,
                                 _hooks),
    "setup-builds-data": Case("setup() builds the data its dataloader hooks read", SetupBuildsDataUnshuffled, _hooks,
                              {"fast": r"overrides \['setup'\].*engine='lightning'",
                               "cohort": r"overrides \['setup'\].*engine='lightning'"}),
    "bundled-LeNet5": Case("lit_asyncfl.models", lambda: models.LeNet5(input_size=8),
                           _loaders(_images(channels=1, size=8))),
    "bundled-SimpleCNN": Case("lit_asyncfl.models", models.SimpleCNN, _loaders(_images())),
    "bundled-ResNet20": Case("lit_asyncfl.models (BatchNorm)", models.ResNet20, _loaders(_images()),
                             {"cohort": r"engine='fast'"}),
    "bundled-VGG11": Case("lit_asyncfl.models (BatchNorm, dropout)", lambda: models.VGG11(width=0.125),
                          _loaders(_images()), {"cohort": r"engine='fast'"}),
    "bundled-AlexNet": Case("lit_asyncfl.models (dropout)", lambda: models.AlexNet(width=0.25, hidden_dim=32),
                            _loaders(_images())),
    "bundled-TextCNN": Case("lit_asyncfl.models (embeddings, dropout)",
                            lambda: models.TextCNN(vocab_size=30, embed_dim=8, num_filters=4), _loaders(_tokens())),
    "bundled-MLP": Case("lit_asyncfl.models", lambda: models.MLP(input_dim=16, hidden_dims=(8,), num_classes=2),
                        _loaders(_vectors())),
    "bundled-LogisticRegression": Case("lit_asyncfl.models", lambda: models.LogisticRegression(16, num_classes=2),
                                       _loaders(_vectors())),
    "bundled-LinearRegression": Case("lit_asyncfl.models", lambda: models.LinearRegression(16),
                                     _loaders(_vectors(regression=True))),
    "bundled-LinearSVM": Case("lit_asyncfl.models", lambda: models.LinearSVM(16), _loaders(_vectors())),
}  # fmt: skip


def _struct_data(structure, shuffle):
    class Unshuffled(StructData):
        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=16, shuffle=shuffle, collate_fn=self.train_set.collate)

    return Unshuffled(structure)


class _FirstJob(Callback):
    def __init__(self):
        self.jobs, self.steps = [], []

    def on_client_update(self, trainer, update, aggregated):
        self.jobs.append(update.job)
        self.steps.append(update.num_steps)


@contextmanager
def _optimizer_steps():
    """Count every ``optimizer.step()`` (whoever calls it: an engine, a Trainer, a module's manual optimization)."""
    steps = [0]
    handle = register_optimizer_step_post_hook(lambda *args: steps.__setitem__(0, steps[0] + 1))
    try:
        yield steps
    finally:
        handle.remove()


def _federated(tmp_path, case, engine, shuffle):
    """One client, FedAvg, one round of EPOCHS local epochs: the global model, its initial copy, the job, the
    optimizer steps (the cohort engine steps no torch optimizer: its update's count). ``onednn=True``: the kernels
    Lightning runs (by default small convolutions train without oneDNN, equal within float rounding)."""
    record = _FirstJob()
    trainer = make_trainer(tmp_path, "fedavg", num_clients=1, max_versions=1, local_epochs=EPOCHS, engine=engine,
                           callbacks=[record], seed=3, onednn=True)  # fmt: skip
    model = case.model()
    initial = copy.deepcopy(model)
    args, kwargs, _, _ = case.data(shuffle)
    with _optimizer_steps() as steps:
        trainer.fit(model, *args, **kwargs)
    assert trainer.summary["versions"] == 1 and len(record.jobs) == 1
    return model, initial, record.jobs[0], record.steps[0] if engine == "cohort" else steps[0]


def _lightning(model, case, shuffle, seed):
    """``Trainer(max_epochs=EPOCHS).fit`` of the module's own package, seeded as the client's job (no validation:
    the global evaluation never touches the weights either)."""
    trainer = namespaces.package_of(model).Trainer(
        max_epochs=EPOCHS, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    _, _, args, kwargs = case.data(shuffle)
    torch.manual_seed(seed)
    with _optimizer_steps() as steps:
        trainer.fit(model, *args, **kwargs)
    return model, steps[0]


def _assert_identical(model, reference):
    state, expected = model.state_dict(), reference.state_dict()
    assert state.keys() == expected.keys()
    different = [name for name in expected if not torch.equal(state[name], expected[name])]
    assert not different, f"differ from lightning.Trainer: {different}"


@pytest.mark.parametrize("engine", ["fast", "lightning", "cohort"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_client_one_round_equals_lightning_trainer(tmp_path, name, engine):
    """Unshuffled: every parameter and buffer identical (cohort: batched kernels, within 1e-6; buffers exact);
    shuffled: the same number of optimizer steps (and BatchNorm counts). An engine that cannot run the module refuses
    it at fit start, naming the engine that can."""
    case = CASES[name]
    refusal = (case.refused or {}).get(engine)
    if refusal is not None:
        with pytest.raises(ValueError, match=refusal):
            _federated(tmp_path, case, engine, shuffle=False)
        return
    for shuffle in (False, True):
        model, initial, job, steps = _federated(tmp_path / str(shuffle), case, engine, shuffle)
        reference, reference_steps = _lightning(initial, case, shuffle, job.seed)
        assert steps == reference_steps > 0
        if shuffle:
            continue
        if engine == "cohort":
            for key, value in reference.state_dict().items():
                torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=1e-6)
        else:
            _assert_identical(model, reference)


def test_module_hooks_that_shuffle_give_lightnings_step_count(tmp_path):
    """A module whose own train_dataloader shuffles (SelfContained) trains as many steps as under the Trainer."""
    case = Case("own hooks, shuffle=True", SelfContained, _hooks)
    for engine in ("fast", "lightning"):
        _, initial, job, steps = _federated(tmp_path / engine, case, engine, shuffle=True)
        assert steps == _lightning(initial, case, True, job.seed)[1] == EPOCHS * 15  # 240 samples / 16


@pytest.mark.parametrize(
    ("model", "data", "engine"),
    [("parity_modules.BatchNormClassifier", "parity_modules.BlobData", "fast"),
     ("wild_pl_modules.PLClassifier", "parity_pl_modules.PLBlobData", "fast"),
     ("parity_modules.LitAutoEncoder", "parity_modules.UnlabelledData", "lightning"),
     ("wild_modules.TinyGAN", "parity_modules.BlobData", "lightning")],
)  # fmt: skip
def test_the_cli_trains_as_python_and_as_lightning(tmp_path, model, data, engine):
    """``lit-asyncfl fit --config`` with class_paths to test modules gives the Python run's weights, and (unshuffled)
    the Trainer's."""
    config = {
        "model": {"class_path": model},
        "data": {"class_path": data, "init_args": {"shuffle": False}},
        "trainer": {"algorithm": "fedavg", "num_clients": 1, "max_versions": 1, "local_epochs": EPOCHS,
                    "engine": engine, "seed": 5, "onednn": True, "default_root_dir": str(tmp_path / "cli"),
                    "logger": False, "enable_progress_bar": False, "print_summary": False},
    }  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = FederatedCLI(args=["fit", "--config", str(path)])

    module, cls = model.rsplit(".", 1)
    data_module, data_cls = data.rsplit(".", 1)
    seed_everything(5, verbose=False)  # as the CLI: the run seed, then the model, the data, the trainer
    python_model = getattr(__import__(module), cls)()
    initial = copy.deepcopy(python_model)
    record = _FirstJob()
    trainer = make_trainer(tmp_path / "py", "fedavg", num_clients=1, max_versions=1, local_epochs=EPOCHS,
                           engine=engine, seed=5, callbacks=[record], onednn=True)  # fmt: skip
    trainer.fit(python_model, datamodule=getattr(__import__(data_module), data_cls)(shuffle=False))
    _assert_identical(cli.model, python_model)

    case = Case("cli", None, _datamodule(lambda s: getattr(__import__(data_module), data_cls)(shuffle=s)))
    if cls == "TinyGAN":  # draws noise in training: the data module's loader draws its base seed (see _loaders)
        return
    reference, _ = _lightning(initial, case, False, record.jobs[0].seed)
    _assert_identical(python_model, reference)


# -- the user's DataLoader(shuffle=False) across several clients -------------------------------------------------------
class RecordsInputs(LClassifier):
    """Records the first feature of every training sample (the data's ``x[:, 0]`` is the sample's index)."""

    seen: ClassVar[list[list[int]]] = []  # a class attribute: the engines train a copy of the module

    def training_step(self, batch, batch_idx):
        if torch.is_grad_enabled():  # (not the fast engine's probe of the module at fit start)
            type(self).seen.append(batch[0][:, 0].long().tolist())
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("engine", ["fast", "lightning"])
@pytest.mark.parametrize("resident", [True, False], ids=["tensor-dataset", "read-per-sample"])
def test_unshuffled_clients_iterate_their_shard_in_order_every_epoch(tmp_path, engine, resident):
    """shuffle=False: each client's every epoch is its shard in dataset order (the shard a partition gives, a sorted
    subset), in the loader's batches; shuffle=True: a reordering of the shard."""
    x = torch.randn(30, 16)
    x[:, 0] = torch.arange(30)
    dataset = TensorDataset(x, torch.arange(30) % 4)
    for shuffle in (False, True):
        loader = DataLoader(dataset, batch_size=4, shuffle=shuffle, collate_fn=None if resident else list_collate)
        trainer = make_trainer(tmp_path / str(shuffle), FedAvg(clients_per_round=3), num_clients=3, max_versions=1,
                               local_epochs=2, engine=engine)  # fmt: skip
        model = RecordsInputs()
        RecordsInputs.seen = []
        trainer.fit(model, loader)
        shards = [s.tolist() for s in trainer.simulator.executor.trainer.shards.indices_numpy()]
        epochs = _epochs(model.seen, [len(s) for s in shards])
        assert sorted(sorted(order) for order, _ in epochs) == sorted(s for s in shards for _ in range(2))
        for order, batches in epochs:
            assert [len(b) for b in batches] == [4] * (len(order) // 4) + ([len(order) % 4] if len(order) % 4 else [])
        in_order = [order == sorted(order) for order, _ in epochs]
        assert all(in_order) if not shuffle else not any(in_order)


def list_collate(samples):
    """A user collate_fn (the dataset is then read per sample at every draw)."""
    return [torch.stack([s[0] for s in samples]), torch.stack([s[1] for s in samples])]


def _epochs(seen, sizes):
    """Cut the recorded batches into epochs (each job's two epochs over its shard)."""
    epochs, batches, count = [], [], 0
    for batch in seen:
        batches.append(batch)
        count += len(batch)
        if count in sizes:
            epochs.append(([i for b in batches for i in b], batches))
            batches, count = [], 0
    return epochs


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(blobs(40))


@pytest.mark.parametrize(
    ("loader", "message"),
    [(lambda: DataLoader(blobs(40), batch_size=8, sampler=torch.utils.data.WeightedRandomSampler([1.0] * 40, 40)),
      r"sampler WeightedRandomSampler cannot be followed.*shuffle=True.*shuffle=False"),
     (lambda: DataLoader(Stream(), batch_size=8), r"Stream is an IterableDataset, which cannot be split.*map-style")],
)  # fmt: skip
def test_a_loader_the_clients_cannot_follow_is_refused(tmp_path, loader, message):
    trainer = make_trainer(tmp_path, "fedavg", num_clients=2, max_versions=1)
    with pytest.raises(ValueError, match=message):
        trainer.fit(LClassifier(), loader())


# -- BatchNorm's num_batches_tracked in the global model ---------------------------------------------------------------
def _counted(client, num_samples, counts):
    job = ClientJob(client, client, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    update = ClientUpdate(job, torch.zeros(2), torch.zeros(2), num_samples, 1, 0.0)
    update.batches_tracked = None if counts is None else torch.tensor(counts)
    return update


def test_the_global_count_grows_by_the_weighted_mean_of_the_jobs_counts():
    """Each version adds sum_i p_i b_i / sum_i p_i (FedAvg: p_i = n_i), rounded half to even; an update without
    counts adds nothing; the count is part of the server's state."""
    server = Server(torch.zeros(2), ModelAverage(buffer_size=2), [DataSizeWeight()], num_clients=3)
    server.on_fit_start()
    for update in (_counted(0, 10, [4, 6]), _counted(1, 30, [8, 2])):
        server.receive(update)
    assert server.batches_tracked.tolist() == [7, 3]  # (10*4 + 30*8) / 40, (10*6 + 30*2) / 40
    for update in (_counted(0, 10, [5, 1]), _counted(1, 10, [6, 1]), _counted(2, 10, None)):
        server.receive(update)
    assert server.flush() and server.version == 3
    assert server.batches_tracked.tolist() == [7 + 6, 3 + 1]  # 5.5 rounds to 6; the last version: no counts
    restored = Server(torch.zeros(2), ModelAverage(buffer_size=2), [DataSizeWeight()], num_clients=3)
    restored.load_state_dict(server.state_dict())
    assert torch.equal(restored.batches_tracked, server.batches_tracked)


def test_the_global_models_batchnorm_count_is_fedavgs_mean_of_the_clients_counts(tmp_path):
    """Three clients, one FedAvg round: num_batches_tracked = round(sum_i n_i b_i / sum_i n_i) with b_i = E *
    ceil(n_i / batch_size) — Flower's and FedML's average of the state dicts (they truncate where we round)."""
    trainer = make_trainer(tmp_path, FedAvg(clients_per_round=3), num_clients=3, max_versions=1, local_epochs=2, seed=0)
    model = BatchNormClassifier()
    trainer.fit(model, datamodule=PartitionedDataModule(BlobData(n=56, batch_size=8), partition="quantity"))
    sizes = [trainer.simulator.executor.trainer.shards.num_samples(c) for c in range(3)]
    counts = [2 * -(-n // 8) for n in sizes]
    expected = round(sum(n * b for n, b in zip(sizes, counts)) / sum(sizes))
    assert len(set(counts)) > 1 and model.net[1].num_batches_tracked.item() == expected


def test_a_run_resumed_with_buffered_updates_keeps_their_counts(tmp_path):
    """FedBuff stopped with a half-filled buffer: the buffered updates' counts (clients of different sizes count
    different numbers of batches) are in the checkpoint."""
    make = lambda: FedBuff(buffer_size=2, concurrency=3)  # noqa: E731
    data = lambda: PartitionedDataModule(BlobData(n=56, batch_size=4), partition="quantity")  # noqa: E731
    full = make_trainer(tmp_path / "full", make(), num_clients=4, max_versions=4, seed=0)
    full.fit(BatchNormClassifier(), datamodule=data())
    for fraction in (0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8):
        first = make_trainer(tmp_path / f"first{fraction}", make(), num_clients=4, seed=0,
                             max_virtual_time=fraction * full.simulator.now)  # fmt: skip
        first.fit(BatchNormClassifier(), datamodule=data())
        if first.algorithm.aggregator.buffer and 0 < first.simulator.server.version < 4:
            break
    assert first.algorithm.aggregator.buffer
    resumed = make_trainer(tmp_path / "resumed", make(), num_clients=4, max_versions=4, seed=0)
    model = BatchNormClassifier()
    resumed.fit(model, datamodule=data(), ckpt_path=str(next((tmp_path / f"first{fraction}").rglob("last.ckpt"))))
    assert torch.equal(resumed.simulator.server.batches_tracked, full.simulator.server.batches_tracked)
    assert model.net[1].num_batches_tracked.item() == full.global_model.net[1].num_batches_tracked.item() > 0


def test_a_resumed_run_keeps_the_global_count(tmp_path):
    full = make_trainer(tmp_path / "full", FedAvg(clients_per_round=2), num_clients=2, max_versions=3)
    full.fit(BatchNormClassifier(), datamodule=BlobData(n=48))
    first = make_trainer(tmp_path / "first", FedAvg(clients_per_round=2), num_clients=2, max_versions=2)
    first.fit(BatchNormClassifier(), datamodule=BlobData(n=48))
    resumed = make_trainer(tmp_path / "resumed", FedAvg(clients_per_round=2), num_clients=2, max_versions=3)
    model = BatchNormClassifier()
    resumed.fit(model, datamodule=BlobData(n=48), ckpt_path=str(next((tmp_path / "first").rglob("last.ckpt"))))
    count = full.global_model.net[1].num_batches_tracked.item()
    assert model.net[1].num_batches_tracked.item() == count == 3 * 3  # 3 rounds of 24 samples / 8
