"""Third-party-style Lightning code for tests/loops/test_lightning_parity.py (issue 32, item 6): copies of the styles
users bring — an autoencoder without labels (Lightning's own example), ``self.log_dict``, validation outputs
aggregated in ``on_validation_epoch_end`` (Lightning 2's pattern), BatchNorm (with a running and a cumulative
average), torchmetrics objects, a module bringing its own unshuffled data — plus data modules that load their data
unshuffled or shuffled, as written in tutorials (tests/parity_pl_modules.py: the same in the old namespace). Lightning's
GAN example and the tutorial classifier are tests/wild_modules.py's and tests/wild_pl_modules.py's.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from wild_modules import LClassifier, SetupBuildsData, blobs


class LitAutoEncoder(L.LightningModule):
    """Lightning's autoencoder example, small: its batches hold inputs only (a one-tensor dataset, no labels)."""

    def __init__(self, data_dim: int = 16, code_dim: int = 3, lr: float = 1e-2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(nn.Linear(data_dim, 8), nn.ReLU(), nn.Linear(8, code_dim))
        self.decoder = nn.Sequential(nn.Linear(code_dim, 8), nn.ReLU(), nn.Linear(8, data_dim))

    def forward(self, x):
        return self.decoder(self.encoder(x))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        loss = F.mse_loss(self(x), x)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        self.log("val_loss", F.mse_loss(self(x), x))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def unlabelled(n: int = 48, dim: int = 16, seed: int = 0) -> TensorDataset:
    return TensorDataset(blobs(n, dim, seed=seed).tensors[0])


class LogDictClassifier(LClassifier):
    """Logs with ``self.log_dict`` in training and validation."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log_dict({"train_loss": loss, "train_acc": (logits.argmax(-1) == y).float().mean()})
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log_dict({"val_loss": F.cross_entropy(logits, y), "val_acc": (logits.argmax(-1) == y).float().mean()})


class EpochEndAggregation(LClassifier):
    """Lightning 2's pattern: ``validation_step`` keeps its outputs and ``on_validation_epoch_end`` logs their mean."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.validation_step_outputs = []

    def validation_step(self, batch, batch_idx):
        x, y = batch
        correct = (self(x).argmax(-1) == y).float()
        self.validation_step_outputs.append(correct)

    def on_validation_epoch_end(self):
        self.log("val_acc", torch.cat(self.validation_step_outputs).mean())
        self.validation_step_outputs.clear()


class BatchNormClassifier(LClassifier):
    """A hidden layer with BatchNorm (``momentum=None``: a cumulative average, which reads ``num_batches_tracked``)."""

    def __init__(self, momentum: float | None = 0.1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8, momentum=momentum), nn.ReLU(), nn.Linear(8, 4))


class MetricsClassifier(LClassifier):
    """torchmetrics objects updated in ``training_step`` and ``validation_step`` and logged as objects."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=4)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.train_acc(logits, y)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        return F.cross_entropy(logits, y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.val_acc.update(self(x), y)
        self.log("val_acc", self.val_acc)


class OwnDataUnshuffled(LClassifier):
    """A tutorial module with its own dataloader hooks, training unshuffled (two of Lightning's examples do)."""

    def train_dataloader(self):
        return DataLoader(blobs(40, seed=0), batch_size=8, shuffle=False)

    def val_dataloader(self):
        return DataLoader(blobs(40, seed=1), batch_size=16)


class SetupBuildsDataUnshuffled(SetupBuildsData):
    """``setup`` builds the data sets its (unshuffled) dataloader hooks read."""

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=False)


class _BlobDataSteps:
    """A tutorial's data module whose training loader shuffles or not (``shuffle``); both namespaces share it."""

    def __init__(self, shuffle: bool = False, n: int = 40, batch_size: int = 8) -> None:
        super().__init__()
        self.shuffle, self.n, self.batch_size = shuffle, n, batch_size

    def setup(self, stage=None):
        self.train_set, self.val_set = blobs(self.n, seed=0), blobs(40, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=self.shuffle)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)


class BlobData(_BlobDataSteps, L.LightningDataModule):
    pass


class UnlabelledData(BlobData):
    """The autoencoder's data: one-tensor datasets."""

    def setup(self, stage=None):
        self.train_set, self.val_set = unlabelled(self.n, seed=0), unlabelled(40, seed=1)
