"""A zoo of modules written the way Lightning's documentation writes them: the global evaluation reports what
``lightning.Trainer.validate`` reports for the same weights, hooks in the same order."""

from __future__ import annotations

import copy

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.fabric.utilities.exceptions import MisconfigurationException
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torchmetrics.classification import MulticlassAccuracy

from lit_asyncfl.validation_loop import run_evaluation


def _data(n=23, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.layer(x.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class MetricAttribute(Classifier):
    """A torchmetrics object as an attribute, updated in the step and logged as an object."""

    def __init__(self):
        super().__init__()
        self.val_acc = MulticlassAccuracy(num_classes=10)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc)
        self.log("val_loss", F.cross_entropy(logits, y))


class EpochEndLogging(Classifier):
    """Outputs collected in the step and the metric computed in ``on_validation_epoch_end``."""

    def on_validation_epoch_start(self):
        self.outputs = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.outputs.append((self(x).argmax(1) == y).float())

    def on_validation_epoch_end(self):
        self.log("val_acc_all", torch.cat(self.outputs).mean())


class DictBatches(Classifier):
    def validation_step(self, batch, batch_idx):
        logits = self(batch["image"])
        self.log("val_loss", F.cross_entropy(logits, batch["label"]))


class TwoLoaders(Classifier):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))
        if dataloader_idx == 1:
            self.log("val_unsuffixed", F.cross_entropy(self(x), y), add_dataloader_idx=False)


class Reductions(Classifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        losses = F.cross_entropy(self(x), y, reduction="none")
        self.log("val_max", losses.max(), reduce_fx="max")
        self.log("val_min", losses.min(), reduce_fx=torch.min)
        self.log("val_sum", losses.sum(), reduce_fx="sum")
        self.log("val_unweighted", losses.mean(), batch_size=1)
        self.log("val_both", losses.mean(), on_step=True, on_epoch=True)
        self.log("val_step_only", losses.mean(), on_step=True, on_epoch=False)
        self.log_dict({"val_a": losses.mean(), "val_b": losses.std()})


HOOKS = [
    "on_validation_model_eval", "on_validation_start", "on_validation_epoch_start", "on_before_batch_transfer",
    "transfer_batch_to_device", "on_after_batch_transfer", "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end", "on_validation_model_train",
]  # fmt: skip


class HookOrder(Classifier):
    """Records every validation hook (and the step) in call order."""

    def __init__(self):
        super().__init__()
        self.calls = []
        for name in HOOKS:
            self._record(name)

    def _record(self, name):
        original = getattr(self, name)
        if name == "on_validation_model_eval":  # Lightning's own reach for self.trainer.model
            original = self.eval
        elif name == "on_validation_model_train":
            original = self.train

        def hook(*args, **kwargs):
            self.calls.append(name)
            return original(*args, **kwargs)

        setattr(self, name, hook)

    def validation_step(self, batch, batch_idx):
        self.calls.append("validation_step")
        self.log("val_loss", F.cross_entropy(self(batch[0]), batch[1]))


class DictDataset(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": self.y[i]}


class SameKeyTwoHooks(Classifier):
    """Logs one name per batch and again at epoch end: Lightning keeps the later hook's value."""

    def validation_step(self, batch, batch_idx):
        self.log("score", F.cross_entropy(self(batch[0]), batch[1]))

    def on_validation_epoch_end(self):
        self.log("score", 42.0)


class Misuse(Classifier):
    """A ``self.log`` call Lightning refuses, chosen by ``how``."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        loss = F.cross_entropy(self(batch[0]), batch[1])
        if self.how == "non-scalar":
            self.log("per_sample", F.cross_entropy(self(batch[0]), batch[1], reduction="none"))
        elif self.how == "changing-reduce_fx":
            self.log("loss", loss, reduce_fx="mean" if batch_idx == 0 else "max")
        elif self.how == "no-dataloader-idx":
            self.log("loss", loss, add_dataloader_idx=False)
        else:
            self.log("loss", loss)

    def on_validation_epoch_end(self):
        if self.how == "on_step-at-epoch-end":
            self.log("late", 1.0, on_step=True)

    def on_validation_end(self):
        if self.how == "log-in-on_validation_end":
            self.log("final", 1.0)


def _loaders(kind):
    x, y = _data()
    if kind == "dict":
        return [DataLoader(DictDataset(x, y), batch_size=10)]
    if kind == "two":
        x2, y2 = _data(17, seed=1)
        return [DataLoader(TensorDataset(x, y), batch_size=10), DataLoader(TensorDataset(x2, y2), batch_size=4)]
    return [DataLoader(TensorDataset(x, y), batch_size=10)]  # 10, 10, 3: uneven batches weigh by size


def _lightning_validate(model, loaders):
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip
    return trainer.validate(model, dataloaders=loaders if len(loaders) > 1 else loaders[0], verbose=False)


@pytest.mark.parametrize(
    ("module", "kind"),
    [
        pytest.param(MetricAttribute, "tensor", id="torchmetrics-attribute"),
        pytest.param(EpochEndLogging, "tensor", id="epoch-end-logging"),
        pytest.param(DictBatches, "dict", id="dict-batches"),
        pytest.param(TwoLoaders, "two", id="two-validation-loaders"),
        pytest.param(Reductions, "tensor", id="reductions-and-batch-size"),
        pytest.param(SameKeyTwoHooks, "tensor", id="same-key-in-step-and-epoch-end"),
    ],
)
def test_the_global_evaluation_equals_lightning_validate(module, kind):
    torch.manual_seed(0)
    model = module()
    fresh = copy.deepcopy(model)  # never attached to a Trainer: self.trainer and its routing are not there
    loaders = _loaders(kind)
    expected = _lightning_validate(model, loaders)
    ours = run_evaluation(fresh, [list(dl) for dl in loaders], "val")
    assert [sorted(r) for r in ours] == [sorted(r) for r in expected]
    for mine, theirs in zip(ours, expected):
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key
    again = run_evaluation(fresh, [list(dl) for dl in loaders], "val")  # metric objects were reset
    assert again == ours


@pytest.mark.parametrize(
    "how", ["non-scalar", "changing-reduce_fx", "no-dataloader-idx", "on_step-at-epoch-end", "log-in-on_validation_end"]
)
def test_what_lightning_refuses_to_log_is_refused_by_the_global_evaluation(how):
    loaders = _loaders("two" if how == "no-dataloader-idx" else "tensor")
    refusals = (ValueError, MisconfigurationException)
    with pytest.raises(refusals):
        _lightning_validate(Misuse(how), loaders)
    with pytest.raises(refusals) as our_error:
        run_evaluation(Misuse(how), [list(dl) for dl in loaders], "val")
    assert "self.log" in str(our_error.value), str(our_error.value)


def test_validation_hooks_run_in_lightnings_order():
    torch.manual_seed(0)
    lightning_model, our_model = HookOrder(), HookOrder()
    _lightning_validate(lightning_model, _loaders("tensor"))
    run_evaluation(our_model, [list(dl) for dl in _loaders("tensor")], "val")
    assert our_model.calls == lightning_model.calls
    assert our_model.training  # the mode is restored


# -- local training: what a client job honours, or refuses at fit start ----------------------------------------
def _fit(tmp_path, model, engine="fast", **kwargs):
    from conftest import make_trainer

    from lit_asyncfl.algorithms import FedAsync
    from lit_asyncfl.data import DigitsDataModule

    trainer = make_trainer(tmp_path, FedAsync(concurrency=3), max_versions=kwargs.pop("max_versions", 6),
                           engine=engine, **kwargs)  # fmt: skip
    trainer.fit(model, datamodule=DigitsDataModule())
    return trainer


class WithCallbacks(Classifier):
    def configure_callbacks(self):
        return [L.pytorch.callbacks.EarlyStopping(monitor="train_loss")]


class Plateau(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                                                     "monitor": "val_loss"}}  # fmt: skip


class OneCycle(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        steps = self.trainer.estimated_stepping_batches
        return [opt], [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)]


class OneCycleRecording(OneCycle):
    """Reads self.trainer in configure_optimizers and in training_step."""

    def training_step(self, batch, batch_idx):
        self.seen = getattr(self, "seen", [])
        t = self.trainer
        self.seen.append((t.current_epoch, t.global_step, t.estimated_stepping_batches))
        return super().training_step(batch, batch_idx)


class StepDecay(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


@pytest.mark.parametrize("engine", ["fast", "lightning"])
@pytest.mark.parametrize(
    ("module", "message"),
    [
        pytest.param(WithCallbacks, r"configure_callbacks\(\) returned \['EarlyStopping'\]: .* once per client job",
                     id="configure-callbacks"),
        pytest.param(Plateau, r"ReduceLROnPlateau, which needs a monitored metric per local epoch", id="plateau"),
    ],
)  # fmt: skip
def test_what_client_jobs_cannot_honour_is_refused_at_fit_start(tmp_path, engine, module, message):
    with pytest.raises(ValueError, match=message):
        _fit(tmp_path, module(), engine=engine)


def test_self_trainer_in_configure_optimizers_and_training_step_as_a_trainer_of_the_job(tmp_path):
    runs = {}
    for engine in ("fast", "lightning"):
        torch.manual_seed(0)
        model = OneCycleRecording()
        trainer = _fit(tmp_path / engine, model, engine=engine, local_epochs=2)
        engine_module = trainer.simulator.executor.trainer.module
        runs[engine] = (trainer.simulator.server.weights, engine_module.seen)
    assert torch.equal(runs["fast"][0], runs["lightning"][0])  # the same schedule over the job's steps
    assert runs["fast"][1] == runs["lightning"][1]  # (current_epoch, global_step, estimated_stepping_batches)
    assert runs["fast"][1][-1][0] == 1  # the last job's second epoch


class ReadsDatamodule(Classifier):
    def configure_optimizers(self):
        self.trainer.datamodule  # noqa: B018 (what a job of the fast engine cannot offer)
        return super().configure_optimizers()


def test_what_self_trainer_cannot_offer_is_refused_at_fit_start_naming_the_engine(tmp_path):
    with pytest.raises(
        ValueError, match=r"self.trainer.datamodule is not available under engine='fast'.*engine='lightning'"
    ):
        _fit(tmp_path, ReadsDatamodule())


class EpochEndHook(Classifier):
    def on_train_epoch_end(self):
        self.layer.weight.data.mul_(0.5)


class DataModuleBatchHook(L.LightningDataModule):
    def on_after_batch_transfer(self, batch, dataloader_idx):
        return batch


def test_training_hooks_only_a_real_trainer_runs_are_refused_by_the_other_engines(tmp_path):
    for engine in ("fast", "cohort"):
        with pytest.raises(ValueError, match=r"overrides \['on_train_epoch_end'\], which engine='\w+' does not run"):
            _fit(tmp_path / engine, EpochEndHook(), engine=engine)
    assert _fit(tmp_path / "lightning", EpochEndHook(), engine="lightning").summary["versions"] == 6


def test_a_data_modules_batch_hooks_are_refused():
    from lit_asyncfl.client.contract import check_lightning_contract

    with pytest.raises(ValueError, match=r"DataModuleBatchHook overrides \['on_after_batch_transfer'\].*define them"):
        check_lightning_contract(Classifier(), "lightning", DataModuleBatchHook())


def test_schedulers_restart_with_every_job_and_it_is_announced(tmp_path, caplog):
    from conftest import make_trainer

    from lit_asyncfl.algorithms import Algorithm
    from lit_asyncfl.client import ClientCallback
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.schedulers import KeepConcurrency
    from lit_asyncfl.server import Mixing

    lrs = []

    class LrAtEnd(ClientCallback):
        def on_train_end(self, trainer, job, update):
            lrs.append((trainer.job_info["lr"], trainer.optimizer.param_groups[0]["lr"]))

    algorithm = Algorithm(KeepConcurrency(3), Mixing(alpha=0.5), client_callbacks=[LrAtEnd()])
    with caplog.at_level("INFO", logger="lit_asyncfl"):
        make_trainer(tmp_path, algorithm, max_versions=6, local_epochs=2).fit(StepDecay(), DigitsDataModule())
    assert [r.message for r in caplog.records if "restart with every client job" in r.message]
    assert len(lrs) >= 6 and set(lrs) == {(0.1, 0.025)}  # every job: 0.1 at its start, halved after each epoch


class CountsSteps(Classifier):
    """A torchmetrics object updated in ``training_step`` that keeps every value (would grow without reset)."""

    def __init__(self):
        super().__init__()
        from torchmetrics.aggregation import CatMetric

        self.train_losses = CatMetric()

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.train_losses.update(loss.detach())
        return loss


@pytest.mark.parametrize("engine", ["fast", "lightning"])
def test_metric_objects_are_reset_at_every_client_job(tmp_path, engine):
    trainer = _fit(tmp_path, CountsSteps(), engine=engine, max_versions=20)
    engine_module = trainer.simulator.executor.trainer.module
    held = len(engine_module.train_losses.value)
    largest_job = max(-(-trainer.simulator.num_samples // 10))  # steps of the largest client's job (batch 10)
    assert 0 < held <= largest_job  # one job's steps at most (about 20 jobs' without the reset)


# -- client data follows the user's DataLoader -----------------------------------------------------------------
class CountingNoisyDigits(Dataset):
    """Digits with a random transform in ``__getitem__`` (noise from the global RNG, as torchvision transforms
    draw), counting the reads."""

    def __init__(self, x, y, as_dict=False, label_key="label", noise=0.01):
        self.x, self.y, self.as_dict, self.label_key, self.noise = x, y, as_dict, label_key, noise
        self.reads = 0

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        self.reads += 1
        image = self.x[i] + self.noise * torch.randn_like(self.x[i]) if self.noise else self.x[i]
        return {"image": image, self.label_key: self.y[i]} if self.as_dict else (image, self.y[i])


class UserData(L.LightningDataModule):
    def __init__(self, n=200, batch_size=10, drop_last=False, **dataset_kwargs):
        super().__init__()
        from lit_asyncfl.data import DigitsDataModule

        digits = DigitsDataModule()
        digits.setup("fit")
        x, y = digits.train_set.tensors
        self.train = CountingNoisyDigits(x[:n].float(), y[:n], **dataset_kwargs)
        self.val = digits.test_set
        self.batch_size, self.drop_last = batch_size, drop_last

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size, shuffle=True, drop_last=self.drop_last)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=512)


class DictClassifier(Classifier):
    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self(batch["image"]), batch["label"])


class BatchNormNet(Classifier):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(64)

    def forward(self, x):
        return self.layer(self.norm(x.flatten(1)))


def _fit_user(tmp_path, model, data, partition="iid", labels=None, **kwargs):
    from conftest import make_trainer

    from lit_asyncfl.algorithms import FedAsync
    from lit_asyncfl.data import PartitionedDataModule

    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=kwargs.pop("num_clients", 5),
                           max_versions=kwargs.pop("max_versions", 8), **kwargs)  # fmt: skip
    trainer.fit(model, datamodule=PartitionedDataModule(data, partition=partition, labels=labels))
    return trainer


def test_random_transforms_are_drawn_afresh_at_every_read(tmp_path):
    data = UserData()
    trainer = _fit_user(tmp_path, Classifier(), data, max_versions=40)
    drawn = trainer.summary["updates_received"] * 40  # 5 clients of 40 samples, one epoch per job
    assert data.train.reads >= drawn > 201  # every drawn sample was read (and transformed) again


def test_runs_over_a_transformed_dataset_stay_deterministic(tmp_path):
    runs = []
    for name in ("a", "b"):
        torch.manual_seed(0)  # the module is built before the trainer seeds the RNGs
        runs.append(_fit_user(tmp_path / name, Classifier(), UserData()))
    first, again = runs
    assert torch.equal(first.simulator.server.weights, again.simulator.server.weights)


def test_drop_last_of_the_users_loader_is_honoured(tmp_path):
    # 5 clients of 41 samples in batches of 10: without drop_last each epoch ends on a batch of one, which
    # BatchNorm refuses in training; with it, every job takes 4 steps, as the user's DataLoader would
    trainer = _fit_user(tmp_path, BatchNormNet(), UserData(n=205, drop_last=True))
    assert trainer.summary["versions"] == 8
    assert {job.num_steps for job in trainer.simulator.in_flight.values()} == {4}
    from lit_asyncfl.core.simulator import ClientJobError

    with pytest.raises(ClientJobError, match="raised ValueError: Expected more than 1 value per channel"):
        _fit_user(tmp_path / "no", BatchNormNet(), UserData(n=205, drop_last=False))


def test_dict_batches_train_and_partition_by_their_label_key(tmp_path):
    trainer = _fit_user(tmp_path, DictClassifier(), UserData(as_dict=True), partition="dirichlet")
    assert trainer.summary["versions"] == 8
    counts = trainer.datamodule.partition_counts
    y = trainer.datamodule.train_set.y
    shards = trainer.simulator.executor.trainer.shards
    expected = [np.bincount(y[shards.indices[c]].numpy(), minlength=10).tolist() for c in range(5)]
    assert counts.tolist() == expected and counts.sum() == 200


def test_labels_that_cannot_be_found_are_asked_for_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"cannot find the labels .* PartitionedDataModule\(labels=lambda sample"):
        _fit_user(tmp_path / "a", DictClassifier(), UserData(as_dict=True, label_key="cls"), partition="dirichlet")

    class ClsClassifier(Classifier):
        def training_step(self, batch, batch_idx):
            return F.cross_entropy(self(batch["image"]), batch["cls"])

    trainer = _fit_user(tmp_path / "b", ClsClassifier(), UserData(as_dict=True, label_key="cls"),
                        partition="dirichlet", labels=lambda sample: sample["cls"])  # fmt: skip
    assert trainer.datamodule.partition_counts.shape == (5, 10)
    iid = _fit_user(tmp_path / "c", ClsClassifier(), UserData(as_dict=True, label_key="cls"))  # IID needs none
    assert iid.summary["versions"] == 8


def test_a_validation_dataset_is_read_at_every_evaluation_and_deterministically(tmp_path):
    class NoisyVal(UserData):
        def __init__(self):
            super().__init__()
            x, y = self.val.tensors
            self.val = CountingNoisyDigits(x.float(), y)

    histories, reads = [], []
    for name in ("a", "b"):
        torch.manual_seed(0)
        data = NoisyVal()
        trainer = _fit_user(tmp_path / name, Classifier(), data, max_versions=8, eval_every=2)
        histories.append([{k: v for k, v in r.items() if k != "wall_time"} for r in trainer.history])
        reads.append(data.val.reads)
    assert reads[0] == len(histories[0]) * 360  # every evaluation read (and transformed) the 360 samples
    assert histories[0] == histories[1]  # the transforms are drawn from the run's seed


def test_drop_last_with_a_client_smaller_than_a_batch_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"drop_last=True with batch_size=64, but a client holds 40 samples"):
        _fit_user(tmp_path, Classifier(), UserData(batch_size=64, drop_last=True))


def test_the_bare_name_of_an_on_step_and_on_epoch_metric_is_in_the_history(tmp_path):
    class Both(Classifier):
        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_acc", (self(x).argmax(1) == y).float().mean(), on_step=True, on_epoch=True)

    trainer = _fit_user(tmp_path, Both(), UserData())
    row = trainer.history[-1]
    assert row["val_acc"] == row["val_acc_epoch"] == row["accuracy"]  # as in Lightning's callback_metrics


def test_a_collate_fn_over_a_tensor_dataset_is_followed(tmp_path):
    calls = []

    class Blank(L.LightningDataModule):
        def setup(self, stage):
            from lit_asyncfl.data import DigitsDataModule

            self.digits = DigitsDataModule()
            self.digits.setup(stage)

        def train_dataloader(self):
            def collate(samples):
                x, y = torch.utils.data.default_collate(samples)
                calls.append(len(y))
                return x * 0.0, y  # blank images: the layer's weights get no gradient

            return DataLoader(self.digits.train_set, batch_size=10, collate_fn=collate)

        def val_dataloader(self):
            return self.digits.val_dataloader()

    torch.manual_seed(0)
    model = Classifier()
    start = model.layer.weight.detach().clone()
    trainer = _fit_user(tmp_path, model, Blank())
    assert calls  # the user's collate made the clients' batches
    assert torch.equal(trainer.global_model.layer.weight, start)  # only the bias learned


def test_the_cohort_engine_draws_a_datasets_transforms_as_the_fast_engine(tmp_path):
    runs = {}
    for engine in ("fast", "cohort"):
        torch.manual_seed(0)
        runs[engine] = _fit_user(tmp_path / engine, Classifier(), UserData(), engine=engine).simulator.server.weights
    torch.testing.assert_close(runs["cohort"], runs["fast"], rtol=1e-5, atol=1e-6)


class LogsInTraining(Classifier):
    """Logs its loss (on_step, Lightning's default in training) and a metric object from training_step, and
    records what it logged with the batch sizes (an independent account of the job's weighted mean)."""

    def __init__(self):
        super().__init__()
        self.train_acc = MulticlassAccuracy(num_classes=10)
        self.record = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_loss", loss)
        self.log("train_acc", self.train_acc)
        self.record.append((float(loss), len(y)))
        return loss


def test_what_training_step_logs_reaches_run_callbacks_per_update(tmp_path):
    from lit_asyncfl.callbacks import Callback

    class Collect(Callback):
        def __init__(self):
            self.updates = []

        def on_client_update(self, trainer, update, aggregated):
            module = trainer.simulator.executor.trainer.module  # jobs run when their update is asked for
            self.updates.append((update.metrics, list(module.record)))
            module.record.clear()

    seen = {}
    for engine in ("fast", "lightning"):
        collect = Collect()
        torch.manual_seed(0)
        _fit(tmp_path / engine, LogsInTraining(), engine=engine, callbacks=[collect])
        seen[engine] = collect.updates
    for metrics, record in seen["fast"]:
        total = sum(n for _, n in record)
        expected = sum(loss * n for loss, n in record) / total  # batch-size weighted mean over the job's steps
        assert metrics["train_loss"] == pytest.approx(expected, rel=1e-5)
        assert 0.0 <= metrics["train_acc"] <= 1.0
    assert [m for m, _ in seen["fast"]] == [m for m, _ in seen["lightning"]]  # the same in both engines


# -- local training equals a plain lightning.Trainer.fit of the client's shard ------------------------------------
class EpochPermutation(torch.utils.data.Sampler):
    """One ``randperm`` of the shard per epoch from the job's seed: the batch order the job's own generator gives."""

    def __init__(self, n, seed):
        self.n, self.generator = n, torch.Generator().manual_seed(seed)

    def __len__(self):
        return self.n

    def __iter__(self):
        return iter(torch.randperm(self.n, generator=self.generator).tolist())


class ReadsTrainerInTraining(Classifier):
    """Scales its loss by what self.trainer says (a module whose training depends on the Trainer's counters)."""

    def training_step(self, batch, batch_idx):
        t = self.trainer
        scale = 1.0 + 0.1 * t.current_epoch + 0.01 * t.global_step
        return scale * super().training_step(batch, batch_idx)


def _plain_lightning_fit(model, update, shards, batch_size):
    """The job as a Lightning user would run it: a fresh lightning.Trainer fitting the client's shard."""
    from lit_asyncfl.core.flat import FlatParameters
    from lit_asyncfl.data.shards import DatasetShards

    job, idx = update.job, shards.indices[update.job.client]
    if isinstance(shards, DatasetShards):
        dataset, collate = torch.utils.data.Subset(shards.dataset, idx), shards.collate_fn
    else:
        dataset, collate = torch.utils.data.TensorDataset(shards.inputs[idx], shards.targets[idx]), None
    loader = DataLoader(dataset, batch_size=batch_size, sampler=EpochPermutation(len(idx), job.seed),
                        drop_last=shards.drop_last, collate_fn=collate)  # fmt: skip
    reference = copy.deepcopy(model)
    FlatParameters(reference).load(update.base_weights)
    trainer = L.Trainer(max_epochs=job.local_epochs, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)  # fmt: skip
    trainer.fit(reference, train_dataloaders=loader)
    return FlatParameters(reference).read()


class FirstUpdates:
    def __init__(self):
        from lit_asyncfl.callbacks import Callback

        outer = self

        class Record(Callback):
            def on_client_update(self, trainer, update, aggregated):
                outer.updates.append(update)

        self.updates, self.callback = [], Record()


@pytest.mark.parametrize("engine", ["fast", "lightning", "cohort"])
@pytest.mark.parametrize(
    ("module", "data"),
    [
        pytest.param(Classifier, None, id="plain"),
        pytest.param(StepDecay, None, id="epoch-scheduler"),
        pytest.param(OneCycle, None, id="step-scheduler-from-self.trainer"),
        pytest.param(ReadsTrainerInTraining, None, id="self.trainer-in-training_step"),
        pytest.param(DictClassifier, dict(as_dict=True, noise=0.0), id="dict-batches"),
        pytest.param(BatchNormNet, dict(drop_last=True, noise=0.0), id="batchnorm-drop_last"),
    ],
)  # fmt: skip
def test_a_client_job_is_a_plain_lightning_fit_of_the_clients_shard(tmp_path, engine, module, data):
    torch.manual_seed(0)
    model, record = module(), FirstUpdates()
    kwargs = dict(engine=engine, callbacks=[record.callback], local_epochs=2, max_versions=3)
    fit = (lambda: _fit(tmp_path, model, **kwargs)) if data is None else (
        lambda: _fit_user(tmp_path, model, UserData(**data), **kwargs))  # fmt: skip
    if engine == "cohort" and module in (StepDecay, OneCycle, BatchNormNet):  # no scheduler, no BatchNorm
        refusal = r"(cohort engine|engine='cohort').*use (a GroupNorm variant .* or )?engine='fast'"
        with pytest.raises(ValueError, match=refusal):
            fit()
        return
    trainer = fit()
    shards = trainer.simulator.executor.trainer.shards
    assert len(record.updates) >= 3
    for update in record.updates[:3]:  # jobs from different start models and clients
        expected = _plain_lightning_fit(model, update, shards, batch_size=trainer.simulator.executor.trainer.batch_size)
        if engine == "cohort":  # batched float32 kernels: equal up to rounding (see CohortTrainer)
            torch.testing.assert_close(update.weights, expected, rtol=0, atol=1e-6)
        else:
            assert torch.equal(update.weights, expected)


class LogsLossAndMax(Classifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        self.log_dict({"worst": loss}, reduce_fx="max")
        return loss


def test_the_cohort_engine_reports_what_training_step_logs_as_the_fast_engine(tmp_path):
    seen = {}
    for engine in ("fast", "cohort"):
        torch.manual_seed(0)
        record = FirstUpdates()
        _fit(tmp_path / engine, LogsLossAndMax(), engine=engine, callbacks=[record.callback])
        seen[engine] = [u.metrics for u in record.updates]
    assert len(seen["fast"]) == len(seen["cohort"]) >= 6
    for fast, cohort in zip(seen["fast"], seen["cohort"]):
        assert fast.keys() == cohort.keys() == {"train_loss", "worst"}
        assert fast["worst"] > fast["train_loss"]  # a max over steps, not the mean
        assert cohort == pytest.approx(fast, rel=1e-5)


class ReadsStepCount(Classifier):
    def training_step(self, batch, batch_idx):
        self.trainer.num_training_batches  # noqa: B018 (differs between the clients of one cohort)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("module", "message"),
    [
        pytest.param(CountsSteps, r"engine='cohort' cannot update a torchmetrics object in training_step.*'fast'",
                     id="metric-object"),
        pytest.param(ReadsStepCount, r"self.trainer.num_training_batches differs .* use engine='fast'",
                     id="per-client-counts"),
    ],
)  # fmt: skip
def test_what_a_batched_cohort_step_cannot_honour_is_refused_at_fit_start(tmp_path, module, message):
    record = FirstUpdates()

    with pytest.raises(ValueError, match=message):  # by the engine's probe of training_step (issue 32)
        _fit(tmp_path, module(), engine="cohort", callbacks=[record.callback])
    assert record.updates == []  # before any update reached the server
