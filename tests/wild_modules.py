"""Third-party-style Lightning code, as found in tutorials and other projects, for tests/loops/test_wild_lightning.py.

``LClassifier``/``LData`` are a tutorial's classifier and data module; tests/wild_pl_modules.py holds the same code in
the old namespace (``import pytorch_lightning as pl``), as Flower's Lightning quickstart and many tutorials write it.
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class _ClassifierSteps:
    """The body both namespaces' classifiers share (a tutorial's linear classifier)."""

    def __init__(self, input_dim: int = 16, num_classes: int = 4, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Linear(input_dim, num_classes)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(-1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class LClassifier(_ClassifierSteps, L.LightningModule):
    pass


def blobs(n: int = 240, dim: int = 16, classes: int = 4, seed: int = 0) -> TensorDataset:
    """Linearly separable-ish data: the label is the argmax of a fixed projection."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    y = (x @ torch.randn(dim, classes, generator=g)).argmax(-1)
    return TensorDataset(x, y)


class _DataSteps:
    def __init__(self, batch_size: int = 16) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage=None):
        self.train_set, self.val_set = blobs(240, seed=0), blobs(80, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32)

    def test_dataloader(self):
        return DataLoader(self.val_set, batch_size=32)


class LData(_DataSteps, L.LightningDataModule):
    pass


# -- batch structures (issue 32, item 4): what Lightning's move_data_to_device handles -------------------------------
Point = namedtuple("Point", ["x", "y"])


@dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor


#: name -> (build a sample or batch from (x, y), read (x, y) back from it)
STRUCTURES = {
    "tuple": (lambda x, y: (x, y), lambda b: (b[0], b[1])),
    "list": (lambda x, y: [x, y], lambda b: (b[0], b[1])),
    "dict": (lambda x, y: {"x": x, "y": y}, lambda b: (b["x"], b["y"])),
    "namedtuple": (Point, lambda b: (b.x, b.y)),
    "dataclass": (Pair, lambda b: (b.x, b.y)),
    "nested": (
        lambda x, y: {"inputs": (x,), "meta": {"label": [y]}},
        lambda b: (b["inputs"][0], b["meta"]["label"][0]),
    ),
}


class StructDataset(Dataset):
    """Samples in one of :data:`STRUCTURES`; :meth:`collate` stacks them into a batch of the same structure."""

    def __init__(self, base: TensorDataset, structure: str) -> None:
        self.base, self.structure = base, structure

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i):
        return STRUCTURES[self.structure][0](*self.base[i])

    def collate(self, samples):
        build, read = STRUCTURES[self.structure]
        xs, ys = zip(*(read(s) for s in samples))
        return build(torch.stack(xs), torch.stack(ys))


class StructClassifier(LClassifier):
    """The classifier reading its batches in one structure."""

    def __init__(self, structure: str = "tuple", lr: float = 0.1) -> None:
        super().__init__(lr=lr)
        self.read = STRUCTURES[structure][1]

    def training_step(self, batch, batch_idx):
        assert not isinstance(batch, list) or self.read is STRUCTURES["list"][1]  # the structure arrives as built
        return super().training_step(self.read(batch), batch_idx)

    def validation_step(self, batch, batch_idx):
        return super().validation_step(self.read(batch), batch_idx)


class StructData(LData):
    def __init__(self, structure: str = "tuple") -> None:
        super().__init__()
        self.structure = structure

    def setup(self, stage=None):
        super().setup(stage)
        self.train_set = StructDataset(self.train_set, self.structure)
        self.val_set = StructDataset(self.val_set, self.structure)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True, collate_fn=self.train_set.collate)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32, collate_fn=self.val_set.collate)


# -- manual optimization (issue 32, item 3): Lightning's basic GAN example, small ------------------------------------
class TinyGAN(L.LightningModule):
    """Two optimizers, ``automatic_optimization = False``, ``manual_backward`` and ``toggle_optimizer``, as in
    Lightning's GAN example; ``validation_step`` scores the discriminator on real against generated samples."""

    def __init__(self, latent_dim: int = 4, data_dim: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent_dim, 16), nn.ReLU(), nn.Linear(16, data_dim))
        self.discriminator = nn.Sequential(nn.Linear(data_dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.shape[0], self.hparams.latent_dim).type_as(x)
        ones, zeros = torch.ones(x.shape[0], 1).type_as(x), torch.zeros(x.shape[0], 1).type_as(x)
        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), ones)
        self.log("g_loss", g_loss, prog_bar=True)
        self.manual_backward(g_loss)
        opt_g.step()
        opt_g.zero_grad()
        self.untoggle_optimizer(opt_g)
        self.toggle_optimizer(opt_d)
        real = F.binary_cross_entropy_with_logits(self.discriminator(x), ones)
        fake = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), zeros)
        d_loss = (real + fake) / 2
        self.log("d_loss", d_loss, prog_bar=True)
        self.manual_backward(d_loss)
        opt_d.step()
        opt_d.zero_grad()
        self.untoggle_optimizer(opt_d)

    def validation_step(self, batch, batch_idx):
        x, _ = batch
        fake = self(torch.randn(x.shape[0], self.hparams.latent_dim).type_as(x))
        correct = (self.discriminator(x) > 0).float().sum() + (self.discriminator(fake) <= 0).float().sum()
        self.log("val_d_acc", correct / (2 * x.shape[0]))

    def configure_optimizers(self):
        lr = self.hparams.lr
        return [
            torch.optim.Adam(self.generator.parameters(), lr=lr),
            torch.optim.Adam(self.discriminator.parameters(), lr=lr),
        ], []


class TwoOptimizers(LClassifier):
    """Several optimizers under automatic optimization, which Lightning itself refuses."""

    def configure_optimizers(self):
        return [torch.optim.SGD(self.net.parameters(), lr=0.1), torch.optim.SGD(self.net.parameters(), lr=0.2)]


# -- Lightning's other ways in (issue 32, item 5): a module that brings its own data ---------------------------------
class SelfContained(LClassifier):
    """A tutorial module with its own dataloader hooks (no data module)."""

    def train_dataloader(self):
        return DataLoader(blobs(240, seed=0), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(blobs(80, seed=1), batch_size=32)

    def test_dataloader(self):
        return DataLoader(blobs(80, seed=1), batch_size=32)


class SetupBuildsData(LClassifier):
    """The usual tutorial pattern: ``setup`` builds the data sets the dataloader hooks read."""

    def setup(self, stage=None):
        self.train_set, self.val_set = blobs(240, seed=0), blobs(80, seed=1)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=32)
