"""Federated data modules: a ``LightningDataModule`` whose training set a partitioner splits into clients."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    default_collate,
)

from lit_asyncfl.checks import check_fraction, check_int
from lit_asyncfl.data.partition import PartitionArg, Partitioner, partition_counts, resolve_partitioner
from lit_asyncfl.data.shards import ClientShards, DatasetShards, dataset_targets, dataset_tensors


def require_files(owner: object, root: str | Path, paths: list[Path], hint: str = "") -> None:
    """Raise a ``FileNotFoundError`` naming the missing files, the resolved root and the ``download=True`` option.

    Example:
        >>> require_files("X", "/nonexistent", [Path("/nonexistent/a")])
        Traceback (most recent call last):
        ...
        FileNotFoundError: X: dataset files not found under /nonexistent: missing ['/nonexistent/a']. ...
    """
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        name = owner if isinstance(owner, str) else type(owner).__name__
        raise FileNotFoundError(
            f"{name}: dataset files not found under {Path(root).resolve()}: missing {missing}. "
            f"{hint or 'Put the dataset there in its standard layout'} or pass download=True "
            f"(--data.init_args.download=true) on a machine with a network."
        )


class ClientTransform:
    """``(inputs, generator) -> model inputs`` of a data module: its ``augment`` then its ``prepare_inputs``.

    A small picklable callable (not a lambda), so client shards can travel to worker processes.
    """

    def __init__(self, datamodule: FederatedDataModule) -> None:
        self.datamodule = datamodule

    def __call__(self, inputs: Tensor, generator: torch.Generator) -> Tensor:
        return self.datamodule.prepare_inputs(self.datamodule.augment(inputs, generator))


#: Defaults of the federated split, shared by the data modules' signatures.
PARTITION = "iid"
EVAL_BATCH_SIZE = 512
VAL_FRACTION = 0.0
SPLIT_SEED = 42


class FederatedDataModule(L.LightningDataModule):
    """Base class: subclasses set ``train_set``, ``test_set`` and optionally ``val_set`` in :meth:`setup`.

    Validation (the accuracy curve during ``fit``) uses ``val_set`` when there is one, else the test split, as the
    papers report test accuracy over time.

    The training inputs may be stored compactly (e.g. ``uint8`` images): :meth:`prepare_inputs` turns stored
    inputs into model inputs (e.g. normalisation) and is applied once to evaluation and server data, and per batch
    to clients' data, after :meth:`augment` (random, e.g. crops and flips; drawn from the job's generator).
    ``train_groups`` (one client id per training sample) carries a naturally federated dataset's own clients
    for ``partition="natural"``; ``train_columns`` (per-sample columns such as a writer id) are what
    ``Natural(column=...)`` and Flower Datasets partitioners read. After :meth:`client_shards`, ``partition_counts``
    holds the samples per client and class.

    Args:
        partition: ``"iid"``, ``"dirichlet"``, ``"shards"``, ``"pathological"``, ``"quantity"``, a
            :class:`~lit_asyncfl.data.partition.Partitioner`, or a Flower Datasets partitioner (see
            :class:`~lit_asyncfl.data.FlowerPartitioner`).
        alpha: Dirichlet concentration for ``partition="dirichlet"`` (default 0.5); an error with other partitions.
        batch_size: Local mini-batch size of clients.
        eval_batch_size: Batch size of global evaluation.
        val_fraction: Fraction of the training data held out for validation (0: validate on the test split).
        split_seed: Seed of the held-out splits (independent of the run seed, so every run sees the same ones).
    """

    def __init__(
        self,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        batch_size: int = 10,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        val_fraction: float = VAL_FRACTION,
        split_seed: int = SPLIT_SEED,
    ) -> None:
        super().__init__()
        check_int("batch_size", batch_size, 1)
        check_int("eval_batch_size", eval_batch_size, 1)
        check_fraction("val_fraction", val_fraction, open_max=True)
        check_int("split_seed", split_seed, 0, maximum=2**32 - 1)
        self.val_fraction = val_fraction
        self.split_seed = split_seed
        self.partitioner = resolve_partitioner(partition, alpha)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        #: Collate function for clients' batches when the training set cannot be kept as tensors.
        self.collate_fn: Any = None
        #: Labelled data held out of the clients' training data for the server (e.g. FedADT's distillation set).
        self.server_set: TensorDataset | None = None
        #: Each training sample's client id, for datasets generated per client (``partition="natural"``).
        self.train_groups: np.ndarray | None = None
        #: Per-sample columns of the training set (name -> one value per sample), for partitions by a column.
        self.train_columns: dict[str, np.ndarray] | None = None
        #: Samples per client and class of the last :meth:`client_shards` split.
        self.partition_counts: np.ndarray | None = None
        #: Drop each client epoch's last incomplete batch (a wrapped ``DataLoader``'s ``drop_last``).
        self.drop_last = False
        #: Shuffle each client epoch (``False``: a wrapped ``DataLoader(shuffle=False)``; each client's shard in order).
        self.shuffle = True
        #: ``sample -> label`` for label-based partitions of datasets without ``targets`` (``None``: found).
        self.label_fn: Any = None
        self._full_train_set: Dataset | None = None
        self._full_train_groups: np.ndarray | None = None
        self._full_train_columns: dict[str, np.ndarray] | None = None

    def _require(self, name: str) -> Dataset:
        dataset = getattr(self, name)
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}.{name} is not set: call setup() first")
        return dataset

    def check_model(self, model: L.LightningModule) -> None:
        """Raise a ``ValueError`` before training when ``model`` cannot take this data (nothing to check here)."""

    def prepare_inputs(self, inputs: Tensor) -> Tensor:
        """Stored inputs to model inputs (deterministic; identity unless the data is stored compactly)."""
        return inputs

    def augment(self, inputs: Tensor, generator: torch.Generator) -> Tensor:
        """Random training-time transform of a client batch of stored inputs (identity by default)."""
        return inputs

    def client_transform(self) -> ClientTransform | None:
        """The per-batch transform of clients' stored inputs, or ``None`` when both hooks are the identity."""
        own = type(self)
        if own.prepare_inputs is FederatedDataModule.prepare_inputs and own.augment is FederatedDataModule.augment:
            return None
        return ClientTransform(self)

    def assign_splits(
        self,
        x_train: Tensor,
        y_train: Tensor,
        x_test: Tensor,
        y_test: Tensor,
        groups: np.ndarray | None = None,
        columns: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Set ``train_set``, ``test_set`` and, when ``val_fraction > 0``, a random ``val_set`` held out of the
        training data (drawn with ``split_seed``). Evaluation inputs pass through :meth:`prepare_inputs`;
        ``groups`` (optional) gives each training sample's client for ``partition="natural"``, ``columns``
        (optional) per-sample columns for partitions by a column."""
        if self.val_fraction > 0:
            held, kept = self.validation_split(len(y_train))
            val, train = torch.as_tensor(held), torch.as_tensor(kept)
            self.val_set = TensorDataset(self.prepare_inputs(x_train[val]), y_train[val])
            x_train, y_train = x_train[train], y_train[train]
            groups = None if groups is None else np.asarray(groups)[kept]
            columns = None if columns is None else {k: np.asarray(v)[kept] for k, v in columns.items()}
        self.train_set = TensorDataset(x_train, y_train)
        self.test_set = TensorDataset(self.prepare_inputs(x_test), y_test)
        self.train_groups = None if groups is None else np.asarray(groups, dtype=np.int64)
        self.train_columns = columns

    def validation_split(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``(held-out, kept)`` positions of ``n`` training samples: a random ``val_fraction`` of them (drawn with
        ``split_seed``) is held out for validation."""
        order = np.random.default_rng(self.split_seed).permutation(n)
        n_val = round(self.val_fraction * n)
        return order[:n_val], order[n_val:]

    def train_dataloader(self) -> DataLoader:
        """Shuffled batches of the (pooled) training set, as model inputs (for a centralised baseline)."""
        collate = None if self.client_transform() is None else self._collate_prepared
        return DataLoader(self._require("train_set"), batch_size=self.batch_size, shuffle=True, collate_fn=collate)

    def _collate_prepared(self, samples: list[Any]) -> list[Tensor]:
        inputs, targets = default_collate(samples)
        return [self.prepare_inputs(inputs), targets]

    def val_dataloader(self) -> DataLoader:
        dataset = self.val_set if self.val_set is not None else self._require("test_set")
        return DataLoader(dataset, batch_size=self.eval_batch_size)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self._require("test_set"), batch_size=self.eval_batch_size)

    def split_server_data(self, fraction: float, seed: int) -> TensorDataset | None:
        """Hold out a random ``fraction`` of the training data for the server, before the clients' partition.

        The held-out samples leave ``train_set`` (so no client and no evaluation sees them) and become
        ``server_set``. Calling it again re-splits from the full training set. Returns ``server_set``.
        """
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"server data fraction must be in [0, 1), got {fraction}")
        if self._full_train_set is None:
            self._full_train_set = self._require("train_set")
            self._full_train_groups = self.train_groups
            self._full_train_columns = self.train_columns
        self.train_set, self.server_set = self._full_train_set, None
        self.train_groups = self._full_train_groups
        self.train_columns = self._full_train_columns
        if fraction == 0.0:
            return None
        tensors = dataset_tensors(self._full_train_set)
        if tensors is None:
            raise ValueError(
                f"{type(self).__name__}: server data (e.g. FedADT's distillation set) is held out of a training set "
                f"of tensors, got a {type(self._full_train_set).__name__}; give the data module a "
                "TensorDataset(inputs, labels) as its training set"
            )
        x, y = tensors
        order = np.random.default_rng([seed, 0x5E4]).permutation(len(y))
        k = max(1, round(fraction * len(y)))
        held, rest = np.sort(order[:k]), np.sort(order[k:])
        self.server_set = TensorDataset(self.prepare_inputs(x[held]), y[held])
        self.train_set = TensorDataset(x[rest], y[rest])
        if self.train_groups is not None:
            self.train_groups = self.train_groups[rest]
        if self.train_columns is not None:
            self.train_columns = {k: v[rest] for k, v in self.train_columns.items()}
        return self.server_set

    def client_shards(
        self,
        num_clients: int,
        seed: int,
        device: torch.device | str = "cpu",
        slowness: np.ndarray | None = None,
    ) -> ClientShards | DatasetShards:
        """Split the training set among ``num_clients`` clients with the partitioner, seeded by ``seed``
        (``slowness``: each client's device slowness, for partitions that place data by speed)."""
        train = self._require("train_set")
        shards, labels = split_dataset(
            train,
            self.partitioner,
            num_clients,
            seed,
            device,
            self.collate_fn,
            slowness,
            groups=self.train_groups,
            transform=self.client_transform(),
            drop_last=self.drop_last,
            label_fn=self.label_fn,
            columns=self.train_columns,
            shuffle=self.shuffle,
        )
        self.partition_counts = partition_counts(
            labels if labels is not None else np.zeros(len(train), dtype=np.float64),  # type: ignore[arg-type]
            shards.indices_numpy(),
            getattr(self, "num_classes", None),
        )
        return shards


def split_dataset(
    dataset: Dataset,
    partitioner: Partitioner,
    num_clients: int,
    seed: int,
    device: torch.device | str = "cpu",
    collate_fn: Any = None,
    slowness: np.ndarray | None = None,
    groups: np.ndarray | None = None,
    transform: Any = None,
    drop_last: bool = False,
    label_fn: Any = None,
    columns: dict[str, np.ndarray] | None = None,
    shuffle: bool = True,
) -> tuple[ClientShards | DatasetShards, np.ndarray | None]:
    """Partition ``dataset``: resident tensors for a static tensor dataset, else read through a ``DataLoader`` at
    every draw (``transform``: the per-batch transform of resident inputs, see :class:`ClientShards`; ``columns``:
    per-sample columns for partitions by a column). Returns the shards and the samples' labels (``None`` when the
    partition needs none and the dataset has none)."""
    rng = np.random.default_rng([seed, 0x9A27])  # a stream of its own: the split does not move other draws
    static = collate_fn is None or collate_fn is default_collate  # a user collate_fn runs at every batch
    tensors = dataset_tensors(dataset) if label_fn is None and static else None
    if tensors is not None:
        labels: np.ndarray | None = tensors[1].cpu().numpy()
    elif partitioner.needs_labels:
        labels = dataset_targets(dataset, label_fn)
    else:  # labels only describe the split (partition.csv): never read every sample for them
        try:
            labels = dataset_targets(dataset, label_fn, read_samples=label_fn is not None)
        except ValueError:
            labels = None
    n = len(dataset)  # type: ignore[arg-type]
    indices = partitioner(labels if labels is not None else np.zeros(n, dtype=np.int64), num_clients, rng, slowness,
                          groups, columns)  # fmt: skip
    if tensors is None and static and dataset_tensors(dataset) is not None:  # a label function over tensors
        tensors = dataset_tensors(dataset)
    if tensors is not None:
        return ClientShards(tensors[0], tensors[1], indices, device, transform, drop_last, shuffle), labels
    return DatasetShards(dataset, indices, device, collate_fn, transform, drop_last, shuffle), labels


def loader_shuffles(loader: DataLoader) -> bool:
    """Whether a training ``DataLoader`` shuffles, read from its sampler: ``shuffle=True`` (a ``RandomSampler``)
    gives each client job a seeded shuffle of the client's shard per epoch, ``shuffle=False`` (a
    ``SequentialSampler``) each client's shard in dataset order every epoch. Any other sampler is refused: the
    clients' batches cannot follow it.

    Example:
        >>> data = TensorDataset(torch.zeros(4, 1))
        >>> loader_shuffles(DataLoader(data, shuffle=True)), loader_shuffles(DataLoader(data))
        (True, False)
    """
    if isinstance(loader.dataset, IterableDataset):
        raise ValueError(
            f"the training DataLoader's dataset {type(loader.dataset).__name__} is an IterableDataset, which cannot be "
            "split into clients; give a map-style dataset (with __len__ and __getitem__)"
        )
    sampler = loader.sampler
    if type(sampler) is SequentialSampler:
        return False
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None:
        return True
    raise ValueError(
        f"the training DataLoader's sampler {type(sampler).__name__} cannot be followed per client (its dataset is "
        "split into the clients, each iterating its own shard); use shuffle=True (a seeded shuffle of each client's "
        "shard per epoch) or shuffle=False (each client's shard in order)"
    )


class PartitionedDataModule(FederatedDataModule):
    """Make any ``LightningDataModule`` federated: its training set is split among clients by a partitioner.

    Args:
        datamodule: The user's data module (its ``train_dataloader().dataset`` is partitioned, in batches of that
            loader's ``batch_size``, with its ``collate_fn``, ``drop_last`` and ``shuffle`` (see
            :func:`loader_shuffles`); its validation and test loaders are
            used as they are).
        partition: See :class:`FederatedDataModule`.
        alpha: Dirichlet concentration.
        labels: ``sample -> label`` for label-based partitions when the dataset has no ``targets``/``labels``
            attribute and its samples are neither ``(input, label)`` pairs nor dicts with a ``label`` key.

    Example:
        >>> from torch.utils.data import TensorDataset
        >>> class Tiny(L.LightningDataModule):
        ...     def train_dataloader(self):
        ...         return DataLoader(TensorDataset(torch.randn(20, 3), torch.arange(20) % 2), batch_size=4)
        >>> dm = PartitionedDataModule(Tiny(), partition="iid")
        >>> dm.setup("fit")
        >>> dm.client_shards(num_clients=4, seed=0).num_samples(0)
        5
    """

    def __init__(
        self,
        datamodule: L.LightningDataModule,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        labels: Any = None,
    ) -> None:
        super().__init__(partition=partition, alpha=alpha)
        if labels is not None and not callable(labels):
            raise ValueError(f"labels must be a function sample -> label, or None, got {labels!r}")
        self.datamodule = datamodule
        self.label_fn = labels

    def prepare_data(self) -> None:
        self.datamodule.prepare_data()

    def setup(self, stage: str) -> None:
        self.datamodule.setup(stage)
        if stage == "fit":
            loader = self.datamodule.train_dataloader()
            self.train_set = loader.dataset
            self.batch_size = loader.batch_size or self.batch_size
            self.drop_last = bool(loader.drop_last)
            self.shuffle = loader_shuffles(loader)
            inner = self.datamodule
            # a federated inner module's loader prepares inputs; the clients' transform does that here instead
            self.collate_fn = inner.collate_fn if isinstance(inner, FederatedDataModule) else loader.collate_fn

    def check_model(self, model: L.LightningModule) -> None:
        if isinstance(self.datamodule, FederatedDataModule):
            self.datamodule.check_model(model)

    def prepare_inputs(self, inputs: Tensor) -> Tensor:
        inner = self.datamodule
        return inner.prepare_inputs(inputs) if isinstance(inner, FederatedDataModule) else inputs

    def client_transform(self) -> ClientTransform | None:
        inner = self.datamodule
        return inner.client_transform() if isinstance(inner, FederatedDataModule) else None

    def val_dataloader(self) -> Any:
        return self.datamodule.val_dataloader()

    def test_dataloader(self) -> Any:
        return self.datamodule.test_dataloader()
