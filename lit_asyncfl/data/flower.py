"""Flower Datasets partitioners as lit_asyncfl partitioners (optional extra: ``pip install 'lit-asyncfl[flower]'``).

Any ``flwr_datasets.partitioner.Partitioner`` that splits samples (IID, Dirichlet, InnerDirichlet, Shard,
Pathological, Linear/Square/Exponential sizes, NaturalId, GroupedNaturalId, Continuous, Distribution, Size, ...)
becomes the partition of a data module: partition ``i`` is client ``i``.
"""

from __future__ import annotations

import copy
import inspect
import warnings
from typing import Any

import numpy as np

from lit_asyncfl.data.partition import FlowerPartitionerLike, Partitioner

#: The column of row positions added to the table a Flower partitioner splits (read back from each partition).
INDEX_COLUMN = "__lit_asyncfl_row__"
#: Flower partitioners that split features, not samples (vertical federated learning).
VERTICAL = ("VerticalEvenPartitioner", "VerticalSizePartitioner")


def _settings(partitioner: Any) -> dict[str, Any]:
    """A Flower partitioner's constructor arguments, read back from its ``_<name>`` attributes (plain values only)."""
    out: dict[str, Any] = {}
    for name in list(inspect.signature(type(partitioner).__init__).parameters)[1:]:  # not self
        value = getattr(partitioner, f"_{name}", getattr(partitioner, name, None))
        if isinstance(value, (np.ndarray, np.generic)) and value.size <= 64:
            value = value.tolist()
        if value is None or isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str)) for v in value):
            out[name] = list(value)
    return out


class FlowerPartitioner(Partitioner):
    """A Flower Datasets partitioner (``flwr_datasets.partitioner.Partitioner``) as the partition of a data module.

    Its partitions become the clients: client ``i`` holds partition ``i``, with the very indices the partitioner
    gives when called directly on the same rows, drawn with its own ``seed`` (as Flower draws them; the run's seed
    does not move them). It splits a table of the training set's per-sample columns: a Hugging Face data source's
    own columns (all but the input column; see :class:`~lit_asyncfl.data.HuggingFaceDataModule`), and for any other
    data module the labels as column ``"label"`` — so ``partition_by="label"`` works everywhere. ``num_clients``
    must equal its ``num_partitions`` (for ``NaturalIdPartitioner``, the number of distinct ids). Refused at fit
    start: an empty partition, a partitioner that already has a dataset (pass a fresh one), and the vertical
    partitioners (they split features; lit_asyncfl's clients hold samples). Samples in no partition (e.g.
    ``ShardPartitioner(keep_incomplete_shard=False)``, ``PathologicalPartitioner``'s unused classes) train no
    client, as in Flower, with a warning naming how many.

    Passing a Flower partitioner as ``partition=`` wraps it in this class; on the CLI or in YAML, give its
    ``class_path`` as the data module's ``partition`` (``flwr_datasets.partitioner.DirichletPartitioner`` with its
    ``init_args``).

    Args:
        partitioner: The Flower Datasets partitioner (not yet given a dataset).

    Example:
        >>> import pytest; _ = pytest.importorskip("flwr_datasets")
        >>> from flwr_datasets.partitioner import IidPartitioner
        >>> parts = FlowerPartitioner(IidPartitioner(num_partitions=3))(np.zeros(7), 3, np.random.default_rng(0))
        >>> [p.tolist() for p in parts]
        [[0, 1, 2], [3, 4], [5, 6]]
    """

    def __init__(self, partitioner: Any) -> None:
        if not isinstance(partitioner, FlowerPartitionerLike) or isinstance(partitioner, Partitioner):
            raise TypeError(
                f"FlowerPartitioner wraps a flwr_datasets.partitioner.Partitioner, got {type(partitioner).__name__}; "
                "a lit_asyncfl Partitioner is passed as partition= directly"
            )
        name = type(partitioner).__name__
        if name in VERTICAL:
            raise ValueError(
                f"{name} splits features (vertical federated learning); lit_asyncfl's clients hold samples: use a "
                "horizontal partitioner (IidPartitioner, DirichletPartitioner, NaturalIdPartitioner, ...)"
            )
        assigned = getattr(partitioner, "is_dataset_assigned", None)
        if callable(assigned) and assigned():
            raise ValueError(
                f"{name} already has a dataset assigned: pass a fresh partitioner; the data module gives it its "
                "training set"
            )
        self.partitioner = partitioner
        #: Its constructor arguments (plain values), for the run's record and ``repr``.
        self.settings = _settings(partitioner)

    @property
    def needs_columns(self) -> bool:  # type: ignore[override]
        return True

    def split_by_columns(
        self, targets: np.ndarray, columns: dict[str, np.ndarray], num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        import datasets

        name = type(self.partitioner).__name__
        column = self.settings.get("partition_by")
        if isinstance(column, str) and column not in columns:
            raise ValueError(
                f"{name} partitions by column {column!r}, which the training set lacks; its columns: "
                f"{sorted(columns)} (the labels are 'label' unless the dataset names its own)"
            )
        partitioner = copy.deepcopy(self.partitioner)  # a fresh one per split: the same partitions every time
        partitioner.dataset = datasets.Dataset.from_dict({INDEX_COLUMN: np.arange(len(targets)), **columns})
        num_partitions = int(partitioner.num_partitions)
        if num_partitions != num_clients:
            raise ValueError(
                f"{name} makes {num_partitions} partitions but num_clients={num_clients}: set num_clients="
                f"{num_partitions} (partition i is client i), or num_partitions={num_clients}"
            )
        parts = [np.asarray(partitioner.load_partition(i)[INDEX_COLUMN], np.int64) for i in range(num_clients)]
        used = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if len(np.unique(used)) != len(used):
            raise ValueError(f"{name} gives some samples to several partitions; each sample must go to one client")
        if len(used) < len(targets):
            warnings.warn(
                f"{len(targets) - len(used)} of the {len(targets)} training samples are in no partition of {name} "
                "(as Flower Datasets splits them): they train no client",
                stacklevel=2,
            )
        return parts

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"FlowerPartitioner({type(self.partitioner).__name__}({args}))"
