"""Lightning code from the wild runs unchanged (issue 32): the old ``pytorch_lightning`` namespace, ..."""

from __future__ import annotations

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")

from conftest import assert_same, global_weights, make_trainer  # noqa: E402
from wild_modules import STRUCTURES, LClassifier, LData, PLClassifier, PLData, StructClassifier, StructData  # noqa: E402

from lit_asyncfl.cli import FederatedCLI  # noqa: E402


def _fit(tmp_path, model_cls, data, engine="fast", **kwargs):
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, eval_every=1, engine=engine, **kwargs)
    torch.manual_seed(1)
    model = model_cls()
    trainer.fit(model, datamodule=data)
    return trainer


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
              "--model=wild_modules.PLClassifier", "--data=wild_modules.PLData"]  # fmt: skip
    fit = FederatedCLI(args=["fit", "--trainer.algorithm=fedavg", "--trainer.num_clients=3",
                             "--trainer.max_versions=2", "--trainer.eval_every=1", *common])  # fmt: skip
    assert isinstance(fit.model, pl.LightningModule) and fit.trainer.summary["versions"] == 2
    ckpt = tmp_path / "FedAvg" / "version_0" / "checkpoints" / "last.ckpt"
    test = FederatedCLI(args=["test", "--trainer.max_versions=1", f"--ckpt_path={ckpt}", *common])
    assert_same(test.model.state_dict(), fit.trainer.global_model.state_dict())
    assert torch.load(ckpt, weights_only=False)["hyper_parameters"]["_class_path"] == "wild_modules.PLClassifier"


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
@pytest.mark.parametrize(
    ("name", "equivalent"),
    [("EarlyStopping", "lit_asyncfl.callbacks.EarlyStopping"),
     ("ModelCheckpoint", "lit_asyncfl.callbacks.ModelCheckpoint"),
     ("TQDMProgressBar", "lit_asyncfl.callbacks.ProgressBar"), ("Callback", "lit_asyncfl.callbacks.Callback")],
)  # fmt: skip
def test_lightning_callbacks_refused_naming_ours(tmp_path, namespace, name, equivalent):
    import importlib

    callbacks = importlib.import_module(f"{namespace}.callbacks")
    cb = getattr(callbacks, name)(**({"monitor": "val_loss"} if name == "EarlyStopping" else {}))
    with pytest.raises(ValueError, match=rf"{name} is a Lightning Callback.*use (a )?{equivalent}"):
        make_trainer(tmp_path, "fedavg", max_versions=1, callbacks=[cb])


@pytest.mark.parametrize("engine", ["fast", "lightning", "cohort"])
@pytest.mark.parametrize("structure", sorted(STRUCTURES))
def test_batch_structures(tmp_path, structure, engine):
    """Every batch structure Lightning's move_data_to_device handles (tuples, lists, dicts, namedtuples,
    dataclasses, nested) reaches training_step and validation_step as built (a namedtuple crashed at fit start in
    _to_device; the lightning engine turned a tuple into a list), with the same weights as plain lists."""
    trainer = make_trainer(tmp_path / "s", "fedavg", num_clients=3, max_versions=2, eval_every=1, engine=engine)
    torch.manual_seed(1)
    trainer.fit(StructClassifier(structure), datamodule=StructData(structure))
    reference = make_trainer(tmp_path / "r", "fedavg", num_clients=3, max_versions=2, eval_every=1, engine=engine)
    torch.manual_seed(1)
    reference.fit(StructClassifier("list"), datamodule=StructData("list"))
    assert_same(global_weights(trainer), global_weights(reference))
    assert trainer.history[-1]["val_acc"] == reference.history[-1]["val_acc"]
