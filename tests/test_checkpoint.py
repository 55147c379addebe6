"""Checkpoints are Lightning checkpoints of the global model; validate/test evaluate trained models; the monitor."""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import global_weights, make_trainer, run

from lit_asyncfl import FederatedTrainer
from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.algorithms import FedAsync, FedAvg
from lit_asyncfl.callbacks import Callback, ModelCheckpoint
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5, LogisticRegression


def _plain_lightning_trainer() -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_checkpointing=False,
        enable_model_summary=False,
    )  # fmt: skip


def test_last_ckpt_loads_into_the_module_with_exactly_the_final_global_weights(tmp_path):
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=8, model=LeNet5(lr=0.07, momentum=0.5))
    path = next(tmp_path.rglob("last.ckpt"))
    loaded = LeNet5.load_from_checkpoint(path)
    assert loaded.hparams.lr == 0.07 and loaded.hparams.momentum == 0.5  # from save_hyperparameters
    assert torch.equal(FlatParameters(loaded).read(), global_weights(trainer))
    raw = torch.load(path, weights_only=True)  # loadable safely, with Lightning's keys
    assert raw["pytorch-lightning_version"] == L.__version__ and raw["global_step"] == 8
    assert raw["lit_asyncfl"]["version"] == 8 and "simulation" in raw["lit_asyncfl"]


def test_lightning_trainer_test_on_the_checkpoint_equals_federated_test(tmp_path):
    trainer = run(tmp_path, FedAvg(clients_per_round=4), max_versions=4, model=LogisticRegression(input_dim=64))
    path = str(next(tmp_path.rglob("last.ckpt")))
    fresh = FederatedTrainer(max_versions=1, logger=False)
    ours = fresh.test(LogisticRegression(input_dim=64), DigitsDataModule(), ckpt_path=path, verbose=False)
    dm = DigitsDataModule()
    dm.setup("test")
    theirs = _plain_lightning_trainer().test(
        LogisticRegression(input_dim=64), dataloaders=dm.test_dataloader(), ckpt_path=path, verbose=False
    )
    assert ours[0]["test_acc"] == pytest.approx(theirs[0]["test_acc"], abs=1e-7)
    assert ours[0]["test_loss"] == pytest.approx(theirs[0]["test_loss"], rel=1e-6)
    after_fit = trainer.test(verbose=False)  # the global model the run ended with
    assert after_fit[0]["test_acc"] == pytest.approx(ours[0]["test_acc"], abs=1e-7)
    assert ours[0]["test_acc"] > 0.5  # trained, not the initial model


def test_test_without_checkpoint_or_fit_warns_that_it_evaluates_the_initial_model(capsys):
    trainer = FederatedTrainer(max_versions=1, logger=False)
    with pytest.warns(UserWarning, match=r"test\(\) without ckpt_path and without a preceding fit\(\).*INITIAL"):
        result = trainer.test(LeNet5(), DigitsDataModule())
    assert set(result[0]) == {"test_acc", "test_loss"}
    out = capsys.readouterr().out
    assert "Test metric" in out and "test_acc" in out  # Lightning's results table


def test_best_and_last_checkpoint_names(tmp_path):
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max")
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=10, eval_every=2, callbacks=[checkpoint])
    best_acc = max(r["val_acc"] for r in trainer.history)
    assert trainer.validate(ckpt_path="best", verbose=False)[0]["val_acc"] == pytest.approx(best_acc, abs=1e-7)
    final = trainer.validate(ckpt_path="last", verbose=False)[0]["val_acc"]
    assert final == pytest.approx(trainer.history[-1]["val_acc"], abs=1e-7)
    with pytest.raises(ValueError, match=r'ckpt_path="best" needs a ModelCheckpoint\(monitor=...\)'):
        run(tmp_path / "b", FedAsync(concurrency=3), max_versions=2).test(ckpt_path="best")


def test_a_checkpoint_of_an_earlier_format_is_refused_with_a_message(tmp_path):
    old = tmp_path / "old.ckpt"
    torch.save({"format": "lit_asyncfl.checkpoint.v1", "simulation": {}, "history": []}, old)
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=2)
    with pytest.raises(ValueError, match=r"written by an earlier lit_asyncfl \(lit_asyncfl.checkpoint.v1\)"):
        trainer.fit(LeNet5(), DigitsDataModule(), ckpt_path=str(old))


def test_a_resumable_checkpoint_of_format_v2_is_refused_but_its_model_still_loads(tmp_path):
    # v2's server states held BatchNorm statistics and its client-state manifest absolute paths: not resumable
    run(tmp_path / "a", FedAsync(concurrency=2), max_versions=3)
    path = tmp_path / "v2.ckpt"
    checkpoint = torch.load(next((tmp_path / "a").rglob("last.ckpt")), weights_only=True)
    checkpoint[ckpt.RUN_KEY]["format"] = "lit_asyncfl.checkpoint.v2"
    checkpoint[ckpt.RUN_KEY]["checksum"] = ckpt.content_digest(checkpoint)
    torch.save(checkpoint, path)
    again = make_trainer(tmp_path / "b", FedAsync(concurrency=2), max_versions=6)
    with pytest.raises(ValueError, match=r"earlier lit_asyncfl \(lit_asyncfl.checkpoint.v2\).*its global model loads"):
        again.fit(LeNet5(lr=0.05), DigitsDataModule(), ckpt_path=str(path))
    model = LeNet5.load_from_checkpoint(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), checkpoint["state_dict"].values()))


def test_model_only_checkpoints_initialise_a_model_but_do_not_resume(tmp_path):
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max")
    run(tmp_path / "a", FedAsync(concurrency=2), max_versions=4, eval_every=2, callbacks=[checkpoint])
    again = make_trainer(tmp_path / "b", FedAsync(concurrency=2), max_versions=6)
    with pytest.raises(ValueError, match=r"holds the global model of version \d+ but no simulation state"):
        again.fit(LeNet5(lr=0.05), DigitsDataModule(), ckpt_path=checkpoint.best_model_path)

    plain = tmp_path / "plain.ckpt"
    lightning_trainer = _plain_lightning_trainer()
    lightning_trainer.strategy.connect(LeNet5())
    lightning_trainer.save_checkpoint(plain)  # a checkpoint written by lightning.Trainer
    with pytest.raises(ValueError, match=r"a Lightning checkpoint without a lit_asyncfl run in it"):
        again.fit(LeNet5(lr=0.05), DigitsDataModule(), ckpt_path=str(plain))
    assert set(again.validate(LeNet5(), DigitsDataModule(), ckpt_path=str(plain), verbose=False)[0]) == {
        "val_acc",
        "val_loss",
    }


def test_a_resumable_checkpoint_is_refused_mid_event(tmp_path):
    class SavesMidEvent(Callback):
        def on_evaluation_end(self, trainer, metrics):
            trainer.save_checkpoint(tmp_path / "mid.ckpt")

    with pytest.raises(RuntimeError, match=r"only be written between events .* weights_only=True"):
        run(tmp_path, FedAsync(concurrency=2), max_versions=2, eval_every=1, callbacks=[SavesMidEvent()])


def test_a_named_monitor_decides_best_and_time_to_target(tmp_path):
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=10, eval_every=2, monitor="val_loss", mode="min",
                  target_accuracy=1.5, model=LogisticRegression(input_dim=64))  # fmt: skip
    losses = [r["val_loss"] for r in trainer.history]
    assert [r["accuracy"] for r in trainer.history] == losses  # the monitored metric fills the accuracy column
    assert trainer.summary["monitor"] == "val_loss" and trainer.summary["best_accuracy"] == min(losses)
    assert losses[0] > 1.5 > losses[-1]
    reached = next(r for r in trainer.history if r["val_loss"] <= 1.5)
    assert trainer.summary["time_to_target"] == reached["virtual_time"]


def test_a_named_monitor_that_is_not_logged_is_refused_at_the_first_evaluation(tmp_path):
    with pytest.raises(ValueError, match=r"monitor='val_f1' is not among .* \['val_acc', 'val_loss'\]"):
        run(tmp_path, FedAsync(concurrency=2), max_versions=2, monitor="val_f1")


def test_the_default_monitor_is_announced_once(tmp_path, caplog):
    with caplog.at_level("INFO", logger="lit_asyncfl"):
        run(tmp_path, FedAsync(concurrency=2), max_versions=4, eval_every=1)
    announcements = [r.message for r in caplog.records if "monitoring" in r.message]
    assert len(announcements) == 1 and "'val_acc'" in announcements[0]


def test_mode_min_is_refused_for_an_algorithm_that_reads_accuracy():
    from lit_asyncfl.algorithms import ASFL

    with pytest.raises(ValueError, match=r"reads the monitored metric as an accuracy"):
        FederatedTrainer(ASFL(), max_versions=1, monitor="val_loss", mode="min")


def test_python_api_logs_the_model_hyperparameters(tmp_path):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=2, logger=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(LeNet5(lr=0.03, momentum=0.9), DigitsDataModule(batch_size=16))
    hparams = yaml.safe_load(Path(trainer.log_dir, "hparams.yaml").read_text())
    assert hparams["model"]["lr"] == 0.03 and hparams["model"]["momentum"] == 0.9
    assert hparams["model"]["class"] == "lit_asyncfl.models.lenet.LeNet5"
    assert hparams["data"]["batch_size"] == 16
    assert hparams["algorithm"]["concurrency"] == 2 and hparams["trainer"]["max_versions"] == 2


def test_mode_min_without_a_named_monitor_is_refused():
    with pytest.raises(ValueError, match=r"mode='min' needs a named monitor"):
        FederatedTrainer(max_versions=1, mode="min")


def test_hparams_a_checkpoint_cannot_load_back_are_refused_at_fit_start(tmp_path):
    class WithPath(LogisticRegression):
        def __init__(self, root=Path("data"), **kwargs):
            super().__init__(**kwargs)

    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=2)
    with pytest.raises(ValueError, match=r"WithPath.hparams hold values .* root=PosixPath\('data'\)"):
        trainer.fit(WithPath(input_dim=64), DigitsDataModule())


class StatefulData(L.LightningDataModule):
    """A plain Lightning data module with hyper-parameters and a state, as Lightning's documentation writes one."""

    def __init__(self, batch_size: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.loaded = None

    def setup(self, stage):
        dm = DigitsDataModule(batch_size=self.hparams.batch_size)
        dm.setup(stage)
        self.inner = dm

    def train_dataloader(self):
        return self.inner.train_dataloader()

    def val_dataloader(self):
        return self.inner.val_dataloader()

    def state_dict(self):
        return {"cursor": 7}

    def load_state_dict(self, state_dict):
        self.loaded = state_dict


class LoadsCheckpoints(LogisticRegression):
    def on_save_checkpoint(self, checkpoint):
        checkpoint["mine"] = 42

    def on_load_checkpoint(self, checkpoint):
        self.seen = checkpoint["mine"]


def test_a_plain_data_module_and_the_modules_hooks_are_saved_and_restored_as_lightning_does(tmp_path):
    run(tmp_path / "a", FedAsync(concurrency=2), max_versions=3, model=LoadsCheckpoints(input_dim=64),
        data=StatefulData())  # fmt: skip
    path = next((tmp_path / "a").rglob("last.ckpt"))
    raw = torch.load(path, weights_only=True)
    assert raw["datamodule_hyper_parameters"] == {"batch_size": 16} and raw["StatefulData"] == {"cursor": 7}
    assert raw["mine"] == 42
    model, data = LoadsCheckpoints(input_dim=64), StatefulData()
    resumed = make_trainer(tmp_path / "b", FedAsync(concurrency=2), max_versions=5)
    resumed.fit(model, data, ckpt_path=str(path))
    assert model.seen == 42 and data.loaded == {"cursor": 7}
