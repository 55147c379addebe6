"""``ClientStateStore``: tensors that belong to one client and survive between its jobs (MOON's previous local
model, FedDyn's gradient correction, control variates), in memory up to a byte budget and on disk beyond it.

Kept naively, such state is one model copy per client: 10,000 clients x ResNet-20 (270k parameters) is 11 GB. The
store keeps the most recently used entries in memory while their bytes fit ``budget_bytes`` and writes the others
to files; reading an entry back gives the bytes that were put, so where an entry lives never changes a result.

Design (what a checkpoint holds):

* **Immutable, versioned files.** An entry is written to a new file ``<client>_<name>_<generation>.bin`` (its raw
  bytes) and never rewritten; putting a new value supersedes the file. A superseded file is deleted at once unless
  a checkpoint refers to it.
* **Checkpoints hold what is in memory and refer to what is on disk.** :meth:`ClientStateStore.state_dict`
  returns the resident entries as tensors (at most ``budget_bytes``: under the default budget a run's checkpoint is
  self-contained, a copy of it resumes anywhere) and a manifest of the spilled ones: per entry its file, dtype,
  shape, size and CRC-32. Spilled entries are never copied into a checkpoint: a periodic checkpoint of 10,000
  clients' state on disk is a few hundred kB of manifest (copy-on-write: the files of the last two manifests are
  kept while newer values go to new files). The trainer stores the manifest's paths relative to the checkpoint's
  directory (:func:`relative_manifest`), so a run directory can be moved or copied whole and still resumes.
  Without a budget (``budget_bytes=None``) the store never writes files.
* **Resume** reads the manifest: its files are checked for existence and size at once (every missing file is
  named) and by CRC-32 when read; they belong to the checkpoint and are never deleted by the resumed run, which
  writes its own files into its own directory.
* **Disk errors are the run's**: a file that cannot be written or read back raises :class:`ClientStateError`,
  which the simulator never blames on the client whose job was running.
* **Release** (:meth:`ClientStateStore.release`, at the end of a run): memory is freed and the store's files that
  the last checkpoint does not refer to are deleted (those it refers to are part of that checkpoint).

Example:
    >>> import tempfile
    >>> store = ClientStateStore(budget_bytes=16, directory=tempfile.mkdtemp())
    >>> store.put(0, "h", torch.ones(4))        # 16 bytes: resident
    >>> store.put(1, "h", torch.full((4,), 2.0))  # 32 bytes > budget: client 0's entry goes to disk
    >>> store.resident_bytes, store.num_spilled
    (16, 1)
    >>> store.get(0, "h"), store.get(2, "h")
    (tensor([1., 1., 1., 1.]), None)
    >>> store.release()
"""

from __future__ import annotations

import os
import re
import zlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.checks import check, check_int

#: Characters allowed in an entry name (it is part of a file name).
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class ClientStateError(RuntimeError):
    """The per-client state store could not write or read back a file (a full disk, a file changed or deleted):
    a failure of the run's storage, never of the client whose job was running."""


def relative_manifest(state: dict[str, Any], base: str) -> dict[str, Any]:
    """``state`` (of :meth:`ClientStateStore.state_dict`) with its files' paths relative to ``base`` (the
    checkpoint's directory): a run directory moved or copied whole still finds them.

    Example:
        >>> state = {"generation": 1, "tensors": [], "files": [(0, "h", "/run/client_state/0_h_1.bin", "float32",
        ...          [4], 16, 0)]}
        >>> relative_manifest(state, "/run/checkpoints")["files"][0][2]
        '../client_state/0_h_1.bin'
    """
    files = [(c, n, os.path.relpath(p, base), *rest) for c, n, p, *rest in state["files"]]
    return {**state, "files": files}


def resolved_manifest(state: dict[str, Any], base: str) -> dict[str, Any]:
    """The inverse of :func:`relative_manifest` (absolute paths, as checkpoints written before it held, stay)."""
    files = [(c, n, os.path.normpath(os.path.join(base, p)), *rest) for c, n, p, *rest in state["files"]]
    return {**state, "files": files}


@dataclass
class _File:
    """Where an entry's bytes lie on disk."""

    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    crc: int
    owned: bool  # written by this store (may be deleted) or read from a checkpoint (never deleted)


def _raw_bytes(tensor: Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 array (any dtype, bit-exact; empty tensors too)."""
    if tensor.numel() == 0:  # view(torch.uint8) refuses an empty tensor of a wider dtype
        return np.empty(0, dtype=np.uint8)
    return tensor.reshape(-1).view(torch.uint8).numpy()


class ClientStateStore:
    """Per-client tensors by name, resident while they fit ``budget_bytes``, spilled to files beyond it.

    Callbacks use :meth:`get` and :meth:`put`; a client callback declares
    :attr:`~lit_asyncfl.client_callbacks.ClientCallback.uses_client_state` and the trainer hands it the run's store
    as ``client_state`` (see the module docstring for files, checkpoints and release). Tensors are kept on the CPU;
    :meth:`get` returns the stored tensor itself (resident) or a fresh one read from disk: do not modify it in place.

    Args:
        budget_bytes: Bytes of entries kept in memory (least recently used entries are spilled first); ``None``:
            everything stays in memory and no file is ever written.
        directory: Where spilled entries go (a path, or a callable returning it, evaluated at the first write);
            needed when ``budget_bytes`` is set.
    """

    def __init__(self, budget_bytes: int | None = None, directory: str | Callable[[], str] | None = None) -> None:
        check_int("budget_bytes", budget_bytes, 0, optional=True)
        check(
            budget_bytes is None or directory is not None,
            "a ClientStateStore with a budget needs a directory for the entries beyond it",
        )
        self.budget_bytes = budget_bytes
        self._directory = directory
        self._resident: OrderedDict[tuple[int, str], Tensor] = OrderedDict()  # least recently used first
        self._files: dict[tuple[int, str], _File] = {}  # entries with a file holding their current value
        self._dirty: set[tuple[int, str]] = set()  # resident entries whose file (if any) is out of date
        self._pins: list[set[str]] = []  # files of the last two manifests
        self._superseded: set[str] = set()  # owned files no entry uses any more, kept for a pin
        self.resident_bytes = 0
        self.generation = 0
        #: Bytes written to files so far (spills and checkpoint flushes).
        self.bytes_written = 0

    # -- the interface callbacks use ---------------------------------------------------------------------------
    def get(self, client: int, name: str) -> Tensor | None:
        """Client ``client``'s tensor ``name``, or ``None`` if none was put."""
        key = (int(client), name)
        tensor = self._resident.get(key)
        if tensor is not None:
            self._resident.move_to_end(key)
            return tensor
        file = self._files.get(key)
        return None if file is None else self._read(file)

    def put(self, client: int, name: str, tensor: Tensor) -> None:
        """Keep a copy of ``tensor`` (moved to the CPU) as client ``client``'s ``name``."""
        check(isinstance(name, str) and bool(_NAME.match(name)), f"state names are [A-Za-z0-9_.-]+, got {name!r}")
        key = (int(client), name)
        value = tensor.detach().to("cpu", copy=True).contiguous()
        old = self._resident.pop(key, None)
        if old is not None:
            self.resident_bytes -= old.nbytes
        self._drop_file(key)
        self._resident[key] = value
        self._dirty.add(key)
        self.resident_bytes += value.nbytes
        self._evict()

    def __contains__(self, key: tuple[int, str]) -> bool:
        return key in self._resident or key in self._files

    def __len__(self) -> int:
        return len(set(self._resident) | set(self._files))

    @property
    def num_spilled(self) -> int:
        """Entries held on disk only."""
        return sum(1 for key in self._files if key not in self._resident)

    @property
    def directory(self) -> str | None:
        """The directory of this store's files (``None`` before it is known)."""
        if callable(self._directory):
            self._directory = self._directory()
        return self._directory

    # -- spilling -----------------------------------------------------------------------------------------------
    def _evict(self) -> None:
        if self.budget_bytes is None:
            return
        while self.resident_bytes > self.budget_bytes and self._resident:
            key, tensor = next(iter(self._resident.items()))
            if key in self._dirty:
                self._write(key, tensor)
            del self._resident[key]
            self.resident_bytes -= tensor.nbytes

    def _write(self, key: tuple[int, str], tensor: Tensor) -> None:
        directory = self.directory
        assert directory is not None
        os.makedirs(directory, exist_ok=True)
        self.generation += 1
        path = os.path.join(os.path.abspath(directory), f"{key[0]}_{key[1]}_{self.generation}.bin")
        raw = _raw_bytes(tensor)
        try:
            with open(path, "wb") as f:
                f.write(raw.tobytes())
        except OSError as error:
            _remove(path)
            raise ClientStateError(
                f"could not write client state to {path}: {error}; the run's disk failed, not a client (free space "
                "under the log dir, or raise client_state_budget so that less state spills to disk)"
            ) from error
        self._drop_file(key)
        self._files[key] = _File(path, tensor.dtype, tuple(tensor.shape), raw.size, zlib.crc32(raw), owned=True)
        self._dirty.discard(key)
        self.bytes_written += raw.size

    def _read(self, file: _File) -> Tensor:
        try:
            raw = np.fromfile(file.path, dtype=np.uint8)
        except OSError as error:
            raise ClientStateError(f"could not read client state file {file.path}: {error}") from error
        if raw.size != file.nbytes or zlib.crc32(raw) != file.crc:
            raise ClientStateError(
                f"client state file {file.path} does not hold what was written ({raw.size} bytes, expected "
                f"{file.nbytes}, or a CRC-32 mismatch): it was changed or truncated after its checkpoint"
            )
        if raw.size == 0:
            return torch.empty(file.shape, dtype=file.dtype)
        return torch.from_numpy(raw).view(file.dtype).reshape(file.shape)

    def _drop_file(self, key: tuple[int, str]) -> None:
        """The entry's file no longer holds its value: delete it unless a checkpoint refers to it."""
        file = self._files.pop(key, None)
        if file is None or not file.owned:
            return
        if any(file.path in pin for pin in self._pins):
            self._superseded.add(file.path)
        else:
            _remove(file.path)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The store at this moment: the resident entries as tensors (at most the budget's bytes) and a manifest of
        the spilled ones' files (absolute paths; see :func:`relative_manifest`)."""
        # not cloned: the store never changes a tensor in place (put keeps a new copy)
        tensors = [(c, n, t) for (c, n), t in self._resident.items()]
        files = [
            (c, n, f.path, str(f.dtype).removeprefix("torch."), list(f.shape), f.nbytes, f.crc)
            for (c, n), f in self._files.items()
            if (c, n) not in self._resident
        ]
        self._pins = [*self._pins[-1:], {f[2] for f in files}]
        for path in [p for p in self._superseded if not any(p in pin for pin in self._pins)]:
            self._superseded.discard(path)
            _remove(path)
        return {"generation": self.generation, "tensors": tensors, "files": files}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state of :meth:`state_dict`; the files it names are checked now (existence, size) and by
        CRC-32 when read, and never deleted by this store."""
        self._clear()
        self.generation = int(state["generation"])
        wrong = []
        for _, _, path, _, _, nbytes, _ in state["files"]:
            size = os.path.getsize(path) if os.path.isfile(path) else None
            if size != nbytes:
                wrong.append(f"{path} ({'missing' if size is None else f'{size} bytes, not {nbytes}'})")
        if wrong:
            raise ValueError(
                f"the checkpoint's client state (spilled beyond client_state_budget) needs {len(state['files'])} "
                f"file(s) of the run's client_state directory, and {len(wrong)} are missing or changed: "
                f"{', '.join(wrong[:5])}{', ...' if len(wrong) > 5 else ''}. Copy or move the run directory whole "
                "(the paths are relative to the checkpoint's directory), and resume from one of the run's latest two "
                "checkpoints (older ones' files are deleted)"
            )
        for client, name, path, dtype, shape, nbytes, crc in state["files"]:
            dt = getattr(torch, dtype)
            self._files[(int(client), name)] = _File(path, dt, tuple(shape), int(nbytes), int(crc), owned=False)
        for client, name, tensor in state["tensors"]:
            self.put(int(client), name, tensor)

    def _clear(self) -> None:
        self._resident.clear()
        self._dirty.clear()
        self.resident_bytes = 0
        for key in list(self._files):
            self._drop_file(key)

    def release(self) -> None:
        """Free the memory and delete this store's files the last checkpoint does not refer to (end of a run)."""
        keep = self._pins[-1] if self._pins else set()
        self._resident.clear()
        self._dirty.clear()
        self.resident_bytes = 0
        for file in self._files.values():
            if file.owned and file.path not in keep:
                _remove(file.path)
        for path in self._superseded - keep:
            _remove(path)
        self._files.clear()
        self._superseded = set()
        self._pins = self._pins[-1:]
        directory = self._directory if isinstance(self._directory, str) else None
        if directory and os.path.isdir(directory) and not os.listdir(directory):
            os.rmdir(directory)


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
