"""Lightning code from the wild runs unchanged (issue 32, item 1): modules, data modules, loggers written with
``import pytorch_lightning as pl`` (skipped where pytorch_lightning, in the ``dev`` extra, is not installed)."""

from __future__ import annotations

import logging

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from conftest import assert_same, global_weights  # noqa: E402
from wild_modules import LClassifier, LData  # noqa: E402
from wild_pl_modules import PLClassifier, PLData  # noqa: E402

from lit_asyncfl.cli import FederatedCLI  # noqa: E402
from loops.test_wild_lightning import _fit  # noqa: E402


@pytest.mark.parametrize("engine", ["fast", "lightning", "cohort"])
def test_old_namespace_trains_as_the_new_one(tmp_path, engine):
    """A pytorch_lightning module and data module give exactly the weights and history of the same code written
    with lightning.pytorch (which the engines' own tests check against lightning.Trainer)."""
    old = _fit(tmp_path / "old", PLClassifier, PLData(), engine)
    new = _fit(tmp_path / "new", LClassifier, LData(), engine)
    assert_same(global_weights(old), global_weights(new))
    assert [{k: v for k, v in r.items() if k != "wall_time"} for r in old.history] == [
        {k: v for k, v in r.items() if k != "wall_time"} for r in new.history
    ]
    assert old.summary["versions"] == 2


def test_old_namespace_lightning_engine_equals_fast(tmp_path):
    """The lightning engine runs a pytorch_lightning module with pytorch_lightning's Trainer: same weights."""
    fast = _fit(tmp_path / "fast", PLClassifier, PLData(), "fast")
    real = _fit(tmp_path / "real", PLClassifier, PLData(), "lightning")
    assert_same(global_weights(fast), global_weights(real))


def test_old_namespace_evaluation_equals_pl_trainer(tmp_path):
    """The global evaluation, validate and test report what pytorch_lightning's own Trainer does on the weights."""
    fed = _fit(tmp_path, PLClassifier, PLData())
    model = fed.global_model
    reference = pl.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    val = reference.validate(model, datamodule=PLData(), verbose=False)[0]
    test = reference.test(model, datamodule=PLData(), verbose=False)[0]
    assert fed.history[-1]["val_acc"] == pytest.approx(val["val_acc"], abs=1e-6)
    assert fed.history[-1]["val_loss"] == pytest.approx(val["val_loss"], abs=1e-6)
    assert fed.validate(verbose=False)[0]["val_acc"] == pytest.approx(val["val_acc"], abs=1e-6)
    assert fed.test(verbose=False)[0]["test_acc"] == pytest.approx(test["test_acc"], abs=1e-6)
    reloaded = PLClassifier.load_from_checkpoint(tmp_path / "FedAvg" / "version_0" / "checkpoints" / "last.ckpt")
    assert_same(reloaded.state_dict(), model.state_dict())


def test_old_namespace_logger(tmp_path):
    """A pytorch_lightning logger is a run logger like lightning.pytorch's."""
    from pytorch_lightning.loggers import CSVLogger

    fed = _fit(tmp_path, PLClassifier, PLData(), logger=CSVLogger(str(tmp_path)))
    assert fed.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().count("val_acc") >= 1


def test_old_namespace_through_the_cli(tmp_path):
    """``--model``/``--data`` accept pytorch_lightning subclasses; fit then test from the run's checkpoint."""
    common = [f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false",
              "--model=wild_pl_modules.PLClassifier", "--data=wild_pl_modules.PLData"]  # fmt: skip
    fit = FederatedCLI(args=["fit", "--trainer.algorithm=fedavg", "--trainer.num_clients=3",
                             "--trainer.max_versions=2", "--trainer.eval_every=1", *common])  # fmt: skip
    assert isinstance(fit.model, pl.LightningModule) and fit.trainer.summary["versions"] == 2
    ckpt = tmp_path / "FedAvg" / "version_0" / "checkpoints" / "last.ckpt"
    test = FederatedCLI(args=["test", "--trainer.max_versions=1", f"--ckpt_path={ckpt}", *common])
    assert_same(test.model.state_dict(), fit.trainer.global_model.state_dict())
    assert torch.load(ckpt, weights_only=False)["hyper_parameters"]["_class_path"] == "wild_pl_modules.PLClassifier"


def test_the_lightning_engine_silences_the_job_trainers_of_either_namespace(tmp_path, caplog):
    """Each job's Trainer says 'GPU available: ...' and '`Trainer.fit` stopped'; neither namespace's reaches the
    user (pytorch_lightning's logger printed them for every client job)."""
    caplog.set_level(logging.INFO)
    _fit(tmp_path, PLClassifier, PLData(), "lightning")
    assert not [r.getMessage() for r in caplog.records if "GPU available" in r.getMessage()]
