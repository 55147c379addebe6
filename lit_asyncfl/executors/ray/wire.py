"""The Ray executor's wire format: tensors as they travel between the simulation's process and the workers."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.core.update import ClientUpdate

try:
    import fcntl
except ImportError:  # pragma: no cover (not Unix: no shared memory directory either)
    fcntl = None  # type: ignore[assignment]


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


def _resolved(stand_in: _Slot | _Wire | _Shared, pieces: Sequence[np.ndarray]) -> Tensor:
    """The tensor of its own that a stand-in of :func:`_inline` stands for (``pieces``: the task's last arguments; a
    :class:`_Wire` or a :class:`_Shared` stands for itself)."""
    if isinstance(stand_in, (_Wire, _Shared)):
        return stand_in.tensor()
    if stand_in.count == 0:
        return torch.empty(stand_in.shape, dtype=stand_in.dtype)
    data = np.concatenate(pieces[stand_in.first : stand_in.first + stand_in.count])  # (a new array: its own)
    return torch.from_numpy(data).view(stand_in.dtype).reshape(stand_in.shape)


def _joined(parts: Sequence[Any]) -> Tensor:
    """The tensor of its own that a task's last arguments carry: a :class:`_Slot` and its pieces (:func:`_inline`), a
    whole :class:`_Wire` (read from the object store) or a :class:`_Shared` (read from its file).

    Example:
        >>> stand_ins, pieces = _inline([torch.arange(60_000.0)])
        >>> len(pieces), torch.equal(_joined([*stand_ins, *pieces]), torch.arange(60_000.0))
        (3, True)
    """
    return _resolved(parts[0], parts[1:])


def _portable(update: ClientUpdate, files: _SharedFiles | None = None) -> tuple[ClientUpdate, _Wire | _Shared]:
    """The update as it travels back: its weights on the wire (in a file of ``files``, where the worker shares the
    simulation's node), without the start weights (the driver holds them)."""
    weights, update.weights, update.base_weights = update.weights, None, None  # type: ignore[assignment]
    return update, _read_once(weights, files)


#: Where processes on one node hand each other tensors as files (Linux's shared memory, a tmpfs); ``None``: nowhere
#: (every tensor goes through Ray: inside its task, or its object store).
SHARED_MEMORY: str | None = "/dev/shm"


@dataclass
class _Shared:
    """A tensor whose bytes wait in a file in shared memory (:class:`_SharedFiles`) for a process on the same node:
    its path, dtype and shape. ``taken``: the reader removes the file once read (a worker's result, a rest's merge);
    else the writer does (a start model that several tasks read)."""

    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    taken: bool

    def tensor(self) -> Tensor:
        """A tensor of its own, read from the file (removed after, if ``taken``)."""
        out = torch.empty(self.shape, dtype=self.dtype)
        size = out.numel() * out.element_size()
        if size:
            with open(self.path, "rb") as file:
                read = file.readinto(memoryview(out.reshape(-1).view(torch.uint8).numpy()))
            if read != size:
                raise OSError(f"{self.path} held {read} bytes of a tensor of {size} bytes")
        if self.taken:
            self.discard()
        return out

    def discard(self) -> None:
        """Remove the file (once the tensor is read, or will never be)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _SharedFiles:
    """A run's directory in shared memory (:data:`SHARED_MEMORY`), through which the Ray workers on the simulation's
    node and the simulation's process hand each other tensors: a single job's start model, the server's answer to a
    request, a merge's tensors and the workers' results go as files, read and written with one copy each, where Ray
    would serialize them into a task (up to ~1 ms of this process's time for a start model of 1.2 MB) or put them in
    its object store (a round trip through its raylet, which waits for a core while both cores train). Workers on
    other nodes do not see the directory (:meth:`attach` checks a token written in it) and keep Ray's routes; so does
    every tensor once a write failed (shared memory full: :meth:`write`). Each process names its files with a random
    prefix of its own and creates them exclusively, so that processes whose ids coincide (containers sharing
    ``/dev/shm``) never write the same file. The run's process holds a lock on the token file while the directory
    lives: :meth:`create` removes the directories of runs whose process ended without removing theirs (killed).

    Example:
        >>> files = _SharedFiles.create()
        >>> shared = files.write(torch.arange(6.0).reshape(2, 3), taken=True)
        >>> shared.tensor()
        tensor([[0., 1., 2.],
                [3., 4., 5.]])
        >>> os.path.exists(shared.path)  # taken: removed once read
        False
        >>> files.remove()
    """

    def __init__(self, directory: str, token: str) -> None:
        self.directory, self.token = directory, token
        self.full = False  # a write failed: every later tensor goes through Ray
        self._prefix = secrets.token_hex(6)
        self._names = itertools.count()
        self._removal: Any = None  # (the creating process's: removes the directory once, at remove() or exit)

    @classmethod
    def create(cls) -> _SharedFiles | None:
        """A new directory in shared memory (``None`` where there is none: not Linux, or not writable), after removing
        those that killed runs left."""
        if SHARED_MEMORY is None or fcntl is None or not os.path.isdir(SHARED_MEMORY):
            return None
        _remove_abandoned(SHARED_MEMORY)
        directory = lock = None
        try:
            directory = tempfile.mkdtemp(prefix=_PREFIX, dir=SHARED_MEMORY)
            token = secrets.token_hex(8)
            lock = open(os.path.join(directory, "token-"), "w")  # (held open and locked for the run)
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.write(token)
            lock.flush()
            os.rename(lock.name, os.path.join(directory, "token"))  # (seen by others only once locked)
        except OSError:
            if directory is not None:
                _remove(directory, lock)
            return None
        files = cls(directory, token)
        files._removal = weakref.finalize(files, _remove, directory, lock)  # (or at exit, if the run never stops)
        return files

    @classmethod
    def attach(cls, at: tuple[str, str] | None) -> _SharedFiles | None:
        """Another process's view of a directory made by :meth:`create` (``at``: its :attr:`at`), or ``None`` where
        this process does not see it (another node)."""
        if at is None:
            return None
        try:
            with open(os.path.join(at[0], "token")) as file:
                if file.read() != at[1]:
                    return None
        except OSError:
            return None
        return cls(*at)

    @property
    def at(self) -> tuple[str, str]:
        """The directory and its token (what :meth:`attach` takes)."""
        return self.directory, self.token

    def write(self, tensor: Tensor, taken: bool) -> _Shared | _Wire:
        """The tensor in a file of its own (a :class:`_Wire`, Ray's route, where it cannot be written: then every
        later one too, rather than fill shared memory again at each task)."""
        wire = _Wire.of(tensor)
        if self.full:
            return wire
        path = os.path.join(self.directory, f"{self._prefix}-{next(self._names)}")
        try:
            with open(path, "xb") as file:
                file.write(memoryview(wire.data))
        except OSError:  # (shared memory full, or the run's directory gone: the run stopped)
            self.full = True
            with contextlib.suppress(OSError):
                os.unlink(path)
            return wire
        return _Shared(path, wire.dtype, wire.shape, taken)

    def remove(self) -> None:
        """Remove the directory and every file left in it (the run is over; a file a worker writes meanwhile goes to
        nowhere: the directory is renamed first)."""
        if self._removal is not None:
            self._removal()  # (once: a finalizer)
        else:
            _remove(self.directory)


#: The names of the runs' directories in shared memory.
_PREFIX = "lit_asyncfl-"


def _remove(directory: str, lock: Any = None) -> None:
    """Remove a run's directory: renamed first, so that no file is created in it meanwhile, then removed."""
    gone = f"{directory}-removed"
    try:
        os.rename(directory, gone)
    except OSError:
        gone = directory
    shutil.rmtree(gone, ignore_errors=True)
    if lock is not None:
        lock.close()


def _remove_abandoned(shared_memory: str) -> None:
    """Remove the directories of runs whose process is gone (killed: its lock on the token file went with it)."""
    try:
        names = [n for n in os.listdir(shared_memory) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        directory = os.path.join(shared_memory, name)
        try:
            with open(os.path.join(directory, "token")) as token:
                fcntl.flock(token, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # (held: BlockingIOError; being created or removed: no token file; left alone)
            continue
        _remove(directory)


def _read_once(tensor: Tensor, files: _SharedFiles | None) -> _Wire | _Shared:
    """A tensor the other process reads once (a worker's result, the server's answer, a merge's tensors): in a file
    of ``files``, which its reader removes, else on Ray's wire."""
    return _Wire.of(tensor) if files is None else files.write(tensor, taken=True)


def _dropped(value: Any) -> None:
    """Remove the files of the tensors a task sent back that nobody will read (its jobs were cancelled)."""
    if isinstance(value, _Shared):
        if value.taken:
            value.discard()
    elif isinstance(value, (list, tuple)):
        for item in value:
            _dropped(item)
