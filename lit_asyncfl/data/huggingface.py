"""A Hugging Face ``datasets.Dataset`` as a federated data source (optional extra: ``pip install
'lit-asyncfl[flower]'``, or ``datasets`` alone)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset

from lit_asyncfl.checks import check, check_bool
from lit_asyncfl.data.base import EVAL_BATCH_SIZE, PARTITION, SPLIT_SEED, VAL_FRACTION, FederatedDataModule
from lit_asyncfl.data.partition import PartitionArg


def default_transform(value: Any) -> Tensor:
    """A sample's input as a tensor: a PIL image as ``float32`` in [0, 1], channels first (torchvision's
    ``ToTensor``); anything else through NumPy, floating point as ``float32`` (integers, e.g. token ids, kept).

    Example:
        >>> default_transform([[1.0, 2.0]]).dtype, default_transform([3, 4]).tolist()
        (torch.float32, [3, 4])
    """
    if hasattr(value, "getbands"):  # a PIL image
        array = np.asarray(value)
        x = torch.from_numpy(np.array(array, dtype=np.float32) / 255.0)
        return x.unsqueeze(0) if x.ndim == 2 else x.permute(2, 0, 1).contiguous()
    x = torch.as_tensor(np.asarray(value))
    return x.float() if x.is_floating_point() else x


class HuggingFaceSamples(Dataset):
    """A ``datasets.Dataset`` as ``(input, label)`` samples, each input read and transformed at every access (so a
    random transform is drawn afresh, as under a ``DataLoader``).

    Args:
        dataset: The ``datasets.Dataset``.
        input_column: The column of inputs.
        label_column: The column of labels.
        transform: ``value -> Tensor`` of one input (default :func:`default_transform`).
    """

    def __init__(
        self, dataset: Any, input_column: str, label_column: str, transform: Callable[[Any], Tensor] | None = None
    ) -> None:
        self.dataset = dataset
        self.input_column = input_column
        self.label_column = label_column
        self.transform = transform or default_transform
        #: Every sample's label (read once, for label-based partitions and ``partition.csv``).
        self.targets = _labels(dataset, label_column)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        row = self.dataset[int(index)]
        return self.transform(row[self.input_column]), self.targets[int(index)]


def _labels(dataset: Any, column: str) -> Tensor:
    values = np.asarray(dataset.with_format("numpy")[column])
    if not (np.issubdtype(values.dtype, np.integer) or np.issubdtype(values.dtype, np.floating)):
        raise ValueError(
            f"label column {column!r} holds {values.dtype} values: give integer class ids (e.g. "
            f"dataset.class_encode_column({column!r})) or real-valued targets"
        )
    labels = torch.from_numpy(np.ascontiguousarray(values))
    return labels.long() if not labels.is_floating_point() else labels.float()


def _load(source: Any, name: str) -> Any:
    import datasets

    if isinstance(source, str):
        return datasets.load_from_disk(source)
    if not isinstance(source, datasets.Dataset):
        raise TypeError(
            f"{name} must be a datasets.Dataset or the path of one saved with save_to_disk, got "
            f"{type(source).__name__} (for a DatasetDict pass its splits, e.g. {name}=dataset_dict['train'])"
        )
    return source


class HuggingFaceDataModule(FederatedDataModule):
    """A Hugging Face ``datasets.Dataset`` (a training and a test split) as the clients' data.

    The inputs of ``input_column`` are turned into tensors by ``transform`` and the labels of ``label_column`` (integer
    class ids, e.g. a ``ClassLabel``, or real-valued targets) into a tensor. With ``resident=True`` (for a
    deterministic transform) every input is transformed once and the training set is kept as a ``TensorDataset``:
    batches are gathered by index, as for the bundled data modules. With ``resident=False`` (a random transform,
    e.g. augmentation) every sample is read and transformed afresh at every draw. The training set's other plain
    columns (numbers and strings: a writer or user id, the label under its own name, ...) are its ``train_columns``,
    which ``Natural(column=...)`` and Flower Datasets partitioners read (with ``partition=NaturalIdPartitioner(
    partition_by="writer_id")`` or ``Natural("writer_id")``, one client per writer).

    Args:
        train: The training ``datasets.Dataset``, or the path of one saved with ``save_to_disk`` (for the CLI).
        test: The test split (evaluated during ``fit`` unless ``val_fraction > 0``), likewise.
        input_column: The column of inputs.
        label_column: The column of labels.
        transform: ``value -> Tensor`` of one input, as ``datasets`` returns it (a PIL image for an ``Image``
            column); default :func:`default_transform` (images to ``float32`` in [0, 1], channels first).
        eval_transform: The transform of evaluation inputs (default: ``transform``).
        resident: Transform every input once and keep tensors (``False``: at every read).
        partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed: The federated split's
            (:class:`~lit_asyncfl.data.FederatedDataModule`'s arguments, see there;
            ``val_fraction=0``: validate on ``test``).

    Example:
        >>> import pytest; datasets = pytest.importorskip("datasets")
        >>> from lit_asyncfl.data import Natural
        >>> rows = {"x": [[float(i), 1.0] for i in range(8)], "label": [i % 2 for i in range(8)]}
        >>> ds = datasets.Dataset.from_dict({**rows, "user": list("aabbccdd")})
        >>> dm = HuggingFaceDataModule(ds, ds, input_column="x", partition=Natural("user"))
        >>> dm.setup("fit")
        >>> [dm.client_shards(4, seed=0).num_samples(c) for c in range(4)], sorted(dm.train_columns)
        ([2, 2, 2, 2], ['label', 'user'])
    """

    def __init__(
        self,
        train: Any,
        test: Any,
        input_column: str = "image",
        label_column: str = "label",
        transform: Callable[[Any], Tensor] | None = None,
        eval_transform: Callable[[Any], Tensor] | None = None,
        resident: bool = True,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        batch_size: int = 32,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        val_fraction: float = VAL_FRACTION,
        split_seed: int = SPLIT_SEED,
    ) -> None:
        super().__init__(partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed)
        for name, column in (("input_column", input_column), ("label_column", label_column)):
            check(isinstance(column, str) and column != "", f"{name} must be a column name, got {column!r}")
        check(input_column != label_column, f"input_column and label_column are both {input_column!r}")
        for name, fn in (("transform", transform), ("eval_transform", eval_transform)):
            check(fn is None or callable(fn), f"{name} must be a function value -> Tensor or None, got {fn!r}")
        check_bool("resident", resident)
        self._train, self._test = _load(train, "train"), _load(test, "test")
        for name, split in (("train", self._train), ("test", self._test)):
            missing = [c for c in (input_column, label_column) if c not in split.column_names]
            check(not missing, f"{name} has no column {missing[:1]}; its columns: {split.column_names}")
        self.input_column = input_column
        self.label_column = label_column
        self.transform = transform
        self.eval_transform = eval_transform
        self.resident = resident
        #: What the data is (for the run's record): rows and columns of each split.
        self.source = {
            "train": f"{len(self._train)} rows, columns {self._train.column_names}",
            "test": f"{len(self._test)} rows, columns {self._test.column_names}",
        }
        feature = self._train.features.get(label_column)
        classes = getattr(feature, "num_classes", None)
        labels = [_labels(split, label_column) for split in (self._train, self._test)]
        if classes is None and not labels[0].is_floating_point():
            classes = int(max(int(y.max()) for y in labels if len(y))) + 1
        #: Number of classes (a ``ClassLabel``'s, else the largest label + 1; ``None`` for real-valued targets).
        self.num_classes = classes

    def train_columns_of(self, dataset: Any) -> dict[str, np.ndarray]:
        """The plain per-sample columns (numbers, strings) of ``dataset`` other than the input column."""
        import datasets

        plain = (datasets.Value, datasets.ClassLabel)
        names = [n for n, f in dataset.features.items() if n != self.input_column and isinstance(f, plain)]
        table = dataset.with_format("numpy")
        return {n: np.asarray(table[n]) for n in names}

    def _inputs(self, dataset: Any, transform: Callable[[Any], Tensor] | None) -> Tensor:
        import datasets

        if transform is None and isinstance(dataset.features[self.input_column], datasets.Image):
            return torch.stack([default_transform(v) for v in dataset[self.input_column]])  # PIL images
        if transform is None:
            return default_transform(dataset.with_format("numpy")[self.input_column])
        return torch.stack([transform(v) for v in dataset[self.input_column]])

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        columns = self.train_columns_of(self._train)
        eval_transform = self.eval_transform or self.transform
        if self.resident:
            self.assign_splits(
                self._inputs(self._train, self.transform),
                _labels(self._train, self.label_column),
                self._inputs(self._test, eval_transform),
                _labels(self._test, self.label_column),
                columns=columns,
            )
            return
        train = HuggingFaceSamples(self._train, self.input_column, self.label_column, self.transform)
        self.test_set = HuggingFaceSamples(self._test, self.input_column, self.label_column, eval_transform)
        self.train_set, self.train_columns = train, columns
        if self.val_fraction > 0:
            held, kept = self.validation_split(len(train))
            val = HuggingFaceSamples(self._train, self.input_column, self.label_column, eval_transform)
            self.val_set = Subset(val, held.tolist())
            self.train_set = Subset(train, kept.tolist())
            self.train_columns = {k: v[kept] for k, v in columns.items()}
