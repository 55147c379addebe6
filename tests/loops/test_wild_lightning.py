"""Lightning code from the wild runs unchanged (issue 32): batch structures, manual optimization, Lightning's ways to
pass the data, Lightning callbacks (the old ``pytorch_lightning`` namespace: test_wild_pl_namespace.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_same, global_weights, make_trainer
from wild_modules import (
    STRUCTURES,
    LClassifier,
    LData,
    SelfContained,
    SetupBuildsData,
    StructClassifier,
    StructData,
    TinyGAN,
    TwoOptimizers,
)

from lit_asyncfl.callbacks import Callback
from lit_asyncfl.cli import FederatedCLI


def _fit(tmp_path, model_cls, data, engine="fast", **kwargs):
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, eval_every=1, engine=engine, **kwargs)
    torch.manual_seed(1)
    model = model_cls()
    trainer.fit(model, datamodule=data)
    return trainer


@pytest.mark.parametrize("namespace", ["lightning.pytorch", "pytorch_lightning"])
@pytest.mark.parametrize(
    ("name", "equivalent"),
    [("EarlyStopping", "lit_asyncfl.callbacks.EarlyStopping"),
     ("ModelCheckpoint", "lit_asyncfl.callbacks.ModelCheckpoint"),
     ("TQDMProgressBar", "lit_asyncfl.callbacks.ProgressBar"), ("Callback", "lit_asyncfl.callbacks.Callback")],
)  # fmt: skip
def test_lightning_callbacks_refused_naming_ours(tmp_path, namespace, name, equivalent):
    callbacks = pytest.importorskip(f"{namespace}.callbacks")  # pytorch_lightning: in the dev extra
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


@pytest.mark.parametrize("engine", ["fast", "cohort"])
@pytest.mark.parametrize(
    ("module", "message"),
    [(TinyGAN, r"TinyGAN uses manual optimization .* use engine='lightning'"),
     (TwoOptimizers, r"one optimizer, got 2; several optimizers need manual optimization .* engine='lightning'")],
)  # fmt: skip
def test_manual_optimization_and_several_optimizers_refused_at_fit_start(tmp_path, engine, module, message):
    """Refused before any job runs (before: the first client job failed mid-run, and with on_client_error='drop'
    the run spent its budget with 0 versions)."""
    errors = {"on_client_error": "drop"} if engine == "fast" else {}
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, engine=engine, **errors)
    with pytest.raises(ValueError, match=message):
        trainer.fit(module(), datamodule=LData())
    assert trainer.simulator is None or trainer.simulator.server.version == 0


class _Updates(Callback):
    def __init__(self):
        self.steps = []

    def on_client_update(self, trainer, update, aggregated):
        self.steps.append((update.num_steps, update.job.num_steps))


def test_gan_with_manual_optimization_trains_under_the_lightning_engine(tmp_path):
    """Lightning's GAN pattern (two optimizers, manual_backward, toggle_optimizer) trains under engine='lightning':
    every job trains on all its planned batches (each update counts them: it counted 0 before, as the module's
    training_step returns no loss), the weights move, and the run is deterministic."""
    runs = []
    for name in ("a", "b"):
        updates = _Updates()
        trainer = make_trainer(tmp_path / name, "fedavg", num_clients=3, max_versions=2, eval_every=1,
                               engine="lightning", local_epochs=2, callbacks=[updates])  # fmt: skip
        torch.manual_seed(1)
        model = TinyGAN()
        start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        trainer.fit(model, datamodule=LData())
        runs.append(global_weights(trainer))
        assert trainer.summary["versions"] == 2 and "val_d_acc" in trainer.history[-1]
        assert updates.steps and all(done == planned == 2 * 5 for done, planned in updates.steps)  # 80 samples / 16
    assert not torch.equal(runs[0], start)
    assert_same(runs[0], runs[1])


def test_manual_optimization_refuses_client_callbacks_that_change_training(tmp_path):
    trainer = make_trainer(tmp_path, "fedprox", num_clients=3, max_versions=2, engine="lightning")
    with pytest.raises(ValueError, match=r"TinyGAN uses manual optimization, but .* ProximalTerm"):
        trainer.fit(TinyGAN(), datamodule=LData())


def _data_forms(tmp_path, form):
    trainer = make_trainer(tmp_path / form, "fedavg", num_clients=3, max_versions=2, eval_every=1)
    torch.manual_seed(1)
    dm = LData()
    dm.setup("fit")
    if form == "datamodule":
        trainer.fit(LClassifier(), datamodule=LData())
    elif form == "positional-datamodule":
        trainer.fit(LClassifier(), LData())
    elif form == "loaders":
        trainer.fit(LClassifier(), dm.train_dataloader(), dm.val_dataloader())
    elif form == "keyword-loaders":
        trainer.fit(LClassifier(), train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader())
    elif form == "module-hooks":
        trainer.fit(SelfContained())
    return trainer


def test_lightnings_ways_to_pass_the_data_train_alike(tmp_path):
    """fit(model, train_loader, val_loader), fit(model, dm) and a module's own dataloader hooks train and evaluate
    exactly as fit(model, datamodule=dm) on the same data (the val loader used to land in ckpt_path)."""
    reference = _data_forms(tmp_path, "datamodule")
    for form in ("positional-datamodule", "loaders", "keyword-loaders", "module-hooks"):
        trainer = _data_forms(tmp_path, form)
        assert_same(global_weights(trainer), global_weights(reference))
        assert trainer.history[-1]["val_acc"] == reference.history[-1]["val_acc"], form
    assert trainer.test(verbose=False)[0]["test_acc"] == reference.test(verbose=False)[0]["test_acc"]


def test_a_module_building_its_data_in_setup_is_refused_before_its_loaders_are_read(tmp_path):
    """Outside engine='lightning' setup() never runs: the refusal names it (not an AttributeError from the hook)."""
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, engine="fast")
    with pytest.raises(ValueError, match=r"SetupBuildsData overrides \['setup'\].*use engine='lightning'"):
        trainer.fit(SetupBuildsData())
    trainer = make_trainer(tmp_path / "l", "fedavg", num_clients=3, max_versions=2, engine="lightning")
    trainer.fit(SetupBuildsData())
    assert trainer.summary["updates_aggregated"] > 0


def test_training_loader_alone_trains_without_evaluation(tmp_path):
    dm = LData()
    dm.setup("fit")
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, eval_every=1)
    with pytest.warns(UserWarning, match="no val_dataloader or test_dataloader"):
        trainer.fit(LClassifier(), dm.train_dataloader())
    assert trainer.summary["versions"] == 2


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [((), {}, "no training data: pass train_dataloaders"),
     (("loader",), {"datamodule": "dm"}, "either train_dataloaders/val_dataloaders or datamodule"),
     (("dm",), {"datamodule": "dm"}, "passed as train_dataloaders and as datamodule"),
     (("dm", "ckpt.ckpt"), {}, "either train_dataloaders/val_dataloaders or datamodule"),
     (([],), {}, "train_dataloaders must be one DataLoader")],
)  # fmt: skip
def test_data_arguments_lightning_refuses_are_refused(tmp_path, args, kwargs, message):
    dm = LData()
    dm.setup("fit")
    objects = {"loader": dm.train_dataloader(), "dm": dm}
    args = tuple(objects.get(a, a) if isinstance(a, str) else a for a in args)
    kwargs = {k: objects.get(v, v) for k, v in kwargs.items()}
    with pytest.raises(TypeError, match=message):
        make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=1).fit(LClassifier(), *args, **kwargs)


def test_a_module_with_its_own_data_through_the_cli(tmp_path):
    """Without --data, the module's own dataloader hooks are the data, as under LightningCLI."""
    args = ["fit", "--model=wild_modules.SelfContained", "--trainer.algorithm=fedavg", "--trainer.num_clients=3",
            "--trainer.max_versions=2", f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]  # fmt: skip
    cli = FederatedCLI(args=args)
    assert cli.trainer.summary["versions"] == 2 and "val_acc" in cli.trainer.history[-1]
