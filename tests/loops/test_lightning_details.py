"""Lightning's silent details (issue 32, item 5): one metric object logged from several validation loaders, the fit
start's probe unseen by the module, the module's own error at fit start under every engine, and ``validate``/
``test`` taking their data as ``lightning.Trainer`` does."""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
import torchmetrics
from conftest import make_trainer
from torch import nn
from torch.utils.data import DataLoader
from wild_modules import LClassifier, LData, SelfContained, blobs

from lit_asyncfl.loops import run_evaluation

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class OneMetricObject(LClassifier):
    """One torchmetrics object updated and logged from every validation loader."""

    def __init__(self):
        super().__init__()
        self.acc = torchmetrics.classification.MulticlassAccuracy(num_classes=4, average="micro")

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        x, y = batch
        self.acc(self(x), y)
        self.log("val_acc", self.acc)


def test_one_metric_object_from_several_loaders_reports_what_lightning_validate_reports():
    """Lightning computes the object's value for a loader when that loader ends, without a reset in between (the
    second loader's value is over both); every key used to get the value over all loaders."""
    torch.manual_seed(0)
    model = OneMetricObject()
    loaders = [DataLoader(blobs(n, seed=s), batch_size=b) for n, s, b in ((80, 1, 32), (50, 2, 16), (30, 3, 8))]
    expected = L.Trainer(**QUIET).validate(model, loaders, verbose=False)
    assert len({v for r in expected for v in r.values()}) == 3  # three different values: the case is not trivial
    assert run_evaluation(model, [list(loader) for loader in loaders]) == expected


class Prints(LClassifier):
    """Counts its steps the way a user sees them: what it prints."""

    def training_step(self, batch, batch_idx):
        print("training_step", batch_idx)
        return super().training_step(batch, batch_idx)


class PrintsConv(Prints):
    """With a convolution (the automatic kernel choice looks at its input shapes at fit start)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 1, 1)

    def forward(self, x):
        return self.net(self.conv(x.unsqueeze(1)).squeeze(1))


@pytest.mark.parametrize("engine", ["fast", "lightning"])
@pytest.mark.parametrize("module", [Prints, PrintsConv])
def test_the_fit_start_probe_is_not_seen_by_the_module(tmp_path, capsys, engine, module):
    """One client, FedAvg, one round of 2 epochs prints as many steps as lightning.Trainer(max_epochs=2).fit (the
    fast engine printed one probe step more, two for a convolutional module)."""
    loader = DataLoader(blobs(64), batch_size=16)
    torch.manual_seed(0)
    L.Trainer(max_epochs=2, limit_val_batches=0, **QUIET).fit(module(), loader)
    expected = capsys.readouterr().out.count("training_step")
    trainer = make_trainer(tmp_path, "fedavg", num_clients=1, max_versions=1, local_epochs=2, engine=engine)
    trainer.fit(module(), loader)
    assert trainer.summary["updates_aggregated"] == 1
    assert capsys.readouterr().out.count("training_step") == expected == 8


class Warns(LClassifier):
    def training_step(self, batch, batch_idx):
        warnings.warn("a user warning from training_step", UserWarning, stacklevel=1)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("engine", ["fast", "lightning"])
def test_the_fit_start_probe_warns_nothing_the_jobs_do_not(tmp_path, engine):
    """As many of the module's warnings as lightning.Trainer.fit gives (the probe's used to be one more)."""
    loader = DataLoader(blobs(64), batch_size=16)
    counts = []
    for fit in (lambda m: L.Trainer(max_epochs=2, limit_val_batches=0, **QUIET).fit(m, loader),
                lambda m: make_trainer(tmp_path, "fedavg", num_clients=1, max_versions=1, local_epochs=2,
                                       engine=engine).fit(m, loader)):  # fmt: skip
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(Warns())
        counts.append(sum("a user warning from training_step" in str(w.message) for w in caught))
    assert counts == [8, 8]


class WrongInputSize(LClassifier):
    def __init__(self):
        super().__init__(input_dim=10)


@pytest.mark.parametrize("engine", ["fast", "lightning"])
def test_a_wrong_input_size_is_refused_at_fit_start_with_the_modules_own_error(tmp_path, engine):
    """Under engine='lightning' it used to surface as a ClientJobError from the first client job."""
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=2, engine=engine, on_client_error="drop")
    with pytest.raises(ValueError, match=r"WrongInputSize does not fit the data of LData: .*\(16, 16\).*"
                                         r"mat1 and mat2 shapes cannot be multiplied"):  # fmt: skip
        trainer.fit(WrongInputSize(), datamodule=LData())
    assert trainer.simulator is None


def _reference(model, stage, loaders):
    return getattr(L.Trainer(**QUIET), stage)(model, loaders, verbose=False)


@pytest.mark.filterwarnings("ignore:.*without ckpt_path and without a preceding fit")
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_validate_and_test_take_their_data_as_lightning_does(tmp_path, stage):
    """Positional or keyword loaders (the loader used to be taken for a data module), a data module either way, the
    module's own hooks; each evaluates what lightning.Trainer evaluates."""
    dm = LData()
    dm.setup("fit")
    loader = DataLoader(blobs(40, seed=7), batch_size=8)
    trainer = make_trainer(tmp_path, "fedavg", num_clients=3, max_versions=1)
    torch.manual_seed(0)
    model = LClassifier()
    run = getattr(trainer, stage)
    own = SelfContained()
    dm_loader = dm.val_dataloader() if stage == "validate" else dm.test_dataloader()
    cases = {
        "loader-positional": (run(model, loader, verbose=False), _reference(model, stage, loader)),
        "loader-keyword": (run(model, dataloaders=[loader], verbose=False), _reference(model, stage, [loader])),
        "datamodule-positional": (run(model, dm, verbose=False), _reference(model, stage, dm_loader)),
        "datamodule-keyword": (run(model, datamodule=dm, verbose=False), _reference(model, stage, dm_loader)),
        "module-hooks": (run(own, verbose=False), getattr(L.Trainer(**QUIET), stage)(own, verbose=False)),
    }
    for name, (ours, lightnings) in cases.items():
        assert ours == lightnings, name
    with pytest.raises(TypeError, match="pass either dataloaders or datamodule, not both"):
        run(model, loader, datamodule=dm)
