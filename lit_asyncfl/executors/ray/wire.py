"""The Ray executor's wire format: tensors as they travel between the simulation's process and the workers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.core.update import ClientUpdate


@dataclass
class _Wire:
    """A tensor as it travels between processes: its bytes as a numpy array, its dtype and shape.

    Ray stores and reads numpy arrays without pickling them (out of band, read in place from the object store),
    where a pickled tensor is written into Python bytes and read back through ``torch.load``: a global model and an
    update of SimpleCNN's 300k parameters make a round trip in ~4 ms instead of ~9 ms (driver and worker CPU alike).
    The bytes are the tensor's own, so every dtype (bfloat16 too) arrives bit for bit."""

    data: np.ndarray
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def of(cls, tensor: Tensor) -> _Wire:
        flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        return cls(flat.view(torch.uint8).numpy(), flat.dtype, tuple(tensor.shape))

    def tensor(self) -> Tensor:
        """A tensor of its own (the array read from the object store is read-only and shared)."""
        if self.data.size == 0:  # (a byte view of no bytes cannot be viewed as another dtype)
            return torch.empty(self.shape, dtype=self.dtype)
        return torch.from_numpy(self.data.copy()).view(self.dtype).reshape(self.shape)


#: Where a tensor travels inside its task rather than through Ray's object store, the most bytes a piece holds: Ray
#: inlines a task's argument up to its ``max_direct_call_object_size`` (100 KiB by default; a larger one, as a larger
#: value set by the user, goes to the object store, which is slower but as exact).
PIECE_BYTES = 96 << 10

#: The most bytes of tensors a task carries inside it (in pieces of :data:`PIECE_BYTES`: one start model, or a merge's
#: tensors together; Ray inlines up to ``task_rpc_inlined_bytes_limit``, 10 MiB by default, of a task's arguments);
#: more go to the object store.
INLINE_BYTES = 8 << 20


@dataclass
class _Slot:
    """In a task's argument, a tensor whose bytes travel inside the task, among its last arguments (:func:`_inline`):
    which of those pieces hold it, and its dtype and shape."""

    first: int
    count: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def _inline(tensors: Sequence[Tensor]) -> tuple[list[_Slot | _Wire], list[np.ndarray]]:
    """Tensors as stand-ins in a task's argument, and the pieces (of at most :data:`PIECE_BYTES`) that travel as the
    task's last arguments, inside the task, when all of them fit :data:`INLINE_BYTES` together; else each a
    :class:`_Wire` and no piece (Ray puts an argument over its inline limit in its object store). A put waits for
    Ray's raylet, which creates and seals the object while both cores train: FedASMU's rests, whose merged weights
    and merge jump went so, held the simulation's process 2 ms a task (:func:`_resolved` reads them back).

    Example:
        >>> stand_ins, pieces = _inline([torch.arange(60_000.0), torch.ones(3, dtype=torch.int64)])
        >>> [type(s).__name__ for s in stand_ins], len(pieces)
        (['_Slot', '_Slot'], 4)
        >>> torch.equal(_resolved(stand_ins[0], pieces), torch.arange(60_000.0)), _resolved(stand_ins[1], pieces)
        (True, tensor([1, 1, 1]))
    """
    wires = [_Wire.of(t) for t in tensors]
    if sum(w.data.size for w in wires) > INLINE_BYTES:
        return list(wires), []
    stand_ins: list[_Slot | _Wire] = []
    pieces: list[np.ndarray] = []
    for w in wires:
        mine = [w.data[i : i + PIECE_BYTES] for i in range(0, w.data.size, PIECE_BYTES)]
        stand_ins.append(_Slot(len(pieces), len(mine), w.dtype, w.shape))
        pieces += mine
    return stand_ins, pieces


def _resolved(stand_in: _Slot | _Wire, pieces: Sequence[np.ndarray]) -> Tensor:
    """The tensor of its own that a stand-in of :func:`_inline` stands for (``pieces``: the task's last arguments)."""
    if isinstance(stand_in, _Wire):
        return stand_in.tensor()
    if stand_in.count == 0:
        return torch.empty(stand_in.shape, dtype=stand_in.dtype)
    data = np.concatenate(pieces[stand_in.first : stand_in.first + stand_in.count])  # (a new array: its own)
    return torch.from_numpy(data).view(stand_in.dtype).reshape(stand_in.shape)


def _joined(parts: Sequence[Any]) -> Tensor:
    """The tensor of its own that a task's last arguments carry: a :class:`_Slot` and its pieces (:func:`_inline`), or
    a whole :class:`_Wire` (read from the object store).

    Example:
        >>> stand_ins, pieces = _inline([torch.arange(60_000.0)])
        >>> len(pieces), torch.equal(_joined([*stand_ins, *pieces]), torch.arange(60_000.0))
        (3, True)
    """
    return _resolved(parts[0], parts[1:])


def _portable(update: ClientUpdate) -> tuple[ClientUpdate, _Wire]:
    """The update as it travels back: its weights on the wire, without the start weights (the driver holds them)."""
    weights, update.weights, update.base_weights = update.weights, None, None  # type: ignore[assignment]
    return update, _Wire.of(weights)
