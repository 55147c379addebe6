"""The Ray executor's worker pool: starting Ray, the workers' runtime environment, and the workers of a run, taken
from the idle workers that earlier runs of this process kept (``reuse_workers``) or started, replaced when one dies,
and at the run's end kept idle for the next run or ended."""

from __future__ import annotations

import math
from typing import Any

from lit_asyncfl.core.jobs import ExecutorError
from lit_asyncfl.executors.ray.pipe import _Pipe
from lit_asyncfl.executors.ray.wire import _SharedFiles
from lit_asyncfl.executors.ray.worker import _import_ray, _Worker

#: The workers' runtime environment with ``train_locally`` (merged with the job's): they run at the priority of Ray's
#: node processes (the simulation's process, where it starts Ray), its peers in training, not 15 below it (``nice``),
#: Ray's default for workers, under which a worker sharing cores with this process or anything else trained up to
#: three times slower than a process with an equal share (a raw SGD loop of the ``heavy`` benchmark's CNN beside the
#: same loop in this process, on the shared 2-core VM: 18-43 ms per step against its 11-17 ms; at equal priority
#: 16-26 ms for both). Without ``train_locally`` they keep Ray's default: this process's work is then the run's
#: serial path, which workers on its cores (``num_workers=None`` counts them) must not slow down. A variable the job's
#: runtime environment sets itself (``ray.init(runtime_env={"env_vars": ...})``) keeps the user's value.
WORKER_RUNTIME_ENV = {"env_vars": {"RAY_worker_niceness": "0"}}

#: Every worker's runtime environment (merged with the job's, and with :data:`WORKER_RUNTIME_ENV` under
#: ``train_locally``): a task's result up to 8 MiB comes back inside the worker's reply to this process (Ray's
#: ``max_direct_call_object_size``, 100 KiB by default, which the executing worker reads) instead of through the object
#: store, whose round trip for SimpleCNN's 1.2 MB update cost Ray's raylet 1.2 ms of CPU per job (a store object
#: created, sealed, fetched and freed; 0.35 ms inside the reply: 0.9 ms saved) on top of the worker's and this
#: process's own ~1 ms each, for nothing: this process reads each result once and copies it. A variable the job's
#: runtime environment sets itself keeps the user's value.
RESULT_RUNTIME_ENV = {"env_vars": {"RAY_max_direct_call_object_size": str(8 << 20)}}


def _worker_env_vars(job_env_vars: dict[str, str] | None, train_locally: bool) -> dict[str, str]:
    """The environment variables the workers' runtime environment sets (Ray merges them into the job's, where they
    would win): :data:`RESULT_RUNTIME_ENV`'s, and :data:`WORKER_RUNTIME_ENV`'s with ``train_locally``, except those
    the job's runtime environment (``ray.init(runtime_env={"env_vars": ...})``) sets itself: the user's value stays.

    Example:
        >>> sorted(_worker_env_vars(None, train_locally=True))
        ['RAY_max_direct_call_object_size', 'RAY_worker_niceness']
        >>> _worker_env_vars({"RAY_worker_niceness": "5"}, train_locally=True)
        {'RAY_max_direct_call_object_size': '8388608'}
    """
    ours = {**RESULT_RUNTIME_ENV["env_vars"], **(WORKER_RUNTIME_ENV["env_vars"] if train_locally else {})}
    return {key: value for key, value in ours.items() if key not in (job_env_vars or {})}


#: Idle workers kept for the next run of this process, per (Ray job, CPUs, GPUs, ``train_locally``: their priority)
#: (see ``reuse_workers``).
_IDLE: dict[tuple[Any, float, float, bool], list[Any]] = {}


def _kill(ray: Any, worker: Any) -> None:
    """End a worker actor; one already gone is fine."""
    try:
        ray.kill(worker)
    except Exception:  # pragma: no cover (already gone)
        pass


def release_workers() -> None:
    """End the idle Ray workers that runs of this process kept for later runs (their CPUs and GPUs return to Ray)."""
    ray = _import_ray()
    for workers in _IDLE.values():
        for worker in workers:
            _kill(ray, worker)
    _IDLE.clear()


class _WorkerPool:
    """The worker pool of :class:`~lit_asyncfl.executors.ray.executor.RayExecutor` (a base class of it): Ray started
    where it is not, the run's workers (``_workers``) taken from :data:`_IDLE` or started with their runtime
    environment, their engines built (not waited for: :meth:`_built`), a dead one replaced, and at the end kept
    idle or ended. The options it reads are ``RayExecutor``'s; the run's state it builds engines from
    (``_trainer_ref``, ``_worker_device``, ``_threads``, ``_settings``) is set by ``RayExecutor.start``."""

    num_workers: int | None
    num_cpus_per_worker: float
    num_gpus_per_worker: float
    address: str | None
    train_locally: bool
    reuse_workers: bool
    stats: dict[str, float]
    _ray: Any
    _workers: list[Any]
    _actor: Any
    _pool_key: tuple[Any, float, float, bool]
    _trainer_ref: Any
    _building: list[tuple[Any, Any]]  # (worker, its engine build's reference), until _built waits for them
    _files: _SharedFiles | None  # the run's shared-memory directory (see wire._SharedFiles)
    _reading: set[Any]  # the workers that see it: their tasks' tensors travel through it
    _pipes: dict[Any, _Pipe]  # the workers whose tasks go through their sockets (see executors.ray.pipe)
    _sockets: dict[Any, str]  # each such worker's socket, until every worker of the run is known to have one
    _cohort: bool
    _worker_device: str
    _threads: int
    _settings: dict[str, Any]

    def stop(self) -> None:  # (RayExecutor's: it clears the run's state, then calls _stop_workers)
        raise NotImplementedError

    def _start_ray(self, ray: Any) -> None:
        """Start a local Ray (or join ``address``) unless this process joined a Ray cluster already."""
        if ray.is_initialized():
            return
        if self.address is not None:
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        elif self.num_workers is None:  # every CPU of this machine: one worker per core
            ray.init(include_dashboard=False, log_to_driver=False)
        else:
            cpus = math.ceil(self.num_workers * max(self.num_cpus_per_worker, 1))
            ray.init(num_cpus=max(cpus, 1), include_dashboard=False, log_to_driver=False)

    def _start_workers(self, ray: Any, n: int) -> None:
        """The run's ``n`` workers: idle ones of this pool first (:data:`_IDLE`), new ones for the rest, their
        engines built."""
        env = _worker_env_vars((ray.get_runtime_context().runtime_env or {}).get("env_vars"), self.train_locally)
        self._actor = ray.remote(
            num_cpus=self.num_cpus_per_worker, num_gpus=self.num_gpus_per_worker, runtime_env={"env_vars": env}
        )(_Worker)
        session = (ray.get_runtime_context().get_job_id(), ray.get_runtime_context().get_node_id())
        self._pool_key = (session, self.num_cpus_per_worker, self.num_gpus_per_worker, self.train_locally)
        for key in [k for k in _IDLE if k[0] != session]:  # another Ray session's: stale handles
            del _IDLE[key]
        idle = _IDLE.setdefault(self._pool_key, [])
        self._free_idle(ray, n - len(idle))
        self._workers = [idle.pop() if idle else self._actor.remote() for _ in range(n)]
        self._files = _SharedFiles.create()
        self._building = self._load_engines(self._workers)  # (waited for by _built, at the first result)

    def _free_idle(self, ray: Any, new: int) -> None:
        """End idle workers that runs of this process kept with other settings (another pool) while Ray lacks the
        CPUs or GPUs of ``new`` workers: an idle worker holds its share."""
        if new <= 0:
            return
        others = [key for key in _IDLE if key != self._pool_key and key[0] == self._pool_key[0] and _IDLE[key]]
        for key in others:
            free = ray.available_resources()
            if free.get("CPU", 0.0) >= new * self.num_cpus_per_worker and (
                free.get("GPU", 0.0) >= new * self.num_gpus_per_worker
            ):
                return
            for worker in _IDLE.pop(key):
                _kill(ray, worker)

    def _default_workers(self, ray: Any) -> int:
        resources = ray.cluster_resources()
        if self.num_gpus_per_worker > 0:
            return max(1, int(resources.get("GPU", 0) / self.num_gpus_per_worker))
        return max(1, int(resources.get("CPU", 1) / max(self.num_cpus_per_worker, 1e-9)))

    def _load_engines(self, workers: list[Any]) -> list[tuple[Any, Any]]:
        """Start building the run's engine on ``workers`` (each builds it before its first task): each worker and its
        build's reference, for :meth:`_built` (a build tells whether the worker sees the run's shared-memory
        directory)."""
        settings, files = self._settings, self._files.at if self._files is not None else None
        device, threads = self._worker_device, self._threads
        return [(w, w.load.remote(self._trainer_ref, device, threads, settings, files)) for w in workers]

    def _built(self) -> None:
        """Wait for the engines being built on workers (:meth:`_load_engines`), which this process does not wait
        for at the run's start: it builds the run, dispatches the first jobs and evaluates the initial model
        meanwhile (the workers' tasks wait behind the build). Called at the end of each evaluation and before each
        worker's result is read, so that a failure (a module or dataset a worker cannot unpickle) is raised naming
        its cause, not as every job's error; a worker that died building is replaced when its task's result says
        so."""
        building, self._building = self._building, []
        self._wait_for_builds(building, died_is_replaced=True)
        if building:
            self._connect()

    def _connect(self) -> None:
        """Once every worker of the run said where its socket is (they share this node), their tasks go through
        their sockets (:mod:`~lit_asyncfl.executors.ray.pipe`); a run with a worker elsewhere keeps Ray's calls (its
        waits would otherwise poll both), as does a cohort run (its start models go through the object store)."""
        if self._cohort or not all(worker in self._sockets for worker in self._workers):
            return
        for worker in self._workers:
            if worker not in self._pipes:
                try:
                    self._pipes[worker] = _Pipe(self._sockets[worker])
                except OSError:  # (its socket gone: removed with the run's files by another program) Ray's calls
                    del self._sockets[worker]

    def _wait_for_builds(
        self, builds: list[tuple[Any, Any]], died_is_replaced: bool, what: str = "a Ray worker"
    ) -> None:
        """Wait for engine builds one at a time (a worker that died building must not hide another's failure): one
        that raised stops the run (:class:`~lit_asyncfl.core.jobs.ExecutorError`, naming its cause); one whose worker
        died too, unless ``died_is_replaced`` (its task's result raises it as well, and the worker is replaced
        there). A worker that sees the run's shared-memory directory gets its tensors through it from now on."""
        ray = self._ray
        for worker, build in builds:
            try:
                path = ray.get(build)
                if path:
                    self._reading.add(worker)
                    self._sockets[worker] = path
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as error:
                if died_is_replaced and not isinstance(error, ray.exceptions.RayTaskError):  # (the worker died)
                    continue
                self.stop()
                raise ExecutorError(f"building the engine on {what} failed: {error}") from None

    def _new_worker(self) -> Any:
        """A replacement worker, its engine built and waited for: a replacement that cannot build it, or dies
        building it, stops the run (:class:`~lit_asyncfl.core.jobs.ExecutorError`) rather than failing every job
        it would take."""
        worker = self._actor.remote()
        self._wait_for_builds(self._load_engines([worker]), died_is_replaced=False, what="a replacement Ray worker")
        return worker

    def _replace_worker(self, index: int, actor: Any) -> None:
        """Replace a dead worker (once: the other tasks it had find it replaced already)."""
        if self._workers[index] is not actor:
            return
        _kill(self._ray, actor)
        self._reading.discard(actor)
        self._sockets.pop(actor, None)
        pipe = self._pipes.pop(actor, None)
        if pipe is not None:
            pipe.close()
        self._workers[index] = self._new_worker()
        self._connect()  # (where the others' tasks go through their sockets, the new one's too)
        self.stats["worker_restarts"] += 1

    def _stop_workers(self) -> None:
        """The run's workers wait for the next run (``reuse_workers``) or end; the run's directory in shared memory
        is removed."""
        self._building, self._reading, self._sockets = [], set(), {}
        for pipe in self._pipes.values():  # (at its unload a worker finishes its task in progress, drops the others)
            pipe.close()
        self._pipes = {}
        if self._files is not None:  # (a task still on a worker finds it gone: its result is dropped anyway)
            self._files.remove()
            self._files = None
        if self._workers and self.reuse_workers:
            for worker in self._workers:
                worker.unload.remote()
            _IDLE.setdefault(self._pool_key, []).extend(self._workers)
        else:
            for worker in self._workers:
                _kill(self._ray, worker)
        self._workers = []
