"""Run outputs: loggers, history, summary; corrupt client updates end to end."""

from __future__ import annotations

import csv
import math

import torch
import torch.nn.functional as F
from conftest import global_weights, make_trainer

from lit_asyncfl.algorithms import FedAsync, FedAvg
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5, LogisticRegression


class PoisonedModel(LogisticRegression):
    """Diverges (NaN loss) on any batch that contains the digit 7: those clients upload non-finite weights."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        return loss * float("nan") if bool((y == 7).any()) else loss


def test_non_finite_client_updates_are_rejected_end_to_end(tmp_path):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=4), num_clients=20, max_versions=30)
    trainer.fit(PoisonedModel(input_dim=64), datamodule=DigitsDataModule(partition="shards"))
    s = trainer.summary
    assert s["updates_rejected"] > 0 and s["reject_reasons"] == {"non_finite": s["updates_rejected"]}
    assert s["updates_received"] == s["updates_aggregated"] + s["updates_rejected"]
    assert bool(torch.isfinite(global_weights(trainer)).all())
    assert all(math.isfinite(r["loss"]) for r in trainer.history)


def test_history_csv_and_summary_match_the_run(tmp_path):
    trainer = make_trainer(tmp_path, FedAvg(clients_per_round=3), max_versions=6, eval_every=2, logger=True)
    trainer.fit(LeNet5(), datamodule=DigitsDataModule())
    rows = list(csv.DictReader(open(f"{trainer.log_dir}/history.csv")))
    assert [int(r["version"]) for r in rows] == [0, 2, 4, 6]
    assert [float(r["accuracy"]) for r in rows] == [h["accuracy"] for h in trainer.history]
    metrics = list(csv.DictReader(open(f"{trainer.log_dir}/metrics.csv")))  # the CSVLogger's own file
    assert [float(m["virtual_time"]) for m in metrics if m.get("virtual_time")][:4] == [
        h["virtual_time"] for h in trainer.history
    ]
    assert trainer.summary["best_accuracy"] == max(h["accuracy"] for h in trainer.history)
    assert trainer.summary["final_accuracy"] == trainer.history[-1]["accuracy"]
    assert trainer.summary["updates_aggregated"] == 18 and trainer.summary["mean_staleness"] == 0.0


def test_tensorboard_logger_writes_events(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=str(tmp_path), name="tb")
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=4, eval_every=2, logger=logger)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert (tmp_path / "tb" / "version_0" / "history.csv").is_file()  # outputs follow the logger's log_dir


def test_wandb_logger_in_disabled_mode_runs(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "disabled")
    logger = WandbLogger(save_dir=str(tmp_path), project="lit-asyncfl-test")
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=2, logger=logger)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert trainer.summary["versions"] == 2
    logger.experiment.finish()
