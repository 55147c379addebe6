"""MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100 read from their standard on-disk formats.

Files are read directly (MNIST-style IDX files under ``<root>/<Name>/raw/``, CIFAR's pickled batches under
``<root>/cifar-10-batches-py/`` or ``<root>/cifar-100-python/``), which is exactly what torchvision's downloaders
write; ``download=True`` fetches them with torchvision. Training images stay resident as ``uint8`` tensors (a
quarter of the memory of float32) and are standardised per channel, with the usual dataset statistics, per client
batch; evaluation images are standardised once.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.checks import check_bool, check_int, check_path
from lit_asyncfl.data.base import PARTITION, SPLIT_SEED, VAL_FRACTION, FederatedDataModule, require_files
from lit_asyncfl.data.partition import PartitionArg
from lit_asyncfl.data.transforms import normalize, random_crop_flip
from lit_asyncfl.traces import safe_pickle_load


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format), optionally gzip-compressed.

    Example:
        >>> import tempfile, os
        >>> p = Path(tempfile.mkdtemp()) / "x-idx1-ubyte"
        >>> _ = p.write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
        >>> read_idx(p).tolist()
        [7, 8, 9]
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise ValueError(f"{path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


class VisionDataModule(FederatedDataModule):
    """Base of the image data modules: a fixed train/test split, per-channel standardisation.

    Args:
        root: Directory holding the dataset (as torchvision lays it out).
        download: Download the files with torchvision when missing (needs a network).
        partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed: The federated split's
            (:class:`~lit_asyncfl.data.FederatedDataModule`'s arguments, see there).
        augmentation: Random crop (zero padding of ``crop_padding`` pixels) and, for natural images (CIFAR,
            Tiny-ImageNet; not digits or clothing), horizontal flip of clients' training images, per batch (the usual
            CIFAR augmentation; off by default, as in the papers' setups).
        crop_padding: Padding of the random crop.
    """

    num_classes = 10
    input_shape: tuple[int, int, int] = (1, 28, 28)
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    #: Whether augmentation flips images horizontally (not for digits or clothing).
    flip = False

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 1024,
        val_fraction: float = VAL_FRACTION,
        split_seed: int = SPLIT_SEED,
        augmentation: bool = False,
        crop_padding: int = 4,
    ) -> None:
        super().__init__(partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed)
        check_path("root", root)
        check_bool("download", download)
        check_bool("augmentation", augmentation)
        check_int("crop_padding", crop_padding, 0)
        self.root = root
        self.download = download
        self.augmentation = augmentation
        self.crop_padding = crop_padding

    # -- to implement ----------------------------------------------------------------------------------------
    def expected_files(self) -> list[Path]:
        """The files :meth:`read` needs."""
        raise NotImplementedError

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(train images NHWC or NHW uint8, train labels, test images, test labels)``."""
        raise NotImplementedError

    def fetch(self) -> None:
        """Download with torchvision."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        if self.download and any(not p.exists() for p in self.expected_files()):
            self.fetch()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        require_files(self, self.root, self.expected_files())
        x_train, y_train, x_test, y_test = self.read()
        self.assign_splits(
            self._to_tensor(x_train),
            torch.tensor(y_train, dtype=torch.long),
            self._to_tensor(x_test),
            torch.tensor(y_test, dtype=torch.long),
        )

    def prepare_inputs(self, inputs: Tensor) -> Tensor:
        return normalize(inputs, self.mean, self.std)

    def augment(self, inputs: Tensor, generator: torch.Generator) -> Tensor:
        return random_crop_flip(inputs, self.crop_padding, generator, self.flip) if self.augmentation else inputs

    @staticmethod
    def _to_tensor(images: np.ndarray) -> Tensor:
        """``uint8`` images NHW or NHWC to an ``uint8`` NCHW tensor."""
        writable = images.dtype == np.uint8 and images.flags.writeable and images.flags.c_contiguous
        x = torch.from_numpy(images if writable else np.array(images, dtype=np.uint8, order="C"))
        return x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()


class MNISTDataModule(VisionDataModule):
    """MNIST (60,000 + 10,000 28x28 digits) from ``<root>/MNIST/raw/``.

    Example:
        >>> MNISTDataModule(root="/nonexistent").expected_files()[0].name
        'train-images-idx3-ubyte'
    """

    folder = "MNIST"
    mean, std = (0.1307,), (0.3081,)

    def expected_files(self) -> list[Path]:
        raw = Path(self.root) / self.folder / "raw"
        names = [
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        ]
        return [raw / n if (raw / n).exists() or not (raw / f"{n}.gz").exists() else raw / f"{n}.gz" for n in names]

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x_train, y_train, x_test, y_test = (read_idx(p) for p in self.expected_files())
        return x_train, y_train, x_test, y_test

    def fetch(self) -> None:
        from torchvision.datasets import MNIST

        for train in (True, False):
            MNIST(self.root, train=train, download=True)


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (60,000 + 10,000 28x28 clothing images) from ``<root>/FashionMNIST/raw/``."""

    folder = "FashionMNIST"
    mean, std = (0.2860,), (0.3530,)

    def fetch(self) -> None:
        from torchvision.datasets import FashionMNIST

        for train in (True, False):
            FashionMNIST(self.root, train=train, download=True)


def _unpickle(path: Path) -> dict:
    """A CIFAR batch (a Python pickle of NumPy arrays, lists and strings), read without running code: a file naming
    any other global (a crafted ``data_batch_1``) is refused naming the file."""
    data = safe_pickle_load(path, "a CIFAR batch", encoding="latin1")
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a CIFAR batch is a dict of arrays and labels, got {type(data).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in data.items()}


class CIFAR10DataModule(VisionDataModule):
    """CIFAR-10 (50,000 + 10,000 32x32 colour images) from ``<root>/cifar-10-batches-py/``."""

    input_shape = (3, 32, 32)
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    flip = True
    folder = "cifar-10-batches-py"
    train_files: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
    test_files: tuple[str, ...] = ("test_batch",)
    label_key = "labels"

    def expected_files(self) -> list[Path]:
        return [Path(self.root) / self.folder / n for n in (*self.train_files, *self.test_files)]

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        def load(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
            parts = [_unpickle(Path(self.root) / self.folder / n) for n in names]
            images = np.concatenate([np.asarray(p["data"], dtype=np.uint8).reshape(-1, 3, 32, 32) for p in parts])
            labels = np.concatenate([np.asarray(p[self.label_key], dtype=np.int64) for p in parts])
            return images.transpose(0, 2, 3, 1), labels

        return (*load(self.train_files), *load(self.test_files))

    def fetch(self) -> None:
        from torchvision.datasets import CIFAR10

        CIFAR10(self.root, download=True)


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (100 fine classes) from ``<root>/cifar-100-python/``."""

    num_classes = 100
    mean, std = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)
    folder = "cifar-100-python"
    train_files = ("train",)
    test_files = ("test",)
    label_key = "fine_labels"

    def fetch(self) -> None:
        from torchvision.datasets import CIFAR100

        CIFAR100(self.root, download=True)


class TinyImageNetDataModule(VisionDataModule):
    """Tiny-ImageNet (200 classes, 100,000 training + 10,000 validation 64x64 images) from its standard folders.

    Reads ``<root>/tiny-imagenet-200/``: ``wnids.txt`` (the class ids; label = position in sorted order, as
    torchvision's ``ImageFolder`` numbers them), ``train/<wnid>/images/*.JPEG`` and ``val/images/*.JPEG`` labelled by
    ``val/val_annotations.txt``. The official test images have no labels, so the validation images are the test
    split (as in the papers). Images are decoded once with Pillow (greyscale ones converted to RGB; ~1-2 minutes for
    the full set) and kept resident as ``uint8`` (1.2 GB for the training set). ``download=True`` fetches the
    archive from cs231n.stanford.edu.

    Example:
        >>> TinyImageNetDataModule(root="/data").expected_files()[0].as_posix()
        '/data/tiny-imagenet-200/wnids.txt'
    """

    num_classes = 200
    input_shape = (3, 64, 64)
    flip = True
    mean, std = (0.4802, 0.4481, 0.3975), (0.2770, 0.2691, 0.2821)
    folder = "tiny-imagenet-200"
    url = "http://cs231n.stanford.edu/tiny-imagenet-200.zip"

    def expected_files(self) -> list[Path]:
        base = Path(self.root) / self.folder
        return [base / "wnids.txt", base / "train", base / "val" / "images", base / "val" / "val_annotations.txt"]

    def read(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        from PIL import Image

        base = Path(self.root) / self.folder
        wnids = sorted(line.strip() for line in (base / "wnids.txt").read_text().splitlines() if line.strip())
        label_of = {w: i for i, w in enumerate(wnids)}

        def load(paths: list[Path]) -> np.ndarray:
            images = np.empty((len(paths), 64, 64, 3), dtype=np.uint8)
            for i, path in enumerate(paths):
                with Image.open(path) as img:
                    rgb = img.convert("RGB")
                    if rgb.size != (64, 64):
                        raise ValueError(f"{path}: expected a 64x64 image, got {rgb.size[0]}x{rgb.size[1]}")
                    images[i] = np.asarray(rgb)
            return images

        train_paths: list[Path] = []
        train_labels: list[int] = []
        for wnid in wnids:
            files = sorted((base / "train" / wnid / "images").glob("*.JPEG"))
            if not files:
                raise FileNotFoundError(f"no training images in {base / 'train' / wnid / 'images'}")
            train_paths += files
            train_labels += [label_of[wnid]] * len(files)
        val_paths: list[Path] = []
        val_labels: list[int] = []
        for line in (base / "val" / "val_annotations.txt").read_text().splitlines():
            fields = line.split("\t")
            if len(fields) < 2:
                continue
            if fields[1] not in label_of:
                raise ValueError(f"val_annotations.txt names {fields[1]!r}, which is not in wnids.txt")
            val_paths.append(base / "val" / "images" / fields[0])
            val_labels.append(label_of[fields[1]])
        return load(train_paths), np.array(train_labels), load(val_paths), np.array(val_labels)

    def fetch(self) -> None:
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(self.url, download_root=self.root)
