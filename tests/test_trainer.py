"""Robustness: stalls end, hidden state does not leak between jobs, resumes are exact in every respect."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from builders import BatchNormNet, ReversedExecutor
from conftest import global_weights, make_trainer, run
from torch.utils.data import DataLoader

import lit_asyncfl.trainer as trainer_module
from lit_asyncfl.algorithms import FedAsync, FedAvg, FedBuff
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.models import LeNet5, LogisticRegression
from lit_asyncfl.server.base import ServerCallback


class RejectAll(ServerCallback):
    def reject_update(self, server, update):
        return "always"


def test_a_run_whose_updates_are_all_rejected_stops_with_a_warning(tmp_path):
    algo = FedAvg(clients_per_round=3)
    algo.server_callbacks.insert(0, RejectAll())
    trainer = make_trainer(tmp_path, algo, num_clients=5, max_versions=2)
    with pytest.warns(RuntimeWarning, match=r"updates produced no new global version .*'always'"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    s = trainer.summary
    assert s["stop_reason"] == "stalled" and s["versions"] == 0
    assert s["updates_rejected"] == s["updates_received"] == 100  # max(100, 10 x num_clients)


def test_hidden_state_does_not_leak_between_jobs(tmp_path, monkeypatch):
    kwargs = {"max_versions": 12, "device_model": UniformResponse(low=0.0, high=50.0)}
    torch.manual_seed(0)
    reference = make_trainer(tmp_path / "a", FedAsync(concurrency=4), **kwargs)
    reference.fit(BatchNormNet(), datamodule=DigitsDataModule())
    monkeypatch.setattr(trainer_module, "SequentialExecutor", ReversedExecutor)
    reordered = make_trainer(tmp_path / "b", FedAsync(concurrency=4), **kwargs)
    reordered.fit(BatchNormNet(), datamodule=DigitsDataModule())
    assert torch.equal(global_weights(reference), global_weights(reordered))
    bn = reference.global_model.net[2]
    # reset per job (never leaked); the global count adds each version's job's batches (as one Trainer counts them)
    assert int(bn.num_batches_tracked) == int(reordered.global_model.net[2].num_batches_tracked) > 12


def _history(trainer):
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in trainer.history]


def test_two_chained_resumes_give_the_uninterrupted_weights_and_history(tmp_path):
    algo = lambda: FedBuff(buffer_size=2, concurrency=4)  # noqa: E731
    data = {"partition": "dirichlet"}
    full = run(tmp_path / "full", algo(), max_versions=15, eval_every=4, data_kwargs=data)
    stops = [0.3 * full.simulator.now + 0.1, 0.7 * full.simulator.now + 0.2]
    first = run(tmp_path / "s1", algo(), max_virtual_time=stops[0], eval_every=4, data_kwargs=data)
    ckpt = next((tmp_path / "s1").rglob("last.ckpt"))
    second = make_trainer(tmp_path / "s2", algo(), max_virtual_time=stops[1], eval_every=4)
    second.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))
    ckpt = next((tmp_path / "s2").rglob("last.ckpt"))
    third = make_trainer(tmp_path / "s3", algo(), max_versions=15, eval_every=4)
    third.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))
    assert 0 < first.simulator.server.version < second.simulator.server.version < 15
    assert torch.equal(global_weights(third), global_weights(full))
    assert _history(third) == _history(full)
    assert third.summary["time_to_target"] == full.summary["time_to_target"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"algorithm": FedAsync(alpha=0.3, concurrency=2)}, "algorithm", id="alpha"),
        pytest.param({"data": {"partition": "dirichlet", "alpha": 0.9}}, "data", id="partition"),
        pytest.param({"data": {"batch_size": 32}}, "data", id="batch-size"),
        pytest.param({"device_model": UniformResponse(0.0, 10.0)}, "device_model", id="devices"),
    ],
)
def test_resume_refuses_any_changed_setting(tmp_path, change, message):
    run(tmp_path / "a", FedAsync(concurrency=2), max_versions=3, data_kwargs={"partition": "dirichlet"})
    ckpt = next((tmp_path / "a").rglob("last.ckpt"))
    algorithm = change.get("algorithm", FedAsync(concurrency=2))
    extra = {"device_model": change["device_model"]} if "device_model" in change else {}
    trainer = make_trainer(tmp_path / "b", algorithm, max_versions=5, **extra)
    data = change.get("data", {"partition": "dirichlet"})
    with pytest.raises(ValueError, match=f"different configuration: {message}"):
        trainer.fit(LeNet5(), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))


def test_resume_may_change_budgets_and_logging(tmp_path):
    run(tmp_path / "a", FedAsync(concurrency=2), max_versions=3)
    ckpt = next((tmp_path / "a").rglob("last.ckpt"))
    trainer = make_trainer(
        tmp_path / "b", FedAsync(concurrency=2), max_virtual_time=1e9, max_versions=6, eval_every=3, logger=True
    )
    trainer.fit(LeNet5(), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert trainer.summary["versions"] == 6


class TrainOnly(L.LightningDataModule):
    def train_dataloader(self):
        dm = DigitsDataModule()
        dm.setup("fit")
        return DataLoader(dm.train_set, batch_size=10)


def test_a_datamodule_without_evaluation_data_trains_with_a_warning(tmp_path):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=3)
    with pytest.warns(UserWarning, match="no val_dataloader or test_dataloader"):
        trainer.fit(LeNet5(), datamodule=TrainOnly())
    assert trainer.history == [] and trainer.summary["final_accuracy"] is None
    assert trainer.summary["versions"] == 3


def test_outputs_without_a_local_logger_go_to_a_fresh_version_dir(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "disabled")
    dirs = []
    for _ in range(2):
        trainer = make_trainer(
            tmp_path, FedAsync(concurrency=2), max_versions=2, logger=WandbLogger(save_dir=str(tmp_path / "wandb"))
        )
        trainer.fit(LeNet5(), datamodule=DigitsDataModule())
        dirs.append(trainer.log_dir)
        trainer.logger.experiment.finish()
    assert dirs == [str(tmp_path / "FedAsync" / "version_0"), str(tmp_path / "FedAsync" / "version_1")]
    assert all((tmp_path / "FedAsync" / f"version_{i}" / "summary.json").is_file() for i in range(2))


def test_no_warnings_in_a_plain_run(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(tmp_path, FedAsync(concurrency=2), max_versions=2)
