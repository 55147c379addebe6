"""Tasks for a Ray worker on the simulation's machine through a Unix socket of its own, in place of Ray's actor calls.

An actor call costs Ray ~0.8 ms of CPU in the calling process and as much in the worker (gRPC, the task's
bookkeeping, serialization), paid on the cores the jobs train on; a message on a Unix socket costs ~0.1 ms on each
side (a micro-benchmark of 300 tasks of 20 ms, two in flight, on this project's 2-core machine, 28 November 2026).
FedASMU's jobs are two or three tasks each, so on two cores this was 3-4% of the run. A worker that sees the run's
shared-memory directory (:class:`~lit_asyncfl.executors.ray.wire._SharedFiles`) listens on a socket in it; the
simulation's process connects once every worker of the run sees it, and sends each task as one message; the worker
runs the tasks one at a time in the order they came, as Ray runs an actor's calls, and sends each result back. A
worker whose process ended closes its end: every task it had is lost, as a Ray worker's would be
(:class:`_Lost`), and computed again on its replacement.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import pickle
import queue
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch

_HEADER = struct.Struct("<Qq")  # before a message: its length, and its task's token (-1: a task without reply)


class _Lost(Exception):
    """A task whose worker's socket closed before its result came (the worker's process ended)."""


class _Call:
    """A task sent through a :class:`_Pipe`: its result, or its error (a :class:`_Lost` if the worker went), once it
    came back (``done``)."""

    __slots__ = ("done", "error", "pipe", "value")

    def __init__(self, pipe: _Pipe) -> None:
        self.pipe, self.done, self.value, self.error = pipe, False, None, None

    def result(self) -> Any:
        """The task's result; raises its error."""
        assert self.done, "a task's result was read before it came"
        if self.error is not None:
            raise self.error
        return self.value


def _dumps(message: Any, token: int) -> bytes:
    """A message as sent: its length and its task's token, then its pickle (:func:`_pickler`)."""
    buffer = io.BytesIO()
    buffer.write(bytes(_HEADER.size))
    _pickler()(buffer, protocol=5).dump(message)
    data = buffer.getbuffer()
    _HEADER.pack_into(data, 0, len(data) - _HEADER.size, token)
    return bytes(data)


@functools.cache
def _pickler() -> type:
    """Ray's cloudpickle (it pickles what Ray's calls pickle: closures, local classes), with a plain CPU tensor that
    is its storage's only view pickled as its bytes (:class:`~lit_asyncfl.executors.ray.wire._Wire`): half the time
    of torch's own pickling, which writes each tensor with ``torch.save`` (a job's state at its request holds three)."""
    import ray.cloudpickle as cloudpickle

    from lit_asyncfl.executors.ray.wire import _Wire

    class Pickler(cloudpickle.CloudPickler):
        def reducer_override(self, obj: Any) -> Any:
            if type(obj) is torch.Tensor and _whole(obj) and not obj.__dict__:  # (attributes: torch's pickling)
                return _Wire.tensor, (_Wire.of(obj),)
            return super().reducer_override(obj)

    return Pickler


def _whole(tensor: torch.Tensor) -> bool:
    """Whether a tensor is a plain CPU tensor, its storage's only view (its bytes, dtype and shape say all of it)."""
    return (
        tensor.device.type == "cpu"
        and not tensor.requires_grad
        and not tensor.is_quantized
        and tensor.layout == torch.strided
        and tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )


class _Frames:
    """Bytes read from a socket, cut into messages."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def add(self, data: bytes) -> list[tuple[int, Any, BaseException | None]]:
        """The messages ``data`` completes: each one's token, and the message or the error that unpickling it
        raised (that task alone fails)."""
        self.buffer += data
        messages, start = [], 0
        while len(self.buffer) - start >= _HEADER.size:
            size, token = _HEADER.unpack_from(self.buffer, start)
            if len(self.buffer) - start - _HEADER.size < size:
                break
            begin = start + _HEADER.size
            try:
                messages.append((token, pickle.loads(memoryview(self.buffer)[begin : begin + size]), None))
            except BaseException as error:  # (a class this process lacks, a __setstate__ that raises, memory)
                messages.append((token, None, error))
            start = begin + size
        del self.buffer[:start]
        return messages


class _Pipe:
    """The simulation's end of a worker's socket: :meth:`call` sends a task, :func:`_finished` collects the results
    of those that came back.

    Example:
        >>> import tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "w.sock")
        >>> server = _Server(path, lambda method, args: {"add": sum}[method](args))
        >>> pipe = _Pipe(path)
        >>> call = pipe.call("add", 2, 3)
        >>> _finished([call], block=True) == [call], call.result()
        (True, 5)
        >>> pipe.close(); server.close()
    """

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
        except OSError:
            self.sock.close()
            raise
        self._frames = _Frames()
        self._tokens = itertools.count()
        self._calls: dict[int, _Call] = {}
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    def call(self, method: str, *args: Any) -> _Call:
        """Send a task (the worker's ``method`` with ``args``); its :class:`_Call`. A pipe whose worker went loses
        it at once."""
        call, token = _Call(self), next(self._tokens)
        data = _dumps((method, args), token)  # (what cannot be pickled raises here, as Ray's call would)
        self._calls[token] = call
        self._send(data)
        return call

    def tell(self, method: str, *args: Any) -> None:
        """Send a task whose result nobody reads (a parked job to forget)."""
        self._send(_dumps((method, args), -1))

    def _send(self, data: bytes) -> None:
        try:
            if not self.closed:
                self.sock.sendall(data)
                return
        except OSError:  # (the worker's process ended)
            pass
        self.close()

    def read(self) -> None:
        """Take every result that came, without waiting (a closed socket loses the tasks still out)."""
        while not self.closed:
            try:
                data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.close()
                return
            for token, reply, error in self._frames.add(data):
                call = self._calls.pop(token)
                call.done = True
                if error is not None:
                    call.error = RuntimeError(f"a Ray worker's result could not be read here: {error!r}")
                elif reply[0]:
                    call.value = reply[1]
                else:
                    call.error = reply[1]

    def close(self) -> None:
        """Close this end (the worker stops once it has run the tasks already sent, or when it is unloaded: its task
        in progress finishes, the others are dropped); the tasks whose results did not come are lost."""
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                self.sock.close()
        for call in self._calls.values():
            call.done, call.error = True, _Lost("the Ray worker's process ended")
        self._calls.clear()


def _finished(calls: Iterable[_Call], block: bool) -> list[_Call]:
    """Those of ``calls`` whose results came (``block``: waiting until one does)."""
    calls = list(calls)
    pipes = {call.pipe for call in calls}
    while True:
        for pipe in pipes:
            pipe.read()
        done = [call for call in calls if call.done]
        if done or not block or not calls:
            return done
        select.select([pipe for pipe in pipes if not pipe.closed], [], [])


def _portable_reply(token: int, ok: bool, value: Any) -> bytes:
    """A task's reply as sent: an error (or result) that cannot be pickled, or unpickled, becomes a ``RuntimeError``
    naming it."""
    try:
        data = _dumps((ok, value), token)
        if not ok:  # (an exception whose class takes other arguments than it pickles cannot be unpickled)
            pickle.loads(memoryview(data)[_HEADER.size :])
        return data
    except Exception as error:
        what = f"{type(value).__name__}: {value}" if not ok else f"its result could not be sent back ({error!r})"
        return _dumps((False, RuntimeError(f"a job on a Ray worker raised {what}")), token)


class _Server:
    """A worker's end: listens at ``path`` for the simulation's process, then runs the tasks it sends, one at a time
    in the order they came, with ``run(method, args)`` on a thread of its own, and sends each result (or the error
    it raised) back. Two more threads read the socket and send the results meanwhile, so that neither side ever
    waits for the other to read, nor the next task for a result to leave."""

    def __init__(self, path: str, run: Callable[[str, tuple[Any, ...]], Any]) -> None:
        self.path, self._run = path, run
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(1)
        self._conn: socket.socket | None = None
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._replies: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.closed = False
        threading.Thread(target=self._read, name="lit_asyncfl-pipe-read", daemon=True).start()
        threading.Thread(target=self._send, name="lit_asyncfl-pipe-send", daemon=True).start()
        self._runner = threading.Thread(target=self._serve, name="lit_asyncfl-pipe", daemon=True)
        self._runner.start()

    def _read(self) -> None:
        frames = _Frames()
        try:
            self._conn, _ = self._listener.accept()
            while True:
                data = self._conn.recv(1 << 20)
                if not data:
                    break
                for message in frames.add(data):
                    self._tasks.put(message)
        except OSError:
            pass
        finally:
            self._tasks.put(None)  # (the simulation's process closed its end, or this one closed)

    def _serve(self) -> None:
        while True:
            message = self._tasks.get()
            if message is None or self.closed:
                self._replies.put(None)
                return
            token, task, unreadable = message
            try:
                if unreadable is not None:
                    raise RuntimeError(f"a task could not be read on the Ray worker: {unreadable!r}")
                ok, value = True, self._run(*task)
            except BaseException as error:  # (raised where the job is consumed, as Ray's actor calls do)
                ok, value = False, error if isinstance(error, Exception) else RuntimeError(repr(error))
            if token >= 0:  # (pickled now, before the next task changes what it holds; sent meanwhile)
                self._replies.put(_portable_reply(token, ok, value))

    def _send(self) -> None:
        while True:
            data = self._replies.get()
            if data is None:
                return
            try:
                assert self._conn is not None
                self._conn.sendall(data)
            except OSError:  # (the simulation's process closed its end: the run is over)
                return

    def close(self, wait: bool = True) -> None:
        """Stop: the task being computed, if any, finishes first (``wait``); the others are dropped."""
        self.closed = True
        for sock in (self._listener, self._conn):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        if wait and threading.current_thread() is not self._runner:
            self._runner.join()
