"""The Ray executor's workers: the actor that trains jobs, the pool of idle workers kept between runs, and the torch
settings a worker takes over from the simulation's process."""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generator_state, restore_generators
from lit_asyncfl.executors.ray.wire import _portable, _Wire


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


#: Idle workers kept for the next run of this process, per (Ray job, CPUs, GPUs) (see ``reuse_workers``).
_IDLE: dict[tuple[str, float, float], list[Any]] = {}


def release_workers() -> None:
    """End the idle Ray workers that runs of this process kept for later runs (their CPUs and GPUs return to Ray)."""
    ray = _import_ray()
    for workers in _IDLE.values():
        for worker in workers:
            try:
                ray.kill(worker)
            except Exception:  # pragma: no cover (already gone)
                pass
    _IDLE.clear()


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
Result = tuple[ClientUpdate, _Wire, list[Any]]


class _Rest:
    """The rest of a job after its request, trained by a thread of a worker while the worker answers the merge: what
    the merge taught (``merge``), then the update and what the job taught (``result``) or an ``error``."""

    def __init__(self) -> None:
        self.merged, self.done = threading.Event(), threading.Event()
        self.merge: list[Any] | None = None
        self.result: tuple[ClientUpdate, list[Any]] | None = None
        self.error: BaseException | None = None
        self.seconds = 0.0


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


class _JobRunner:
    """Trains jobs with copies of a run's engine: whole, or in parts around their request to the server (the
    part before it ahead of the request's event; the job then waits, parked with an engine of its own, for the
    server's answer; then the merge, whose learning goes back at once, and the rest of the job). Each job first
    takes over the state its carried callbacks need (:func:`carried`) and gives back what they learned. A Ray worker
    holds one (``background``: the rest of a job trains in a thread while the worker returns the merge's learning;
    every other call first waits for it, so one job trains at a time); so does the simulation's process with
    ``train_locally`` (the rest trains at once, inside the merge's call).

    Args:
        trainer: The run's engine (its callbacks are replaced by copies; a parked job trains on a copy of the engine
            sharing its data).
        background: Train the rest of a job after its merge in a thread.
    """

    def __init__(self, trainer: Any, background: bool = False) -> None:
        if hasattr(trainer, "callbacks"):  # (a test's stand-in engine may have none)
            with detached(trainer.callbacks):
                trainer.callbacks = copy.deepcopy(trainer.callbacks)  # its own: callbacks keep the job in progress
        self.trainer, self.device = trainer, getattr(trainer, "device", None)
        self.background = background
        self.spare: list[Any] = []  # engines of parked jobs that finished, for the next parked jobs
        self.parked: dict[int, tuple[Any, Any, tuple[Any, ...]]] = {}  # job id -> engine, generator, its RNG state
        self.rests: dict[int, _Rest] = {}  # job id -> the rest of the job after its merge, until handed back
        self._thread: threading.Thread | None = None

    def join(self) -> None:
        """Wait for the rest of a job training in the background (the worker trains one job at a time)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

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
        self.join()
        _load_states(self.trainer, job, states)
        update = self.trainer.train(job, start, fresh)
        for cb in carried(self.trainer.callbacks):
            cb.merge_result(job)  # (learned when the job's merge was first computed)
        return update, [cb.job_result(job) for cb in carried(self.trainer.callbacks)]

    def train_many(self, jobs: list[ClientJob], starts: list[Tensor]) -> list[ClientUpdate]:
        """A cohort (the cohort engine carries no state)."""
        self.join()
        return self.trainer.train_many(jobs, starts)

    def first_part(self, job: ClientJob, start: Tensor, states: list[Any] | None) -> _MergePoint | None:
        """Train a job up to its request and park it (its engine, its generator and its random state); returns the
        job's state at its request (:class:`_MergePoint`), from which the simulation's process computes what the
        merge teaches (``None`` where it cannot be read: the merge is then computed here, :meth:`merge`)."""
        from lit_asyncfl.engines.base import OneDNN
        from lit_asyncfl.engines.fast import first_part

        self.join()
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
        self.parked[job.job_id] = (engine, parts, rng)
        return _MergePoint.of(engine, parts, rng)

    def merge(self, job: ClientJob, fresh: tuple[Tensor, int] | None) -> list[Any]:
        """Resume a parked job with the server's answer: what its merge taught the carried callbacks
        (:meth:`~lit_asyncfl.client_callbacks.ClientCallback.merge_result`), as soon as the merge is done; the
        rest of the job trains on (in the background, or here before returning), for :meth:`rest`. Raises what the
        merge raised."""
        self.join()
        engine, parts, rng = self.parked.pop(job.job_id)
        rest = self.rests[job.job_id] = _Rest()
        if self.background:
            threads, cuda = torch.get_num_threads(), None
            if self.device is not None and self.device.type == "cuda":  # (the index: "cuda" alone names none)
                cuda = self.device.index if self.device.index is not None else torch.cuda.current_device()
            args = (job, engine, parts, rng, fresh, rest, threads, cuda)
            self._thread = threading.Thread(target=self._finish, args=args)
            self._thread.start()
            rest.merged.wait()
        else:
            self._finish(job, engine, parts, rng, fresh, rest)
        if rest.merge is None:  # the job raised before its merge was done
            self.rests.pop(job.job_id)
            self.join()
            assert rest.error is not None
            raise rest.error
        return rest.merge

    def _finish(
        self,
        job: ClientJob,
        engine: Any,
        parts: Any,
        rng: Any,
        fresh: Any,
        rest: _Rest,
        threads: int = 0,
        cuda: int | None = None,
    ) -> None:
        from lit_asyncfl.engines.base import OneDNN
        from lit_asyncfl.engines.fast import next_part

        began = time.perf_counter()
        callbacks = carried(engine.callbacks)

        def merged() -> None:
            nonlocal began
            rest.merge = [cb.merge_result(job) for cb in callbacks]
            rest.merged.set()
            began = time.perf_counter()  # (the rest's time: the merge's is the merge call's)

        def watched(*args: Any) -> None:
            merge(*args)
            merged()

        merge = engine.fresh_model
        engine.fresh_model = watched
        try:
            if threads:  # a new thread: the worker's intra-op threads (an OpenMP setting of each thread) and GPU
                torch.set_num_threads(threads)
                if cuda is not None:  # (the calling thread's current GPU, by index)
                    torch.cuda.set_device(cuda)
            restore_generators(self.device, rng)
            if fresh is None:
                merged()  # nothing newer: nothing to merge, the request is behind the job
            with OneDNN(engine.onednn):
                update = next_part(parts, fresh)
            rest.result = update, [cb.job_result(job) for cb in callbacks]
        except BaseException as error:  # (on the thread: kept for the caller)
            rest.error = error
        finally:
            del engine.fresh_model
            parts.close()
            self.spare.append(engine)
            rest.seconds = time.perf_counter() - began
            rest.merged.set()
            rest.done.set()

    def resume(self, job: ClientJob, fresh: tuple[Tensor, int] | None) -> tuple[ClientUpdate, list[Any], list[Any]]:
        """Finish a parked job with the server's answer, here and now: its update, what it taught the carried
        callbacks, and what its merge taught them (learned already in the simulation's process, from the job's
        :class:`_MergePoint`: handed back to be compared)."""
        self.join()
        engine, parts, rng = self.parked.pop(job.job_id)
        rest = _Rest()
        self._finish(job, engine, parts, rng, fresh, rest)
        if rest.error is not None:
            raise rest.error
        assert rest.result is not None and rest.merge is not None
        return (*rest.result, rest.merge)

    def learn_merge(
        self, job: ClientJob, point: _MergePoint, states: list[Any] | None, fresh: tuple[Tensor, int] | None
    ) -> list[Any]:
        """What the merge of a job parked elsewhere teaches the carried callbacks, computed on this runner's engine
        from the job's state at its request (``point``) and the server's answer: the merge alone, as the parked
        job will compute it (same weights, batch, random state and step counters)."""
        self.join()
        engine = self.trainer
        _load_states(engine, job, states)
        callbacks = carried(engine.callbacks)
        if fresh is None:  # nothing newer: no merge
            return [cb.merge_result(job) for cb in callbacks]
        from lit_asyncfl.engines.base import OneDNN

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
        return [cb.merge_result(job) for cb in callbacks]

    def rest(self, job: ClientJob) -> tuple[ClientUpdate, list[Any]]:
        """The update of a job whose merge went back (and what the job taught), once its rest is trained; raises
        what the rest raised."""
        rest = self.rests.pop(job.job_id)
        rest.done.wait()
        self.join()
        if rest.error is not None:
            raise rest.error
        assert rest.result is not None
        return rest.result

    def discard(self, job_id: int) -> None:
        """Forget a parked job (cancelled, or its update will never be asked for)."""
        entry = self.parked.pop(job_id, None)
        if entry is not None:
            entry[1].close()
            self.spare.append(entry[0])
        if self.rests.pop(job_id, None) is not None:
            self.join()


def _load_states(engine: Any, job: ClientJob, states: list[Any] | None) -> None:
    if states is not None:
        for cb, state in zip(carried(engine.callbacks), states, strict=True):
            cb.load_job_state(job, state)


def _wire_fresh(fresh: tuple[_Wire, int] | None) -> tuple[Tensor, int] | None:
    return None if fresh is None else (fresh[0].tensor(), fresh[1])


class _Worker:
    """A Ray actor: builds a run's engine once (the module copy and every client's data stay resident) and trains
    the jobs sent to it (a :class:`_JobRunner`)."""

    def __init__(self) -> None:
        self.runner: _JobRunner | None = None

    def load(
        self, make_trainer: Callable[[torch.device], Any], device: str, num_threads: int, settings: dict[str, Any]
    ) -> None:
        torch.set_num_threads(num_threads)
        _apply_torch_settings(settings)
        self.unload()  # the previous run's engine goes first
        self.runner = _JobRunner(make_trainer(torch.device(device)), background=True)

    def unload(self) -> None:
        if self.runner is not None:
            self.runner.join()  # (a cancelled job's rest)
        self.runner = None  # an idle worker keeps no run's model or data

    def _begin(self) -> float:
        """A call's start: after the rest of an earlier job training in the background (its time is its own)."""
        assert self.runner is not None
        self.runner.join()
        return time.perf_counter()

    def train(
        self, job: ClientJob, start: _Wire, states: list[Any] | None = None, fresh: tuple[_Wire, int] | None = None
    ) -> tuple[Result, float]:
        began = self._begin()
        assert self.runner is not None
        update, results = self.runner.train(job, start.tensor(), states, _wire_fresh(fresh))
        return (*_portable(update), results), time.perf_counter() - began

    def train_many(self, jobs: list[ClientJob], *starts: _Wire) -> tuple[list[Result], float]:
        # (the start models come as separate arguments: Ray resolves object references only at the top level)
        began = self._begin()
        assert self.runner is not None
        updates = self.runner.train_many(jobs, [s.tensor() for s in starts])
        return [(*_portable(u), []) for u in updates], time.perf_counter() - began

    def first_part(
        self, job: ClientJob, start: _Wire, states: list[Any] | None = None
    ) -> tuple[_MergePoint | None, float]:
        began = self._begin()
        assert self.runner is not None
        point = self.runner.first_part(job, start.tensor(), states)
        if point is not None:
            point.weights = _Wire.of(point.weights)  # type: ignore[assignment]
        return point, time.perf_counter() - began

    def resume(self, job: ClientJob, fresh: tuple[_Wire, int] | None) -> tuple[tuple[Any, ...], float]:
        began = self._begin()
        assert self.runner is not None
        update, results, merged = self.runner.resume(job, _wire_fresh(fresh))
        return (*_portable(update), results, merged), time.perf_counter() - began

    def merge(
        self,
        job: ClientJob,
        fresh: tuple[_Wire, int] | None,
        start: _Wire | None = None,
        states: list[Any] | None = None,
    ) -> tuple[list[Any], float]:
        """What the job's merge taught (``start``: its first part is trained first; else it is parked here); the
        rest trains on in the background, for :meth:`rest`."""
        began = self._begin()
        assert self.runner is not None
        if start is not None:
            self.runner.first_part(job, start.tensor(), states)
        merged = self.runner.merge(job, _wire_fresh(fresh))
        return merged, time.perf_counter() - began

    def rest(self, job: ClientJob) -> tuple[Result, float]:
        assert self.runner is not None
        rest = self.runner.rests[job.job_id]
        update, results = self.runner.rest(job)
        return (*_portable(update), results), rest.seconds

    def discard(self, job_id: int) -> None:
        if self.runner is not None:  # (it joins a rest in the background)
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
