"""Client shards: where each client's training data lives during a simulation."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset, default_collate

#: Keys under which a dict sample's label is looked for (label-based partitions).
LABEL_KEYS = ("label", "labels", "target", "targets", "y")


def steps_per_epoch(num_samples: int, batch_size: int, drop_last: bool = False) -> int:
    """Local steps in one epoch over ``num_samples`` samples, as a ``DataLoader`` with ``drop_last`` counts them.

    Example:
        >>> steps_per_epoch(25, 10), steps_per_epoch(25, 10, drop_last=True)
        (3, 2)
    """
    return num_samples // batch_size if drop_last else -(-num_samples // batch_size)


class ClientShards:
    """All clients' training data as two resident tensors plus one index tensor per client.

    Batches are gathered by index from the resident tensors, so no ``DataLoader`` runs per client, and memory
    does not grow with the number of clients beyond their index lists. Inputs may be stored compactly (e.g.
    ``uint8`` images) and turned into model inputs per batch by ``transform`` (normalisation, augmentation).

    Args:
        inputs: All training inputs, first dimension = samples.
        targets: All training targets.
        indices: One array of sample indices per client.
        device: Where the tensors live during training.
        transform: ``(inputs, generator) -> inputs`` applied to every gathered batch, drawing any randomness
            (e.g. random crops) from the job's generator so runs stay reproducible.
        drop_last: Drop each epoch's last incomplete batch (as the user's ``DataLoader(drop_last=True)``).
        shuffle: Shuffle each epoch from the job's generator (``False``: every epoch iterates the client's shard in
            dataset order, as the user's ``DataLoader(shuffle=False)`` iterates under ``lightning.Trainer``).

    Example:
        >>> shards = ClientShards(torch.arange(6.0).view(6, 1), torch.arange(6), [np.array([0, 1, 2]), np.array([5])])
        >>> shards.num_samples(0), shards.num_clients
        (3, 2)
        >>> g = torch.Generator().manual_seed(0)
        >>> [b[1].tolist() for b in shards.batches(1, batch_size=2, generator=g)]
        [[5]]
    """

    def __init__(
        self,
        inputs: Tensor,
        targets: Tensor,
        indices: Sequence[np.ndarray],
        device: torch.device | str = "cpu",
        transform: Callable[[Tensor, torch.Generator], Tensor] | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"inputs and targets differ in length: {len(inputs)} != {len(targets)}")
        self.device = torch.device(device)
        self.inputs = inputs.to(self.device)
        self.targets = targets.to(self.device)
        self.indices = [torch.as_tensor(np.asarray(i, dtype=np.int64), device=self.device) for i in indices]
        self._sizes = np.array([len(i) for i in indices], dtype=np.int64)
        self.transform = transform
        self.drop_last = drop_last
        self.shuffle = shuffle

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.indices)

    def num_samples(self, client: int) -> int:
        """Number of training samples ``n_i`` of a client."""
        return int(self._sizes[client])

    def indices_numpy(self) -> list[np.ndarray]:
        """Each client's sample indices, as numpy arrays."""
        return [i.cpu().numpy() for i in self.indices]

    def to(self, device: torch.device | str) -> ClientShards:
        """The same shards with their tensors on ``device`` (``self`` when they are there already)."""
        device = torch.device(device)
        if device == self.device:
            return self
        moved = copy.copy(self)
        moved.device, moved.inputs, moved.targets = device, self.inputs.to(device), self.targets.to(device)
        moved.indices = [i.to(device) for i in self.indices]
        return moved

    def batches(self, client: int, batch_size: int, generator: torch.Generator) -> Iterator[list[Tensor]]:
        """One epoch of ``[inputs, targets]`` batches of a client, shuffled unless ``shuffle=False`` (the last batch
        may be smaller, unless ``drop_last``)."""
        for chunk in self.batch_indices(client, batch_size, generator):
            inputs = self.inputs[chunk]
            yield [inputs if self.transform is None else self.transform(inputs, generator), self.targets[chunk]]

    def batch_indices(self, client: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
        """The sample indices of each batch of :meth:`batches` (same draws from ``generator``, made when the first
        index tensor is asked for; without a ``transform`` these are all its draws): :meth:`gather` of an index
        tensor is its batch, so many clients' batches can be gathered at once from stacked index tensors.

        Example:
            >>> shards = ClientShards(torch.arange(6.0).view(6, 1) * 10, torch.arange(6), [np.array([0, 2, 4])])
            >>> chunks = list(shards.batch_indices(0, batch_size=2, generator=torch.Generator().manual_seed(0)))
            >>> [c.tolist() for c in chunks]
            [[4, 0], [2]]
            >>> shards.gather(torch.stack([chunks[0], chunks[0]]))[1].tolist()
            [[4, 0], [4, 0]]
        """
        idx = self.indices[client]
        order = idx[torch.randperm(len(idx), generator=generator).to(self.device)] if self.shuffle else idx
        end = steps_per_epoch(len(order), batch_size, self.drop_last) * batch_size
        yield from order[:end].split(batch_size)  # views, as slices of order (one call for all the batches)

    @property
    def gathers(self) -> bool:
        """Whether a batch is :meth:`gather` of its :meth:`batch_indices` (no ``transform`` drawing per batch)."""
        return self.transform is None

    def gather(self, index: Tensor) -> list[Tensor]:
        """The ``[inputs, targets]`` batch of the samples ``index`` (any shape: ``[samples]`` gives one client's
        batch, ``[clients, samples]`` the clients' batches stacked), without ``transform``."""
        return [self.inputs[index], self.targets[index]]


class DatasetShards:
    """Client shards read from the dataset at every draw: every sample is read (and randomly transformed, e.g. by
    torchvision transforms, from the job's seeded generators) afresh each time a job draws it, as a ``DataLoader``
    with ``num_workers=0`` reads it under ``lightning.Trainer``.

    Args:
        dataset: The training dataset.
        indices: One array of sample indices per client.
        device: Where batches are moved.
        collate_fn: Collate function of the original training ``DataLoader``, if any.
        transform: ``(inputs, generator) -> inputs`` applied to the first element of every ``[inputs, ...]`` batch
            (see :class:`ClientShards`).
        drop_last: Drop each epoch's last incomplete batch.
        shuffle: Shuffle each epoch (see :class:`ClientShards`).
    """

    def __init__(
        self,
        dataset: Dataset,
        indices: Sequence[np.ndarray],
        device: torch.device | str = "cpu",
        collate_fn: Any = None,
        transform: Callable[[Tensor, torch.Generator], Tensor] | None = None,
        drop_last: bool = False,
        shuffle: bool = True,
    ) -> None:
        self.transform = transform
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.dataset = dataset
        self.indices = [np.asarray(i, dtype=np.int64) for i in indices]
        self.device = torch.device(device)
        self.collate_fn = collate_fn

    @property
    def num_clients(self) -> int:
        """Number of clients."""
        return len(self.indices)

    def num_samples(self, client: int) -> int:
        """Number of training samples ``n_i`` of a client."""
        return len(self.indices[client])

    def indices_numpy(self) -> list[np.ndarray]:
        """Each client's sample indices, as numpy arrays."""
        return self.indices

    def to(self, device: torch.device | str) -> DatasetShards:
        """The same shards with batches moved to ``device`` (``self`` when they are moved there already)."""
        device = torch.device(device)
        if device == self.device:
            return self
        moved = copy.copy(self)
        moved.device = device
        return moved

    def batches(self, client: int, batch_size: int, generator: torch.Generator) -> Iterator[Any]:
        """One epoch of batches of a client (shuffled unless ``shuffle=False``), moved to the device: the same order as
        :class:`ClientShards` draws from ``generator`` (so a dataset holding the same tensors gives the same run),
        each sample read with ``dataset[i]`` and the batch made by the loader's ``collate_fn`` (PyTorch's default
        collate otherwise)."""
        idx = self.indices[client]
        order = idx[torch.randperm(len(idx), generator=generator).numpy()] if self.shuffle else idx
        end = steps_per_epoch(len(order), batch_size, self.drop_last) * batch_size
        collate = self.collate_fn if self.collate_fn is not None else default_collate
        for start in range(0, min(end, len(order)), batch_size):
            batch = collate([self.dataset[int(i)] for i in order[start : start + batch_size]])
            batch = move_data_to_device(batch, self.device)  # Lightning's: any structure it moves
            if self.transform is not None:
                if not (isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], Tensor)):
                    raise TypeError("a client transform needs batches of the form [inputs, ...]")
                batch = [self.transform(batch[0], generator), *batch[1:]]
            yield batch


def dataset_tensors(dataset: Dataset) -> tuple[Tensor, Tensor] | None:
    """The dataset as resident ``(inputs, targets)`` tensors when it is static by construction — a two-tensor
    ``TensorDataset`` or a ``Subset`` of one — else ``None``: any other dataset is read through a ``DataLoader`` at
    every draw, so its random transforms are re-drawn as under ``lightning.Trainer`` (never frozen by caching).
    """
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[0], dataset.tensors[1]
    if isinstance(dataset, Subset):
        base = dataset_tensors(dataset.dataset)
        if base is not None:
            idx = torch.as_tensor(list(dataset.indices), dtype=torch.long)
            return base[0][idx], base[1][idx]
    return None


def _sample_label(sample: Any) -> Any:
    if isinstance(sample, dict):
        for key in LABEL_KEYS:
            if key in sample:
                return sample[key]
        raise KeyError(f"no label key among {list(LABEL_KEYS)} (keys: {sorted(sample)})")
    if isinstance(sample, (tuple, list)) and len(sample) >= 2:
        return sample[1]
    raise TypeError(f"a {type(sample).__name__} sample is neither (input, label, ...) nor a dict")


def _label_attribute(dataset: Dataset) -> np.ndarray | None:
    """A ``targets``/``labels`` attribute holding one label per sample (not, e.g., a list of class names)."""
    base, index = (dataset.dataset, np.asarray(dataset.indices)) if isinstance(dataset, Subset) else (dataset, None)
    for attr in ("targets", "labels"):
        values = getattr(base, attr, None)
        if values is not None and len(values) == len(base):  # type: ignore[arg-type]
            values = np.asarray(values.cpu() if isinstance(values, Tensor) else values)
            return values if index is None else values[index]
    return None


def dataset_targets(
    dataset: Dataset, label_fn: Callable[[Any], Any] | None = None, read_samples: bool = True
) -> np.ndarray:
    """Labels of every sample, for label-based partitions: ``label_fn(sample)`` when given, else the dataset's
    ``targets``/``labels`` attribute (one per sample), else (``read_samples``) each sample's second element or its
    ``label``-like key.

    Raises:
        ValueError: No labels can be found; the message says how to give them.
    """
    tensors = dataset_tensors(dataset)
    if tensors is not None and label_fn is None:
        return tensors[1].cpu().numpy()
    if label_fn is None:
        found = _label_attribute(dataset)
        if found is not None:
            return found
        if not read_samples:
            raise ValueError(f"{type(dataset).__name__} has no targets/labels attribute")
    read = label_fn if label_fn is not None else _sample_label
    try:
        labels = [read(dataset[i]) for i in range(len(dataset))]  # type: ignore[arg-type]
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(
            f"cannot find the labels of {type(dataset).__name__} for a label-based partition ({exc}): give it a "
            "targets attribute, or PartitionedDataModule(labels=lambda sample: ...), or use partition='iid'"
        ) from exc
    return np.asarray([np.asarray(label.cpu() if isinstance(label, Tensor) else label).item() for label in labels])
