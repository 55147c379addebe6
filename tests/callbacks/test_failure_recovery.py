"""A failure outside the client jobs keeps the run (issue 34): a logger or run callback that raises ends the run at
the next event boundary with a ``last.ckpt`` that resumes exactly; every callback's ``on_exception`` runs and the
original error is the one raised; resumes refuse what would silently change the result and accept what does not;
a run directory can move."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import global_weights, make_trainer
from lightning.pytorch.loggers import Logger

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.core.simulator import ClientJobError
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression

VERSIONS = 12


def _fit(tmp_path, ckpt_path=None, model=None, **kwargs):
    kwargs.setdefault("checkpoint_every_seconds", None)  # no periodic checkpoint: only the failure one can exist
    trainer = make_trainer(tmp_path, FedAsync(concurrency=3), max_versions=VERSIONS, eval_every=2, **kwargs)
    torch.manual_seed(0)
    trainer.fit(model or LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=ckpt_path)
    return trainer


def _last(trainer) -> str:
    return os.path.join(trainer.log_dir, "checkpoints", "last.ckpt")


class FlakyLogger(Logger):
    """A remote logger whose network fails at its ``fail_at``-th ``log_metrics`` call."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.calls, self.finalized = fail_at, 0, None

    @property
    def name(self):
        return "flaky"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("network blip")

    def finalize(self, status):
        self.finalized = status


class RaisesAtEvaluation(Callback):
    def __init__(self, version: int) -> None:
        self.version = version

    def on_evaluation_end(self, trainer, metrics):
        if metrics["version"] == self.version:
            raise RuntimeError(f"callback bug at version {self.version}")


class Records(Callback):
    """Another user callback: what it saw of the failure."""

    def __init__(self) -> None:
        self.exceptions = []

    @property
    def state_key(self):
        return "Records"

    def on_exception(self, trainer, exception):
        self.exceptions.append(exception)


class RaisesInOnException(Callback):
    def on_exception(self, trainer, exception):
        raise ValueError("a broken on_exception")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return global_weights(_fit(tmp_path_factory.mktemp("healthy")))


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param(lambda: {"logger": FlakyLogger(fail_at=4)}, id="logger"),
        pytest.param(lambda: {"callbacks": [RaisesAtEvaluation(version=6)]}, id="run-callback"),
    ],
)
def test_a_failure_inside_an_event_leaves_a_last_ckpt_that_resumes_to_the_uninterrupted_weights(
    tmp_path, healthy, failing
):
    settings = failing()
    with pytest.raises((ConnectionError, RuntimeError), match=r"network blip|callback bug at version 6"):
        _fit(tmp_path / "failed", **settings)
    failed_dir = next(p.parent.parent for p in (tmp_path / "failed").rglob("last.ckpt"))  # exists: nothing lost
    summary = json.loads((failed_dir / "summary.json").read_text())
    assert summary["stop_reason"].startswith("error:") and 0 < summary["versions"] < VERSIONS
    if "logger" in settings:
        assert settings["logger"].finalized == "failed"
    resumed = _fit(tmp_path / "resumed", ckpt_path=str(failed_dir / "checkpoints" / "last.ckpt"))
    assert resumed.summary["versions"] == VERSIONS
    assert torch.equal(global_weights(resumed), healthy)


class Flaky(LogisticRegression):
    calls = 0

    def training_step(self, batch, batch_idx):
        Flaky.calls += 1
        if Flaky.calls == 40:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_a_raising_on_exception_leaves_the_other_callbacks_outputs_and_the_original_error(tmp_path):
    Flaky.calls = 0
    records = Records()
    with pytest.raises(ClientJobError, match=r"the job \d+ of client \d+ .*raised RuntimeError: boom") as info:
        _fit(tmp_path, model=Flaky(input_dim=64), callbacks=[RaisesInOnException(), records])
    assert any("a broken on_exception" in note for note in getattr(info.value, "__notes__", []))
    assert records.exceptions == [info.value]  # the callback after the broken one still ran
    run_dir = next(p.parent.parent for p in tmp_path.rglob("last.ckpt"))  # the failure checkpoint was written
    assert json.loads((run_dir / "summary.json").read_text())["stop_reason"] == "error: ClientJobError"


@pytest.mark.parametrize(("logger", "message"), [("csv", r"got 'csv' \(on the command line"), ([3], r"holds 3, which")])
def test_a_logger_that_is_not_one_is_refused_at_construction(logger, message):
    with pytest.raises(ValueError, match=r"logger must be a Lightning Logger .*, a list of them, True .* or False/None"
                                         rf".*{message}"):  # fmt: skip
        make_trainer("unused", FedAsync(concurrency=3), max_versions=2, logger=logger)


def test_lightning_s_logger_forms_are_accepted(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    forms = [(True, 1), (False, 0), (None, 0), (CSVLogger(str(tmp_path)), 1)]
    forms += [([CSVLogger(str(tmp_path)), FlakyLogger(0)], 2), ((lg for lg in [FlakyLogger(0)]), 1)]
    for logger, count in forms:
        assert len(make_trainer(tmp_path, FedAsync(concurrency=3), max_versions=2, logger=logger).loggers) == count


def test_the_original_error_is_raised_where_exceptions_cannot_take_notes(tmp_path):
    """Python 3.10 (which the package supports) has no BaseException.add_note: the run's own error must still be the
    one raised when an on_exception raises (an AttributeError from the handler replaced it)."""

    class NoNotes(RuntimeError):  # an exception as Python 3.10 makes them
        def __getattribute__(self, name):
            if name == "add_note":
                raise AttributeError(name)
            return super().__getattribute__(name)

    class RaisesNoNotes(Callback):
        def on_new_version(self, trainer):
            if trainer.simulator.server.version == 3:
                raise NoNotes("run callback at version 3")

    with pytest.raises(NoNotes, match="run callback at version 3"):
        _fit(tmp_path, callbacks=[RaisesNoNotes(), RaisesInOnException()])
