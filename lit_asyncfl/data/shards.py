"""Client shards: where each client's training data lives during a simulation."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

#: Datasets up to this many bytes (inputs + targets) are materialised as resident tensors.
RESIDENT_BYTES_LIMIT = 2 * 1024**3


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
    ) -> None:
        if len(inputs) != len(targets):
            raise ValueError(f"inputs and targets differ in length: {len(inputs)} != {len(targets)}")
        self.device = torch.device(device)
        self.inputs = inputs.to(self.device)
        self.targets = targets.to(self.device)
        self.indices = [torch.as_tensor(np.asarray(i, dtype=np.int64), device=self.device) for i in indices]
        self._sizes = np.array([len(i) for i in indices], dtype=np.int64)
        self.transform = transform

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

    def batches(self, client: int, batch_size: int, generator: torch.Generator) -> Iterator[list[Tensor]]:
        """One epoch of shuffled ``[inputs, targets]`` batches of a client (the last batch may be smaller)."""
        idx = self.indices[client]
        order = idx[torch.randperm(len(idx), generator=generator).to(self.device)]
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            inputs = self.inputs[chunk]
            yield [inputs if self.transform is None else self.transform(inputs, generator), self.targets[chunk]]


class DatasetShards:
    """Client shards read through a ``DataLoader`` over a ``Subset`` (for datasets too large to keep resident).

    Args:
        dataset: The training dataset.
        indices: One array of sample indices per client.
        device: Where batches are moved.
        collate_fn: Collate function of the original training ``DataLoader``, if any.
        transform: ``(inputs, generator) -> inputs`` applied to the first element of every ``[inputs, ...]`` batch
            (see :class:`ClientShards`).
    """

    def __init__(
        self,
        dataset: Dataset,
        indices: Sequence[np.ndarray],
        device: torch.device | str = "cpu",
        collate_fn: Any = None,
        transform: Callable[[Tensor, torch.Generator], Tensor] | None = None,
    ) -> None:
        self.transform = transform
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

    def batches(self, client: int, batch_size: int, generator: torch.Generator) -> Iterator[Any]:
        """One epoch of shuffled batches of a client, moved to the device."""
        loader = DataLoader(
            Subset(self.dataset, self.indices[client].tolist()),
            batch_size=batch_size,
            shuffle=True,
            generator=generator,
            collate_fn=self.collate_fn,
        )
        for batch in loader:
            batch = _to_device(batch, self.device)
            if self.transform is not None:
                if not (isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], Tensor)):
                    raise TypeError("a client transform needs batches of the form [inputs, ...]")
                batch = [self.transform(batch[0], generator), *batch[1:]]
            yield batch


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, Tensor):
        return batch.to(device)
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def dataset_tensors(dataset: Dataset) -> tuple[Tensor, Tensor] | None:
    """The dataset as ``(inputs, targets)`` tensors, or ``None`` when it is not a small (input, label) dataset.

    ``TensorDataset`` (and ``Subset`` of one) is used directly; any other map-style dataset of
    ``(tensor, label)`` pairs is read once, if it fits in :data:`RESIDENT_BYTES_LIMIT`.
    """
    if isinstance(dataset, TensorDataset) and len(dataset.tensors) == 2:
        return dataset.tensors[0], dataset.tensors[1]
    if isinstance(dataset, Subset):
        base = dataset_tensors(dataset.dataset)
        if base is not None:
            idx = torch.as_tensor(list(dataset.indices), dtype=torch.long)
            return base[0][idx], base[1][idx]
        return None
    try:
        n = len(dataset)  # type: ignore[arg-type]
        first = dataset[0]
    except Exception:
        return None
    if not (isinstance(first, (tuple, list)) and len(first) == 2 and isinstance(first[0], Tensor)):
        return None
    label = first[1]
    if not (isinstance(label, (int, float)) or (isinstance(label, Tensor) and label.numel() == 1)):
        return None
    if n * first[0].numel() * first[0].element_size() > RESIDENT_BYTES_LIMIT:
        return None
    items = [dataset[i] for i in range(n)]
    inputs = torch.stack([item[0] for item in items])
    targets = torch.stack([torch.as_tensor(item[1]).reshape(()) for item in items])  # keeps the label dtype
    return inputs, targets


def dataset_targets(dataset: Dataset) -> np.ndarray:
    """Labels of every sample (from ``targets``/``labels`` attributes, tensors, or by reading)."""
    tensors = dataset_tensors(dataset) if isinstance(dataset, (TensorDataset, Subset)) else None
    if tensors is not None:
        return tensors[1].cpu().numpy()
    for attr in ("targets", "labels"):
        if hasattr(dataset, attr):
            return np.asarray(getattr(dataset, attr))
    return np.asarray([np.asarray(dataset[i][1]).item() for i in range(len(dataset))])  # type: ignore[arg-type]
