"""The Ray executor's workers: the actor that trains jobs, the pool of idle workers kept between runs, and the torch
settings a worker takes over from the simulation's process."""

from __future__ import annotations

import contextlib
import copy
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


class _JobRunner:
    """Trains jobs with copies of a run's engine: whole, or in two parts around their request to the server (the
    part before it ahead of the request's event; the job then waits, parked with an engine of its own, for the
    server's answer). Each job first takes over the state its carried callbacks need (:func:`carried`) and gives
    back what they learned. A Ray worker holds one; so does the simulation's process with ``train_locally``.

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
        self.parked: dict[int, tuple[Any, Any, tuple[Any, ...]]] = {}  # job id -> engine, generator, its RNG state

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
        callbacks; ``fresh``: the server's answer to its request)."""
        _load_states(self.trainer, job, states)
        update = self.trainer.train(job, start, fresh)
        return update, [cb.job_result(job) for cb in carried(self.trainer.callbacks)]

    def train_many(self, jobs: list[ClientJob], starts: list[Tensor]) -> list[ClientUpdate]:
        """A cohort (the cohort engine carries no state)."""
        return self.trainer.train_many(jobs, starts)

    def first_part(self, job: ClientJob, start: Tensor, states: list[Any] | None) -> None:
        """Train a job up to its request and park it (its engine, its generator and its random state)."""
        from lit_asyncfl.engines.fast import first_part
        from lit_asyncfl.engines.kernels import OneDNN

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
        self.parked[job.job_id] = (engine, parts, generator_state(self.device))

    def next_part(self, job: ClientJob, fresh: tuple[Tensor, int] | None) -> tuple[ClientUpdate, list[Any]]:
        """Resume a parked job with the server's answer and finish it."""
        from lit_asyncfl.engines.fast import next_part
        from lit_asyncfl.engines.kernels import OneDNN

        engine, parts, rng = self.parked.pop(job.job_id)
        try:
            restore_generators(self.device, rng)
            with OneDNN(engine.onednn):
                update = next_part(parts, fresh)
            return update, [cb.job_result(job) for cb in carried(engine.callbacks)]
        finally:
            parts.close()
            self.spare.append(engine)

    def discard(self, job_id: int) -> None:
        """Forget a parked job (cancelled, or its update will never be asked for)."""
        entry = self.parked.pop(job_id, None)
        if entry is not None:
            entry[1].close()
            self.spare.append(entry[0])


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
        self.runner = None  # the previous run's engine goes first
        self.runner = _JobRunner(make_trainer(torch.device(device)))

    def unload(self) -> None:
        self.runner = None  # an idle worker keeps no run's model or data

    def train(
        self, job: ClientJob, start: _Wire, states: list[Any] | None = None, fresh: tuple[_Wire, int] | None = None
    ) -> tuple[Result, float]:
        began = time.perf_counter()
        assert self.runner is not None
        update, results = self.runner.train(job, start.tensor(), states, _wire_fresh(fresh))
        return (*_portable(update), results), time.perf_counter() - began

    def train_many(self, jobs: list[ClientJob], *starts: _Wire) -> tuple[list[Result], float]:
        # (the start models come as separate arguments: Ray resolves object references only at the top level)
        began = time.perf_counter()
        assert self.runner is not None
        updates = self.runner.train_many(jobs, [s.tensor() for s in starts])
        return [(*_portable(u), []) for u in updates], time.perf_counter() - began

    def first_part(self, job: ClientJob, start: _Wire, states: list[Any] | None = None) -> tuple[None, float]:
        began = time.perf_counter()
        assert self.runner is not None
        self.runner.first_part(job, start.tensor(), states)
        return None, time.perf_counter() - began

    def next_part(self, job: ClientJob, fresh: tuple[_Wire, int] | None) -> tuple[Result, float]:
        began = time.perf_counter()
        assert self.runner is not None
        update, results = self.runner.next_part(job, _wire_fresh(fresh))
        return (*_portable(update), results), time.perf_counter() - began

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
