"""The Ray executor's workers: the actor that trains jobs, and the torch settings a worker takes over from the
simulation's process (the pool of workers, idle ones kept between runs: :mod:`~lit_asyncfl.executors.ray.pool`)."""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generator_state, restore_generators
from lit_asyncfl.executors.ray.pipe import _Server
from lit_asyncfl.executors.ray.wire import (
    _joined,
    _portable,
    _read_once,
    _resolved,
    _Shared,
    _SharedFiles,
    _Slot,
    _Wire,
)


def ray_available() -> bool:
    """Whether Ray can be imported (the ``ray`` extra: ``pip install 'lit-asyncfl[ray]'``)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "executor='ray' needs Ray: pip install 'lit-asyncfl[ray]' (or pip install 'ray>=2.9'); "
            "executor='sequential' needs nothing more"
        ) from error
    return ray


@contextlib.contextmanager
def detached(callbacks: Sequence[Any]) -> Iterator[None]:
    """The callbacks without the run's client state store while inside (to pickle or copy them: the store stays
    the single owner, in the simulation's process; a job carries its client's entries)."""
    stores = [(cb, cb.client_state) for cb in callbacks if getattr(cb, "client_state", None) is not None]
    for cb, _ in stores:
        cb.client_state = None
    try:
        yield
    finally:
        for cb, store in stores:
            cb.client_state = store


def carried(callbacks: Sequence[Any]) -> list[Any]:
    """The callbacks whose state a job carries (:attr:`~lit_asyncfl.client_callbacks.ClientCallback.carries_state`),
    in the run's order."""
    return [cb for cb in callbacks if getattr(cb, "carries_state", False)]


#: What a job brings back: its update without weights, its weights on the wire, and the carried callbacks' results.
Result = tuple[ClientUpdate, _Wire | _Shared, list[Any]]

#: A worker task's wall seconds and CPU seconds (its thread's: what it computed, without the time another process
#: held the core), as it measured them.
Took = tuple[float, float]


class _MergePoint:
    """A parked job's state at its request, all its merge reads: the module's flat weights and BatchNorm counts,
    the mini-batch of its last step, its random state and its step counters (``self.trainer``'s)."""

    def __init__(self, weights: Tensor, tracked: Tensor | None, batch: Any, rng: Any, stand_in: Any) -> None:
        self.weights, self.tracked, self.batch, self.rng, self.stand_in = weights, tracked, batch, rng, stand_in

    @classmethod
    def of(cls, engine: Any, parts: Any, rng: Any) -> _MergePoint | None:
        """The point of a job stopped at its request (``parts``: :meth:`FastEngine.train_parts`'s generator;
        ``None`` if its last batch cannot be read)."""
        inner = getattr(parts, "gi_yieldfrom", None)  # (FastEngine._run, suspended at the request)
        frame = getattr(inner, "gi_frame", None)
        if frame is None or "last_batch" not in frame.f_locals:
            return None
        stand_in = copy.copy(engine.module._trainer)
        return cls(engine.flat.read(), engine.flat.tracked(), frame.f_locals["last_batch"], rng, stand_in)


class _Merged:
    """What a job's merge changed, for the rest of the job: the module's flat weights and BatchNorm counts (``None``:
    changed in place, on the job's own engine), the random state after it and what it added to ``job_info``
    (``answered=False``: the server had nothing newer, there was no merge)."""

    def __init__(
        self, weights: Tensor | None, tracked: Tensor | None, rng: Any, info: dict[str, Any], answered: bool = True
    ) -> None:
        self.weights, self.tracked, self.rng, self.info, self.answered = weights, tracked, rng, info, answered
        self.applied: dict[str, tuple[Tensor, int]] = {}  # the tensors put in job_info, and their versions then

    def apply(self, engine: Any, device: Any) -> None:
        """Put the merge's effects on a parked job's engine (in place of computing the merge there)."""
        if self.weights is not None:  # (mid-job: the module's other buffers stay as the job left them)
            engine.flat.load(self.weights, self.tracked, reset=False)
        added = {k: v.to(engine.device) if isinstance(v, Tensor) else v for k, v in self.info.items()}
        engine.job_info.update(added)
        self.applied = {k: (v, v._version) for k, v in added.items() if isinstance(v, Tensor)}
        restore_generators(device, self.rng)

    def sent_back(self, update: ClientUpdate) -> None:
        """The update's ``info`` without the tensors this merge put in it that came back unchanged (the same tensor,
        not modified in place: its version counter): a :class:`_Kept` in their place, which the process that
        computed the merge fills in again (:meth:`taken_back`). FedASMU's merge jump is as large as the model: it
        came back with every rest whose merge was computed in the simulation's process, which has it already."""
        for k, (tensor, version) in self.applied.items():
            if update.info.get(k) is tensor and tensor._version == version:
                update.info[k] = _Kept()

    def taken_back(self, update: ClientUpdate) -> None:
        """Fill in what :meth:`sent_back` kept here (this object is the one whose copy went to the worker)."""
        for k, v in update.info.items():
            if isinstance(v, _Kept):
                update.info[k] = self.info[k]


class _Kept:
    """In a rest's update coming back: a tensor of the merge's ``job_info`` entries, left out (see
    :meth:`_Merged.sent_back`)."""


class _JobRunner:
    """Trains jobs with copies of a run's engine: whole, or in parts around their request to the server (the
    part before it ahead of the request's event; the job then waits, parked with an engine of its own, for the
    server's answer; then its merge, computed once: on the job's own engine (:meth:`merge`) or elsewhere from the
    job's state at its request (:meth:`learn_merge`); then the rest of the job, :meth:`resume`). Each job first takes
    over the state its carried callbacks need (:func:`carried`) and gives back what they learned. A Ray worker holds
    one; so does the simulation's process (``train_locally``, and the merges it computes).

    Args:
        trainer: The run's engine (its callbacks are replaced by copies; a parked job trains on a copy of the engine
            sharing its data).
    """

    def __init__(self, trainer: Any) -> None:
        if hasattr(trainer, "callbacks"):  # (a test's stand-in engine may have none)
            with detached(trainer.callbacks):
                trainer.callbacks = copy.deepcopy(trainer.callbacks)  # its own: callbacks keep the job in progress
        self.trainer, self.device = trainer, getattr(trainer, "device", None)
        self.spare: list[Any] = []  # engines of parked jobs that finished, for the next parked jobs
        #: job id -> its engine, its generator, its random state, its state at the request (or ``None``) and, once
        #: merged on its engine, what the merge changed
        self.parked: dict[int, list[Any]] = {}
        self.finished: dict[int, tuple[ClientUpdate, list[Any]] | BaseException] = {}  # merged and trained to the end

    def _engine(self) -> Any:
        """Another engine like the first (a module copy bound to its own flat weights, copies of the callbacks) that
        shares its clients' data (a deep copy would not do: a copied parameter no longer views the flat weights)."""
        first = self.trainer
        with detached(first.callbacks):
            callbacks = copy.deepcopy(first.callbacks)
        return type(first)(first.module, first.shards, first.batch_size, callbacks, first.device, onednn=first.onednn)

    def train(
        self, job: ClientJob, start: Tensor, states: list[Any] | None, fresh: tuple[Tensor, int] | None = None
    ) -> tuple[ClientUpdate, list[Any]]:
        """A whole job (``states``: :meth:`~lit_asyncfl.client_callbacks.ClientCallback.job_state` of the carried
        callbacks; ``fresh``: the server's answer to its request, whose merge was learned from already)."""
        _load_states(self.trainer, job, states)
        update = self.trainer.train(job, start, fresh)
        for cb in carried(self.trainer.callbacks):
            cb.merge_result(job)  # (learned when the job's merge was first computed)
        return update, [cb.job_result(job) for cb in carried(self.trainer.callbacks)]

    def train_many(self, jobs: list[ClientJob], starts: list[Tensor]) -> list[ClientUpdate]:
        """A cohort (the cohort engine carries no state)."""
        return self.trainer.train_many(jobs, starts)

    def first_part(self, job: ClientJob, start: Tensor, states: list[Any] | None) -> _MergePoint | None:
        """Train a job up to its request and park it (its engine, its generator and its random state); returns the
        job's state at its request (:class:`_MergePoint`), from which another process may compute its merge
        (:meth:`learn_merge`; ``None`` where it cannot be read)."""
        from lit_asyncfl.engines.base import OneDNN
        from lit_asyncfl.engines.fast import first_part

        engine = self.spare.pop() if self.spare else self._engine()
        try:
            _load_states(engine, job, states)
            parts = engine.train_parts(job, start)
            with OneDNN(engine.onednn):
                finished = first_part(parts)
            assert finished is None, "a job with a request finished without making it"
        except BaseException:
            self.spare.append(engine)
            raise
        rng = generator_state(self.device)
        point = _MergePoint.of(engine, parts, rng)
        self.parked[job.job_id] = [engine, parts, rng, point, None]
        return point

    def merge(self, job: ClientJob, fresh: tuple[Tensor, int] | None) -> list[Any]:
        """The merge of a parked job with the server's answer, on its own engine: what it taught the carried
        callbacks (:meth:`~lit_asyncfl.client_callbacks.ClientCallback.merge_result`); the rest of the job waits for
        :meth:`resume`. Raises what the merge raised (the job is then forgotten). A job whose state at its request
        cannot be read is merged and trained to its end now (its update waits for :meth:`resume`)."""
        from lit_asyncfl.engines.base import OneDNN

        entry = self.parked[job.job_id]
        engine, parts, rng, point, _ = entry
        callbacks = carried(engine.callbacks)
        if point is None:
            del self.parked[job.job_id]
            merged: list[Any] = []
            try:
                self.finished[job.job_id] = self._finish(job, engine, parts, rng, fresh, merged)
            except BaseException as error:
                if not merged:  # (the merge raised: raised now; an error after it, at resume)
                    raise
                self.finished[job.job_id] = error
            return merged[0]
        if fresh is None:  # nothing newer: nothing to merge, the request is behind the job
            entry[4] = _Merged(None, None, rng, {}, answered=False)
            return [cb.merge_result(job) for cb in callbacks]
        info = engine.job_info
        engine.job_info = {}
        try:
            restore_generators(self.device, rng)
            with OneDNN(engine.onednn):
                engine.fresh_model(job, fresh, point.batch)
        except BaseException:
            self.discard(job.job_id)
            raise
        finally:
            engine.job_info, added = info, engine.job_info
        entry[4] = _Merged(None, None, generator_state(self.device), added)
        return [cb.merge_result(job) for cb in callbacks]

    def learn_merge(
        self, job: ClientJob, point: _MergePoint | None, states: list[Any] | None, fresh: tuple[Tensor, int] | None
    ) -> tuple[list[Any], _Merged]:
        """The merge of a job parked elsewhere, computed on this runner's engine from the job's state at its request
        (``point``) and the server's answer, as the parked job would compute it (same weights, batch, random state
        and step counters): what it taught the carried callbacks, and what it changed (for :meth:`resume` where the
        job is parked; ``fresh=None``: nothing newer, no merge, no point needed)."""
        from lit_asyncfl.engines.base import OneDNN

        engine = self.trainer
        _load_states(engine, job, states)
        if fresh is None:
            return [cb.merge_result(job) for cb in carried(engine.callbacks)], _Merged(None, None, None, {}, False)
        assert point is not None
        engine.flat.load(point.weights, point.tracked)
        engine.module.train()
        engine.job_info = {}
        module = engine.module
        module._trainer = copy.copy(point.stand_in)
        try:
            restore_generators(self.device, point.rng)
            with OneDNN(engine.onednn):
                engine.fresh_model(job, fresh, point.batch)
        finally:
            module._trainer = None
        merged = _Merged(engine.flat.read(), engine.flat.tracked(), generator_state(self.device), engine.job_info)
        return [cb.merge_result(job) for cb in carried(engine.callbacks)], merged

    def resume(self, job: ClientJob, merged: _Merged | None = None) -> tuple[ClientUpdate, list[Any]]:
        """The rest of a parked job after its merge (computed on its engine by :meth:`merge`, or elsewhere:
        ``merged``, what it changed): its update and what it taught the carried callbacks. Raises what the rest
        raised."""
        done = self.finished.pop(job.job_id, None)
        if done is not None:
            if isinstance(done, BaseException):
                raise done
            return done
        engine, parts, rng, _, here = self.parked.pop(job.job_id)
        return self._finish(job, engine, parts, rng, merged or here)

    def _finish(
        self, job: ClientJob, engine: Any, parts: Any, rng: Any, merged: Any, taught: list[Any] | None = None
    ) -> tuple[ClientUpdate, list[Any]]:
        """Train a parked job to its end: after ``merged`` (a :class:`_Merged`: its merge's effects, put in place of
        the merge), or with ``merged`` the server's answer (``taught``: what the merge taught, appended once done)."""
        from lit_asyncfl.engines.base import OneDNN
        from lit_asyncfl.engines.fast import next_part

        callbacks = carried(engine.callbacks)
        if isinstance(merged, _Merged):
            fresh = merged if merged.answered else None  # (any answer: the merge's effects are put in its place)

            def merge(*args: Any) -> None:
                merged.apply(engine, self.device)
        else:
            fresh, compute = merged, engine.fresh_model

            def merge(*args: Any) -> None:
                compute(*args)
                assert taught is not None
                taught.append([cb.merge_result(job) for cb in callbacks])

        engine.fresh_model = merge
        try:
            restore_generators(self.device, rng)
            if taught is not None and fresh is None:  # nothing newer: nothing to merge
                taught.append([cb.merge_result(job) for cb in callbacks])
            with OneDNN(engine.onednn):
                update = next_part(parts, fresh)
            return update, [cb.job_result(job) for cb in callbacks]
        finally:
            del engine.fresh_model
            parts.close()
            self.spare.append(engine)

    def discard(self, job_id: int) -> None:
        """Forget a parked job (cancelled, its merge raised, or its update will never be asked for)."""
        entry = self.parked.pop(job_id, None)
        self.finished.pop(job_id, None)
        if entry is not None:
            entry[1].close()
            self.spare.append(entry[0])


def _took(began: Took) -> Took:
    """The wall and CPU seconds since ``began`` (:meth:`_Worker._begin`)."""
    return time.perf_counter() - began[0], time.thread_time() - began[1]


def _load_states(engine: Any, job: ClientJob, states: list[Any] | None) -> None:
    if states is not None:
        for cb, state in zip(carried(engine.callbacks), states, strict=True):
            cb.load_job_state(job, state)


def _wire_fresh(fresh: tuple[_Wire | _Shared, int] | None) -> tuple[Tensor, int] | None:
    return None if fresh is None else (fresh[0].tensor(), fresh[1])


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    """A worker's task: run alone (Ray's thread and the pipe's take turns, see :class:`_Worker`)."""

    @functools.wraps(method)
    def alone(self: _Worker, *args: Any) -> Any:
        with self._lock:
            return method(self, *args)

    return alone


class _Worker:
    """A Ray actor: builds a run's engine once (the module copy and every client's data stay resident) and trains
    the jobs sent to it (a :class:`_JobRunner`). Where it sees the run's shared-memory directory it also takes tasks
    through a socket there (:mod:`~lit_asyncfl.executors.ray.pipe`), on a thread of its own: a lock runs one task at a
    time, whichever way it came, and a task of a run that ended never runs."""

    def __init__(self) -> None:
        self.runner: _JobRunner | None = None
        self.files: _SharedFiles | None = None  # the run's shared-memory directory, where this worker sees it
        self._lock = threading.Lock()
        self._server: _Server | None = None

    def load(
        self,
        make_trainer: Callable[[torch.device], Any],
        device: str,
        num_threads: int,
        settings: dict[str, Any],
        files: tuple[str, str] | None = None,
    ) -> str | None:
        """Build the run's engine; where this worker sees the run's shared-memory directory (``files``:
        :attr:`_SharedFiles.at`), through which its tensors then travel, the path of the socket it takes tasks on
        (else ``None``)."""
        self.unload()  # the previous run's engine goes first
        with self._lock:
            torch.set_num_threads(num_threads)
            _apply_torch_settings(settings)
            self.runner = _JobRunner(make_trainer(torch.device(device)))
            self.files = _SharedFiles.attach(files)
            if self.files is None:
                return None
            path = os.path.join(self.files.directory, f"{secrets.token_hex(6)}.sock")
            self._server = _Server(path, self._run)
            return path

    def _run(self, method: str, args: tuple[Any, ...]) -> Any:
        return getattr(self, method)(*args)

    def unload(self) -> None:
        server, self._server = self._server, None
        if server is not None:  # (its task in progress finishes; the run's others are dropped)
            server.close()
        with self._lock:
            self.runner, self.files = None, None  # an idle worker keeps no run's model or data

    def _begin(self) -> Took:
        assert self.runner is not None
        return time.perf_counter(), time.thread_time()

    @_one_at_a_time
    def train(
        self, job: ClientJob, states: list[Any] | None, fresh: tuple[_Wire | _Shared, int] | None, *start: Any
    ) -> tuple[Result, Took]:
        """A whole job (``start``: its start model, a :class:`_Wire`, a :class:`_Shared` or a stand-in and its pieces,
        see :func:`~lit_asyncfl.executors.ray.wire._joined`)."""
        began = self._begin()
        assert self.runner is not None
        update, results = self.runner.train(job, _joined(start), states, _wire_fresh(fresh))
        return (*_portable(update, self.files), results), _took(began)

    @_one_at_a_time
    def train_many(self, jobs: list[ClientJob], *starts: _Wire) -> tuple[list[Result], Took]:
        # (the start models come as separate arguments: Ray resolves object references only at the top level)
        began = self._begin()
        assert self.runner is not None
        updates = self.runner.train_many(jobs, [s.tensor() for s in starts])
        return [(*_portable(u, self.files), []) for u in updates], _took(began)

    @_one_at_a_time
    def first_part(self, job: ClientJob, states: list[Any] | None, *start: Any) -> tuple[_MergePoint | None, Took]:
        began = self._begin()
        assert self.runner is not None
        point = self.runner.first_part(job, _joined(start), states)
        if point is not None:  # (a copy: the parked job keeps its own)
            point = copy.copy(point)
            point.weights = _read_once(point.weights, self.files)  # type: ignore[assignment]
        return point, _took(began)

    @_one_at_a_time
    def merge(
        self,
        job: ClientJob,
        fresh: tuple[_Wire | _Shared, int] | None,
        states: list[Any] | None = None,
        *start: Any,
    ) -> tuple[list[Any], Took]:
        """What the job's merge taught (``start``: its start model, and its first part is trained first; none: it
        is parked here); the rest of the job stays parked here, for :meth:`resume`."""
        began = self._begin()
        assert self.runner is not None
        answer = _wire_fresh(fresh)  # (every argument read before the job's state changes: see wire._SharedFiles)
        if start:
            self.runner.first_part(job, _joined(start), states)
        merged = self.runner.merge(job, answer)
        return merged, _took(began)

    @_one_at_a_time
    def resume(self, job: ClientJob, merged: _Merged | None = None, *pieces: Any) -> tuple[Result, Took]:
        """The rest of a job parked here, after its merge (``merged``: computed elsewhere, its effects; their tensors
        stand-ins for ``pieces``, see :func:`~lit_asyncfl.executors.ray.wire._inline`)."""
        began = self._begin()
        assert self.runner is not None
        if merged is not None and isinstance(merged.weights, (_Wire, _Slot, _Shared)):
            merged = copy.copy(merged)
            merged.weights = _resolved(merged.weights, pieces)
            merged.info = {
                k: _resolved(v, pieces) if isinstance(v, (_Wire, _Slot, _Shared)) else v for k, v in merged.info.items()
            }
        update, results = self.runner.resume(job, merged)
        if merged is not None:
            merged.sent_back(update)
        return (*_portable(update, self.files), results), _took(began)

    @_one_at_a_time
    def discard(self, job_id: int) -> None:
        if self.runner is not None:
            self.runner.discard(job_id)

    def where(self) -> tuple[str, int]:
        """The worker's Ray node and process id."""
        import os

        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


def _torch_settings() -> dict[str, Any]:
    """The process-wide torch settings that change what a job computes, as this process has them (a worker takes
    them over, so that a job trains as it would here)."""
    return {
        "default_dtype": torch.get_default_dtype(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
    }


def _apply_torch_settings(settings: dict[str, Any]) -> None:
    torch.set_default_dtype(settings["default_dtype"])
    torch.use_deterministic_algorithms(
        settings["deterministic_algorithms"], warn_only=settings["deterministic_warn_only"]
    )
    torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    torch.backends.cudnn.deterministic = settings["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = settings["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = settings["cudnn_allow_tf32"]
    torch.backends.mkldnn.enabled = settings["mkldnn_enabled"]
