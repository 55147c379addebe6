"""The global evaluation runs in the validation loader's batches, independent of the clients' training batch size:
large ones for the built-in data modules (``eval_batch_size``), the user's own loader's otherwise; the results do
not depend on it (accuracy exactly, the loss within float32 rounding) and are Lightning's."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.synthetic import SyntheticDataModule
from lit_asyncfl.data.vision import CIFAR10DataModule
from lit_asyncfl.models import LeNet5, LogisticRegression


def _fit(tmp_path, datamodule, model, **kwargs) -> FederatedTrainer:
    quiet = {"logger": False, "enable_progress_bar": False, "print_summary": False}
    trainer = FederatedTrainer(
        "fedasync", num_clients=10, max_versions=12, eval_every=4, default_root_dir=str(tmp_path), **quiet, **kwargs
    )
    trainer.fit(model, datamodule=datamodule)
    return trainer


def test_built_in_data_modules_evaluate_in_large_batches_whatever_the_training_batch_size(tmp_path):
    assert DigitsDataModule().eval_batch_size == 512 and CIFAR10DataModule().eval_batch_size == 1024
    assert SyntheticDataModule().eval_batch_size == 1024
    trainer = _fit(tmp_path, DigitsDataModule(batch_size=5), LogisticRegression(input_dim=64))
    assert [len(batch[1]) for batch in trainer.evaluation.batches[0]] == [360]  # the whole test split at once


def test_a_user_validation_loader_keeps_its_batch_size(tmp_path):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(200, 64, generator=gen), torch.randint(0, 10, (200,), generator=gen)

    class Data(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader(TensorDataset(x[:150], y[:150]), batch_size=4)

        def val_dataloader(self):
            return DataLoader(TensorDataset(x[150:], y[150:]), batch_size=37)

    trainer = _fit(tmp_path, Data(), LogisticRegression(input_dim=64))
    assert [len(batch[1]) for batch in trainer.evaluation.batches[0]] == [37, 13]


def test_results_do_not_depend_on_the_evaluation_batch_size_and_are_lightnings(tmp_path):
    histories = {}
    for size in (512, 10, 7):
        torch.manual_seed(0)
        trainer = _fit(tmp_path / str(size), DigitsDataModule(batch_size=10, eval_batch_size=size), LeNet5(lr=0.05))
        histories[size] = [(row["val_acc"], row["val_loss"]) for row in trainer.history]
    for size in (10, 7):
        assert [acc for acc, _ in histories[size]] == [acc for acc, _ in histories[512]]  # exactly
        assert [loss for _, loss in histories[size]] == pytest.approx([loss for _, loss in histories[512]], rel=1e-6)
    # the reference: lightning.Trainer.validate on the final global weights, in batches of 7
    dm = DigitsDataModule()
    dm.setup("fit")
    reference = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    result = reference.validate(trainer.global_model, DataLoader(dm.test_set, batch_size=7), verbose=False)[0]
    assert result["val_acc"] == pytest.approx(histories[7][-1][0], abs=1e-7)
    assert result["val_loss"] == pytest.approx(histories[512][-1][1], rel=1e-6)
