"""Modules that are not classifiers (issue 32, item 2): an autoencoder without labels, a GAN whose ``forward`` takes
noise. Without ``validation_step`` the global model is not evaluated (as ``lightning.Trainer.fit`` skips its
validation loop), the run says so once, and the outputs say "not evaluated"; only the module's own hooks touch its
data; any metric ``validation_step`` logs can be the monitor; what needs an evaluation is refused at fit start."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import make_trainer
from torch import nn
from wild_modules import LData, TinyGAN

from lit_asyncfl.callbacks import EarlyStopping, ModelCheckpoint
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.reporting import format_summary


class Autoencoder(L.LightningModule):
    """Lightning's autoencoder example, small: no labels used, no validation_step; ``forward`` encodes (its output
    has 4 columns, as many as the data's classes: scored as logits it would give an "accuracy")."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder, self.decoder = nn.Linear(16, 4), nn.Linear(4, 16)

    def forward(self, x):
        return self.encoder(x)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        loss = F.mse_loss(self.decoder(self.encoder(x)), x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class ValidatedAutoencoder(Autoencoder):
    def validation_step(self, batch, batch_idx):
        x, _ = batch
        self.log("val_loss", F.mse_loss(self.decoder(self.encoder(x)), x))


class NoiseGAN(TinyGAN):
    """Lightning's GAN example without validation_step: ``forward`` takes noise (latent_dim 4), not a batch (16)."""

    validation_step = L.LightningModule.validation_step  # not overridden


def _fit(tmp_path, module, engine="fast", algorithm="fedavg", **kwargs):
    trainer = make_trainer(tmp_path, algorithm, num_clients=3, max_versions=2, eval_every=1, engine=engine, **kwargs)
    torch.manual_seed(1)
    trainer.fit(module(), datamodule=LData())
    return trainer


@pytest.mark.parametrize(("module", "engine"), [(Autoencoder, "fast"), (Autoencoder, "lightning"),
                                                (NoiseGAN, "lightning")])  # fmt: skip
def test_a_module_without_validation_step_trains_unevaluated_and_says_so_once(tmp_path, module, engine):
    """Before: the autoencoder's codes were scored as logits (a "val_acc" of 0.19), the GAN failed with a shape
    error from its generator called on a data batch."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = _fit(tmp_path, module, engine)
    said = [str(w.message) for w in caught if "validation_step" in str(w.message)]
    assert len(said) == 1 and "the global model is not evaluated" in said[0] and "time_to_target" in said[0]
    assert trainer.summary["versions"] == 2 and trainer.summary["updates_aggregated"] >= 2
    assert trainer.history == []
    summary = trainer.summary
    assert summary["evaluated"] is False and summary["monitor"] is None
    assert summary["final_accuracy"] is None and summary["best_accuracy"] is None and summary["time_to_target"] is None
    table = format_summary(summary)
    for key in ("monitor", "final_accuracy", "best_accuracy", "time_to_target"):
        assert [line.split()[1:] for line in table.splitlines() if line.split()[:1] == [key]] == [["not", "evaluated"]]
    out = Path(trainer.log_dir)
    assert json.loads((out / "summary.json").read_text())["evaluated"] is False
    with open(out / "history.csv") as fh:
        assert list(csv.reader(fh))[1:] == []  # a header, no rows (no NaN "accuracy")
    assert not (out / "accuracy.png").exists()
    assert (out / "checkpoints" / "last.ckpt").exists()


def test_what_training_step_logs_still_reaches_run_callbacks(tmp_path):
    from lit_asyncfl.callbacks import Callback

    seen = []

    class Record(Callback):
        def on_client_update(self, trainer, update, aggregated):
            seen.append(update.metrics)

    _fit(tmp_path, Autoencoder, callbacks=[Record()])
    assert seen and all(set(m) == {"train_loss"} and m["train_loss"] > 0 for m in seen)


def test_validate_and_test_refuse_a_module_without_the_step_as_lightning_does(tmp_path):
    trainer = _fit(tmp_path, Autoencoder)
    for stage, step in (("validate", "validation_step"), ("test", "test_step")):
        with pytest.raises(Exception, match=rf"No `{step}\(\)` method defined to run `Trainer.{stage}`"):
            getattr(trainer, stage)(verbose=False)
        with pytest.raises(Exception, match=rf"No `{step}\(\)` method defined to run `Trainer.{stage}`"):
            getattr(L.Trainer(logger=False, enable_progress_bar=False), stage)(Autoencoder(), LData(), verbose=False)


def test_a_loss_logged_in_validation_is_a_monitor_with_mode_min(tmp_path):
    trainer = _fit(tmp_path, ValidatedAutoencoder, monitor="val_loss", mode="min", target_accuracy=1.25)
    losses = [row["val_loss"] for row in trainer.history]
    assert [row["accuracy"] for row in trainer.history] == losses
    assert trainer.summary["monitor"] == "val_loss" and trainer.summary["best_accuracy"] == min(losses)
    first = next(row for row in trainer.history if row["val_loss"] <= 1.25)
    assert trainer.summary["time_to_target"] == first["virtual_time"]
    assert "evaluated" not in trainer.summary


def test_a_training_metric_as_monitor_is_refused_naming_what_can_be(tmp_path):
    """Without validation_step: at fit start, before any job. With one: at the evaluation of version 0, naming the
    validation metrics and where training_step's metrics go."""
    trainer = make_trainer(tmp_path / "a", "fedavg", num_clients=3, max_versions=2, monitor="train_loss", mode="min")
    refusal = r"monitor='train_loss' needs an evaluation of the global model, but Autoencoder has no validation_step"
    with pytest.raises(ValueError, match=refusal):
        trainer.fit(Autoencoder(), datamodule=LData())
    assert not trainer.run_started and trainer.simulator.server.stats.received == 0  # refused at fit start
    trainer = make_trainer(tmp_path / "b", "fedavg", num_clients=3, max_versions=2, monitor="train_loss", mode="min")
    refusal = r"not among the metrics the module logs in validation: \['val_loss'\].*each client update's, in update"
    with pytest.raises(ValueError, match=refusal):
        trainer.fit(ValidatedAutoencoder(), datamodule=LData())
    assert trainer.summary.get("updates_received", 0) == 0


@pytest.mark.parametrize("algorithm", ["asfl", "safa", "fedcs", "oort"])
def test_a_scheduler_that_reads_the_accuracy_is_refused_without_validation_step(tmp_path, algorithm):
    trainer = make_trainer(tmp_path, algorithm, num_clients=10, max_versions=2)
    with pytest.raises(ValueError, match=r"reads the global model's accuracy, but Autoencoder has no validation_step"):
        trainer.fit(Autoencoder(), datamodule=LData())
    assert not trainer.run_started and trainer.simulator.server.stats.received == 0  # refused at fit start


@pytest.mark.parametrize("callback", [EarlyStopping(monitor="train_loss"), ModelCheckpoint(monitor="train_loss")])
def test_run_callbacks_that_monitor_are_refused_without_validation_step(tmp_path, callback):
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, callbacks=[callback])
    with pytest.raises(ValueError, match=rf"{type(callback).__name__}\(monitor='train_loss'\) needs an evaluation"):
        trainer.fit(Autoencoder(), datamodule=LData())


def test_an_autoencoder_without_validation_step_through_the_cli(tmp_path):
    args = ["fit", "--model=loops.test_wild_nonclassifier.Autoencoder", "--data=wild_modules.LData",
            "--trainer.algorithm=fedavg", "--trainer.num_clients=3", "--trainer.max_versions=2",
            f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
            "--trainer.print_summary=false"]  # fmt: skip
    with pytest.warns(UserWarning, match="Autoencoder has no validation_step: the global model is not evaluated"):
        cli = FederatedCLI(args=args)
    assert cli.trainer.summary["versions"] == 2 and cli.trainer.summary["evaluated"] is False


def test_what_needs_an_evaluation_is_refused_when_the_data_has_no_validation_loader(tmp_path):
    """fit(model, train_loader) evaluates nothing (as Trainer.fit without val loaders): a named monitor used to be
    silently ignored."""
    dm = LData()
    dm.setup("fit")
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, monitor="val_acc")
    with pytest.warns(UserWarning, match="no val_dataloader or test_dataloader"):
        with pytest.raises(ValueError, match=r"monitor='val_acc' needs an evaluation .* the data has no validation "
                                             r"loader; pass val_dataloaders"):  # fmt: skip
            trainer.fit(ValidatedAutoencoder(), dm.train_dataloader())
