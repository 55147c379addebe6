"""What a resume refuses (a checkpoint that would silently change the result) and what it accepts (settings that
never change a result), each with a message naming the one thing that differs (issue 34)."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import global_weights, make_trainer

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression


class AnyDtype(LogisticRegression):
    """A logistic regression that reads the float32 digits in its own dtype (``.double()`` works)."""

    def forward(self, x):
        return super().forward(x.to(next(self.parameters()).dtype))


def _model(dtype=torch.float32):
    torch.manual_seed(0)
    return AnyDtype(input_dim=64).to(dtype)


def _first(tmp_path, dtype=torch.float32, **kwargs):
    trainer = make_trainer(tmp_path / "first", FedAsync(concurrency=3), max_versions=4, **kwargs)
    trainer.fit(_model(dtype), datamodule=DigitsDataModule())
    return os.path.join(trainer.log_dir, "checkpoints", "last.ckpt")


def _resume(tmp_path, path, dtype=torch.float32, max_versions=8, **kwargs):
    trainer = make_trainer(tmp_path / "resumed", FedAsync(concurrency=3), max_versions=max_versions, **kwargs)
    trainer.fit(_model(dtype), datamodule=DigitsDataModule(), ckpt_path=str(path))
    return trainer


def _edit(path, change):
    """Change a checkpoint and store a consistent checksum again (what a careless tool or a user would do)."""
    checkpoint = torch.load(path, weights_only=True)
    change(checkpoint)
    ckpt.save(checkpoint, path)


@pytest.mark.parametrize(("written", "resumed"), [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_a_resume_under_another_dtype_is_refused_naming_both(tmp_path, written, resumed):
    path = _first(tmp_path, written)
    a, b = str(written).removeprefix("torch."), str(resumed).removeprefix("torch.")
    with pytest.raises(ValueError, match=rf"different configuration: model.dtype: checkpoint '{a}' vs trainer '{b}'$"):
        _resume(tmp_path, path, resumed)


def test_simulation_weights_cast_to_another_dtype_are_refused(tmp_path):
    path = _first(tmp_path)

    def cast(checkpoint):
        sim = checkpoint["lit_asyncfl"]["simulation"]
        sim["server"]["weights"] = sim["server"]["weights"].half()

    _edit(path, cast)
    with pytest.raises(ValueError, match=r"global weights are torch.float16 \(650,\), but the model's weights are "
                                         r"torch.float32 \(650,\)"):  # fmt: skip
        _resume(tmp_path, path)


def test_non_finite_simulation_weights_are_refused(tmp_path):
    path = _first(tmp_path)

    def poison(checkpoint):
        checkpoint["lit_asyncfl"]["simulation"]["server"]["weights"][3] = float("nan")

    _edit(path, poison)  # the state_dict copy stays finite
    with pytest.raises(ValueError, match=r"the simulation's global weights are not finite"):
        _resume(tmp_path, path)


def test_a_checkpoint_without_its_checksum_is_refused(tmp_path):
    path = _first(tmp_path)
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["lit_asyncfl"]["checksum"]
    torch.save(checkpoint, path)
    with pytest.raises(ValueError, match=r"has no checksum entry \(lit_asyncfl.checksum\)"):
        _resume(tmp_path, path)


def test_a_changed_setting_is_named_in_one_short_line(tmp_path):
    path = _first(tmp_path)
    trainer = make_trainer(tmp_path / "resumed", FedAsync(alpha=0.3, concurrency=3), max_versions=8)
    with pytest.raises(ValueError) as info:
        trainer.fit(_model(), datamodule=DigitsDataModule(), ckpt_path=path)
    message = str(info.value)
    assert message.endswith("different configuration: algorithm.hparams.alpha: checkpoint 0.6 vs trainer 0.3; "
                            "algorithm.aggregator.alpha: checkpoint 0.6 vs trainer 0.3"), message  # fmt: skip
    assert len(message) < 300


def test_on_client_error_raise_resumes_as_drop_but_a_run_that_dropped_jobs_does_not_resume_as_raise(tmp_path):
    full = make_trainer(tmp_path / "full", FedAsync(concurrency=3), max_versions=8, on_client_error="drop")
    full.fit(_model(), datamodule=DigitsDataModule())
    path = _first(tmp_path)  # on_client_error="raise", as a ClientJobError's message suggests resuming it
    resumed = _resume(tmp_path, path, on_client_error="drop")
    assert torch.equal(global_weights(resumed), global_weights(full))

    def dropped(checkpoint):
        checkpoint["lit_asyncfl"]["simulation"]["dropped"] = {"client_error": 2}

    _edit(path, dropped)
    with pytest.raises(ValueError, match=r"on_client_error='drop' after 2 failing job\(s\) were dropped"):
        _resume(tmp_path / "again", path, on_client_error="raise")


class Momentum(LogisticRegression):
    """Its optimizer's settings live in code, not in hparams (class attributes a user edits between runs)."""

    lr, momentum = 0.1, 0.0

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=Momentum.lr, momentum=Momentum.momentum)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"lr": 0.2}, r"optimizer.groups\[0\].lr: checkpoint 0.1 vs trainer 0.2$", id="lr"),
        pytest.param(
            {"momentum": 0.9}, r"optimizer.groups\[0\].momentum: checkpoint 0.0 vs trainer 0.9$", id="momentum"
        ),
        pytest.param({"num_threads": 2}, r"num_threads: checkpoint 1 vs trainer 2", id="num_threads"),
    ],
)
def test_a_resume_refuses_what_would_change_the_results(tmp_path, change, message):
    first = make_trainer(tmp_path / "first", FedAsync(concurrency=3), max_versions=4)
    first.fit(Momentum(input_dim=64), datamodule=DigitsDataModule())
    last = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    threads = change.pop("num_threads", None)
    for name, value in change.items():
        setattr(Momentum, name, value)
    try:
        resumed = make_trainer(tmp_path / "resumed", FedAsync(concurrency=3), max_versions=8, num_threads=threads)
        with pytest.raises(ValueError, match=r"written by a different configuration: .*" + message):
            resumed.fit(Momentum(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=last)
    finally:
        Momentum.lr, Momentum.momentum = 0.1, 0.0


def test_a_refused_resume_leaves_the_checkpoint_and_outputs_it_resumed_from_untouched(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    first = make_trainer(tmp_path, FedAsync(concurrency=3), max_versions=4, logger=CSVLogger(str(tmp_path), version=3))
    first.fit(Momentum(input_dim=64), datamodule=DigitsDataModule())
    last = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    before = open(last, "rb").read(), open(os.path.join(first.log_dir, "summary.json")).read()
    again = make_trainer(tmp_path, FedAsync(concurrency=4), max_versions=8, logger=CSVLogger(str(tmp_path), version=3))
    with pytest.raises(ValueError, match="written by a different configuration"):
        again.fit(Momentum(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=last)  # into the same dir
    assert (open(last, "rb").read(), open(os.path.join(first.log_dir, "summary.json")).read()) == before
