"""Weights & Biases: an offline run writes its files with the config, the custom x-axes, the summary and plots."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import make_trainer

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression


def read_wandb_records(path: Path) -> list:
    """Decode a ``.wandb`` transaction log (LevelDB log format: 32 KiB blocks of CRC/length/type-framed chunks)."""
    from wandb.proto import wandb_internal_pb2 as pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B transaction log"
    block, pos, buffer, out = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + 7 + length > len(raw):  # the writer is part-way through this chunk
            break
        data, pos = raw[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):  # full, first
            buffer = data
        else:  # middle, last
            buffer += data
        if kind in (1, 4):
            record = pb2.Record()
            record.ParseFromString(buffer)
            out.append(record)
    return out


def finished_records(run_dir: Path, timeout: float = 60.0) -> list:
    """The run's records once its exit record is on disk (the W&B service writes the file asynchronously)."""
    import time

    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            records = read_wandb_records(next(run_dir.glob("run-*.wandb")))
        except DecodeError:  # read while a record was being written: read again
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def _fresh_wandb():
    """W&B keeps process-wide settings (e.g. a disabled mode from an earlier test): start and end clean."""
    import wandb

    wandb.teardown()
    yield
    wandb.teardown()


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


def test_offline_wandb_run_records_config_axes_summary_and_plots(tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), project="lit-asyncfl-test", offline=True)
    trainer = make_trainer(
        tmp_path, FedAsync(concurrency=2), num_clients=6, max_versions=4, eval_every=2, logger=logger
    )
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()

    records = finished_records(run_dir)
    metrics = {r.metric.name: r.metric.step_metric for r in records if r.WhichOneof("record_type") == "metric"}
    assert "virtual_time" in metrics and "version" in metrics
    assert metrics["accuracy"] == "virtual_time" and metrics["val_acc"] == "virtual_time"

    history = [
        {_key(i): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    evals = [h for h in history if "accuracy" in h]
    assert [h["version"] for h in evals] == [r["version"] for r in trainer.history]
    assert [h["virtual_time"] for h in evals] == pytest.approx([r["virtual_time"] for r in trainer.history])
    assert [h["accuracy"] for h in evals] == pytest.approx([r["accuracy"] for r in trainer.history])
    plot_keys = {k.rsplit("/", 1)[0] for h in history for k in h if k.startswith("plots/")}
    assert plot_keys == {"plots/accuracy", "plots/partition"}
    assert len(list(run_dir.glob("files/media/images/plots/*.png"))) == 2

    config = {}
    for r in records:
        kind = r.WhichOneof("record_type")
        items = r.run.config.update if kind == "run" else r.config.update if kind == "config" else []
        config.update({_key(i): json.loads(i.value_json) for i in items})
    assert config["trainer"]["num_clients"] == 6 and config["trainer"]["seed"] == trainer.seed
    model = trainer.global_model
    expected = {"class": f"{type(model).__module__}.{type(model).__qualname__}", **model.hparams}
    assert config["model"] == json.loads(json.dumps(expected))  # the model's own hparams (JSON: tuples as lists)
    assert config["algorithm"]["alpha"] == trainer.algorithm.hparams["alpha"]

    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    assert summary["final_accuracy"] == pytest.approx(trainer.summary["final_accuracy"])
    assert summary["versions"] == 4 and summary["algorithm"] == "FedAsync"


def test_a_prefixed_wandb_logger_gets_its_x_axes_under_the_prefix(tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = WandbLogger(save_dir=str(tmp_path), project="lit-asyncfl-test", offline=True, prefix="fl")
    trainer = make_trainer(
        tmp_path, FedAsync(concurrency=2), num_clients=4, max_versions=2, eval_every=1, logger=logger
    )
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    run_dir = Path(logger.experiment.dir).parent
    wandb.finish()
    records = finished_records(run_dir)
    metrics = {r.metric.name: r.metric.step_metric for r in records if r.WhichOneof("record_type") == "metric"}
    assert metrics["fl-accuracy"] == "fl-virtual_time" and "fl-version" in metrics
