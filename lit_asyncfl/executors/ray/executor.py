"""``RayExecutor``: in-flight client jobs computed on Ray workers, consumed in virtual-time order.

Every dispatched job's start model is known at dispatch and its seed is its own, so jobs are independent until their
updates are consumed. The executor ships each job to a worker as soon as it is submitted (within a look-ahead
window) and hands its update to the simulator at the job's event: the simulator alone decides the order in which
updates are applied, so the weights equal the sequential executor's exactly (on CPU, with the same engine and
thread count) whatever the number of workers or the order in which they finish.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.checks import check, check_bool, check_int, check_number, check_str
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generators_kept

log = logging.getLogger("lit_asyncfl")

#: Accepted ``executor`` names (``FederatedTrainer(executor=...)``; a :class:`RayExecutor` object is accepted too).
EXECUTORS = ("sequential", "ray")

#: How many times a job whose worker died is recomputed on a new worker before the job fails.
MAX_WORKER_FAILURES = 3

#: Tasks placed on one worker at a time: one training, one waiting (it hides the round trip). Every other shipped
#: task waits in this process, earliest expected arrival first, and goes to whichever worker frees up first.
TASKS_PER_WORKER = 2


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


def check_executor(executor: Any) -> None:
    """Raise naming the value unless ``executor`` is one of :data:`EXECUTORS` or a :class:`RayExecutor`; Ray must be
    installed for a Ray executor.

    Example:
        >>> check_executor("sequential")
        >>> check_executor("threads")
        Traceback (most recent call last):
        ...
        ValueError: executor must be one of ['sequential', 'ray'] or a RayExecutor, got 'threads'
    """
    check(
        isinstance(executor, RayExecutor) or (isinstance(executor, str) and executor in EXECUTORS),
        f"executor must be one of {list(EXECUTORS)} or a RayExecutor, got {executor!r}",
    )
    if executor != "sequential":
        _import_ray()


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


class _Worker:
    """A Ray actor: builds a run's engine once (the module copy and every client's data stay resident) and trains
    the jobs sent to it."""

    def __init__(self) -> None:
        self.trainer: Any = None

    def load(
        self, make_trainer: Callable[[torch.device], Any], device: str, num_threads: int, settings: dict[str, Any]
    ) -> None:
        torch.set_num_threads(num_threads)
        _apply_torch_settings(settings)
        self.trainer = None  # the previous run's engine goes first
        self.trainer = make_trainer(torch.device(device))

    def unload(self) -> None:
        self.trainer = None  # an idle worker keeps no run's model or data

    def train(self, job: ClientJob, start: _Wire) -> tuple[tuple[ClientUpdate, _Wire], float]:
        began = time.perf_counter()
        update = _portable(self.trainer.train(job, start.tensor(), None))
        return update, time.perf_counter() - began

    def train_many(self, jobs: list[ClientJob], *starts: _Wire) -> tuple[list[tuple[ClientUpdate, _Wire]], float]:
        # (the start models come as separate arguments: Ray resolves object references only at the top level)
        began = time.perf_counter()
        updates = [_portable(u) for u in self.trainer.train_many(jobs, [s.tensor() for s in starts])]
        return updates, time.perf_counter() - began

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


def _portable(update: ClientUpdate) -> tuple[ClientUpdate, _Wire]:
    """The update as it travels back: its weights on the wire, without the start weights (the driver holds them)."""
    weights, update.weights, update.base_weights = update.weights, None, None  # type: ignore[assignment]
    return update, _Wire.of(weights)


@dataclass
class _Shipped:
    """One task (shared by the jobs of a cohort task): its jobs, the expected arrival of the earliest one, how often
    a worker died computing it and, once placed on a worker, the result's reference and the worker."""

    batch: list[int]  # the task's jobs (several with the cohort engine)
    key: float
    failures: int = 0
    jobs: list[ClientJob] | None = None  # the jobs and their start models, until the task is received
    starts: list[Tensor] | None = None
    ref: Any = None
    worker: int = -1
    actor: Any = None


@dataclass
class _Failed:
    """A job's result when its task raised on a worker: raised when the job is consumed, as sequentially."""

    error: BaseException


class RayExecutor:
    """Computes client jobs on Ray workers (``FederatedTrainer(executor=RayExecutor(...))``, or ``executor="ray"``
    for the defaults; ``--trainer.executor=ray`` on the command line).

    Jobs are shipped as soon as they are dispatched, earliest expected arrival first, and at most ``max_ahead``
    shipped jobs wait to be consumed (so at most that many results, plus the in-flight jobs' start models, are
    alive). Each worker holds at most :data:`TASKS_PER_WORKER` of them (one training, one queued); the others wait in
    this process and go, due first, to whichever worker frees up first, so the update the simulation needs next is
    never stuck behind a long queue on a busy worker while another worker idles. Each global version goes into Ray's
    object store once and every job starting from it refers to it. Each worker builds the engine once: the module
    copy and the clients' data stay resident on it.

    What stays in the simulation's process: jobs that talk to the server mid-training (FedASMU's fresh-model
    request: the job is computed at its request event, where the fresh model exists, exactly as sequentially), and
    jobs of runs whose client callbacks keep state across jobs (a callback declares
    :attr:`~lit_asyncfl.client.callbacks.ClientCallback.runs_on_workers`); such jobs are counted in
    :attr:`stats` under ``jobs_local``.

    Determinism: on CPU with the ``fast`` or ``lightning`` engine the final weights equal the sequential executor's
    bit for bit (same per-job seeds, same thread count, tested for every preset). With ``engine="cohort"`` the
    jobs are batched per worker task, so the cohorts differ from the sequential cohort engine's and results agree
    within float32 rounding (as ``cohort`` agrees with ``fast``); they are still deterministic (cohorts are formed
    from the order of dispatches, never from wall-clock timing). On GPUs results are deterministic up to the
    kernels' own nondeterminism. At the start of each run the workers take over this process's torch settings that
    change what a job computes (default dtype, deterministic algorithms, float32 matmul precision, cuDNN, TF32 and
    oneDNN flags); other process-wide state set by hand (a global random seed, environment variables read at import) is
    not forwarded: set it in the module or data module, whose code runs on the workers.

    A worker that dies (its process killed, its node lost) is replaced by a new one and the jobs it was computing
    are computed again with the same result (:attr:`stats` ``jobs_recomputed``); a job whose worker dies
    :data:`MAX_WORKER_FAILURES` times fails like a job that raised (see ``on_client_error``).

    Args:
        num_workers: Worker actors; ``None``: one per CPU of the Ray cluster (divided by ``num_cpus_per_worker``),
            or one per ``num_gpus_per_worker`` share of its GPUs when that is set.
        num_cpus_per_worker: CPUs Ray reserves for each worker.
        num_gpus_per_worker: GPUs each worker trains on (a fraction such as ``0.25`` packs four workers on one
            GPU); ``0``: CPU workers.
        max_ahead: At most this many shipped jobs wait to be consumed (the look-ahead; it bounds memory); ``None``:
            ``4 * num_workers`` (one more worker with ``train_locally``). A job needed sooner is shipped even when
            the window is full; with the cohort engine a whole cohort is shipped when the window has room, so up to
            ``max_ahead + cohort_size`` wait.
        num_threads: Intra-op threads of each worker; ``None``: the run's (``FederatedTrainer``'s
            ``num_threads``, whose default is one). Equal thread counts keep CPU results bit-identical.
        address: Ray cluster to join when Ray is not initialised yet (``"auto"``, ``"ray://head:10001"``);
            ``None``: start a local Ray with ``num_workers`` CPUs (or join the cluster the process already joined
            with ``ray.init``).
        cohort_size: With ``engine="cohort"``: jobs per worker task (a cohort is shipped once this many jobs wait,
            or when one of them is needed).
        train_locally: The simulation's process trains shipped jobs too while it waits for a result: the job due
            next when no worker has it yet, else the earliest waiting one (results as on a worker: same engine,
            seeds and thread count). Where the workers share this process's cores, ``num_workers`` one below the
            cores plus ``train_locally=True`` keeps every core training without oversubscribing them (on 2 cores,
            2 workers and this process share 2 cores: their jobs trained up to ~20% slower than alone); on a cluster,
            where this process has a core of its own, it adds one trainer.
        reuse_workers: Keep the workers alive after a run for the next run of this process (a sweep's runs, a
            test suite) instead of starting new ones (a worker takes seconds to start: it imports torch and
            Lightning); they hold their CPUs/GPUs until :func:`release_workers` or the process ends.

    Example:
        >>> RayExecutor(num_workers=2, max_ahead=16).max_ahead
        16
    """

    def __init__(
        self,
        num_workers: int | None = None,
        num_cpus_per_worker: float = 1.0,
        num_gpus_per_worker: float = 0.0,
        max_ahead: int | None = None,
        num_threads: int | None = None,
        address: str | None = None,
        cohort_size: int = 16,
        train_locally: bool = False,
        reuse_workers: bool = True,
    ) -> None:
        check_int("num_workers", num_workers, 1, optional=True)
        check_number("num_cpus_per_worker", num_cpus_per_worker, 0)
        check_number("num_gpus_per_worker", num_gpus_per_worker, 0)
        check(
            num_gpus_per_worker <= 1 or float(num_gpus_per_worker).is_integer(),
            f"num_gpus_per_worker must be a fraction of one GPU or a whole number of GPUs, got {num_gpus_per_worker!r}",
        )
        check_int("max_ahead", max_ahead, 1, optional=True)
        check_int("num_threads", num_threads, 1, optional=True)
        check_str("address", address, optional=True)
        check_int("cohort_size", cohort_size, 1)
        check_bool("train_locally", train_locally)
        check_bool("reuse_workers", reuse_workers)
        self.num_workers = num_workers
        self.num_cpus_per_worker = num_cpus_per_worker
        self.num_gpus_per_worker = num_gpus_per_worker
        self.max_ahead = max_ahead
        self.num_threads = num_threads
        self.address = address
        self.cohort_size = cohort_size
        self.train_locally = train_locally
        self.reuse_workers = reuse_workers
        #: What the last run's executor did: ``jobs_remote`` (trained on workers), ``jobs_local`` (jobs that stay
        #: in this process), ``jobs_trained_locally`` (shipped jobs this process trained, ``train_locally``),
        #: ``jobs_recomputed``, ``worker_restarts``, ``max_results_waiting``, ``worker_seconds`` (the workers' time
        #: spent training, summed; divided by wall time and workers it is their utilisation) and ``local_seconds``
        #: (this process's, ``train_locally``), reported in the run summary.
        self.stats: dict[str, float] = {}
        self._ray: Any = None
        self._workers: list[Any] = []
        self._local: Any = None
        self._ship_all = True
        self._cohort = False

    # -- lifetime ---------------------------------------------------------------------------------------------------
    def start(
        self,
        make_trainer: Callable[[torch.device], Any],
        device: torch.device,
        callbacks: Sequence[Any] = (),
        cohort: bool = False,
        num_threads: int = 1,
    ) -> RayExecutor:
        """Start the workers for one run (``FederatedTrainer.fit`` calls this).

        Args:
            make_trainer: Builds the engine's local trainer on a device (called once on each worker, and in this
                process for the jobs that stay here).
            device: The run's device (where the jobs that stay in this process train).
            callbacks: The client callbacks (jobs leave this process only if every one ``runs_on_workers``).
            cohort: The engine is the cohort engine (jobs are shipped in cohorts, trained with ``train_many``).
            num_threads: The run's intra-op threads (the workers' unless ``num_threads`` was set).
        """
        ray = self._ray = _import_ray()
        self.stop()
        if device.type == "cuda" and self.num_gpus_per_worker == 0:
            raise ValueError(
                "accelerator='cuda' with CPU Ray workers: set RayExecutor(num_gpus_per_worker=...) (e.g. 1, or 0.25 "
                "to share a GPU between four workers), or accelerator='cpu'"
            )
        if not ray.is_initialized():
            if self.address is not None:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            elif self.num_workers is None:  # every CPU of this machine: one worker per core
                ray.init(include_dashboard=False, log_to_driver=False)
            else:
                cpus = math.ceil(self.num_workers * max(self.num_cpus_per_worker, 1))
                ray.init(num_cpus=max(cpus, 1), include_dashboard=False, log_to_driver=False)
        worker_device = "cuda" if self.num_gpus_per_worker > 0 else "cpu"
        if self.train_locally and torch.device(device).type != worker_device:
            raise ValueError(
                f"train_locally=True trains jobs on this process's device ({torch.device(device).type}) and the "
                f"workers train on {worker_device}: the two would give different results; set train_locally=False, "
                "or run on the workers' kind of device (accelerator='cuda' with num_gpus_per_worker > 0)"
            )
        self._device, self._cohort = torch.device(device), cohort
        # the engine of jobs trained here, built now as the sequential executor builds its own: from the module as
        # it is at the start (hooks may change the global model later) and with the run's own client callbacks
        # (FedASMU's slot policy learns from the jobs that stay here)
        self._local = make_trainer(self._device)
        local = [type(cb).__name__ for cb in callbacks if not getattr(cb, "runs_on_workers", False)]
        self._ship_all = not local
        if local:
            log.warning(
                "lit_asyncfl: executor='ray' trains this run's jobs in the simulation's process: the client "
                "callback(s) %s keep state across jobs (they do not declare runs_on_workers)",
                ", ".join(local),
            )
        n = self.num_workers or self._default_workers(ray)
        self._worker_device = worker_device
        self._threads = self.num_threads or num_threads
        self._window = self.max_ahead or 4 * (n + self.train_locally)
        self._trainer_ref = ray.put(make_trainer)  # the module and every client's data, shipped once
        self._settings = _torch_settings()  # what the workers train with (and this process, train_locally)
        self._actor = ray.remote(num_cpus=self.num_cpus_per_worker, num_gpus=self.num_gpus_per_worker)(_Worker)
        session = (ray.get_runtime_context().get_job_id(), ray.get_runtime_context().get_node_id())
        self._pool_key = (session, self.num_cpus_per_worker, self.num_gpus_per_worker)
        for key in [k for k in _IDLE if k[0] != session]:  # another Ray session's: stale handles
            del _IDLE[key]
        idle = _IDLE.setdefault(self._pool_key, [])
        self._workers = [idle.pop() if idle else self._actor.remote() for _ in range(n)]
        self._load_engines(self._workers)
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}
        self._queue: list[tuple[float, int]] = []  # unshipped jobs: (expected consumption time, job id)
        self._shipped: dict[int, _Shipped] = {}  # job id -> its task, from shipping until the job is consumed
        self._waiting: list[tuple[float, int, _Shipped]] = []  # shipped tasks not on a worker yet (earliest first)
        self._running: dict[Any, _Shipped] = {}  # result ref -> task, for tasks placed on a worker and not received
        self._done: dict[int, ClientUpdate | _Failed] = {}  # received results, until their jobs are consumed
        self._versions: dict[int, Any] = {}  # id(a snapshot) -> its object ref, while the snapshot lives
        self._busy = [0] * n  # tasks placed on each worker and not received
        self._order = itertools.count()
        self._trained_here: set[int] = set()  # jobs this process trained (train_locally), until consumed
        self.stats = dict.fromkeys(
            ("jobs_remote", "jobs_local", "jobs_trained_locally", "jobs_recomputed", "worker_restarts",
             "max_results_waiting"), 0,
        )  # fmt: skip
        self.stats["worker_seconds"] = self.stats["local_seconds"] = 0.0
        return self

    def _default_workers(self, ray: Any) -> int:
        resources = ray.cluster_resources()
        if self.num_gpus_per_worker > 0:
            return max(1, int(resources.get("GPU", 0) / self.num_gpus_per_worker))
        return max(1, int(resources.get("CPU", 1) / max(self.num_cpus_per_worker, 1e-9)))

    def _load_engines(self, workers: list[Any]) -> None:
        """Build the run's engine on ``workers`` and wait: a failure (a module or dataset a worker cannot
        unpickle) is raised here, naming its cause, not as every job's error."""
        ray = self._ray
        try:
            settings = self._settings
            ray.get([w.load.remote(self._trainer_ref, self._worker_device, self._threads, settings) for w in workers])
        except ray.exceptions.RayTaskError as error:
            self.stop()
            raise RuntimeError(f"building the engine on a Ray worker failed: {error}") from None

    def _new_worker(self) -> Any:
        worker = self._actor.remote()
        self._load_engines([worker])
        return worker

    def stop(self) -> None:
        """The run is over: its workers wait for the next run (``reuse_workers``) or end; Ray keeps running.

        Tasks still on the workers (at most :data:`TASKS_PER_WORKER` each) finish and their results are dropped:
        Ray's ``ray.cancel`` of an actor task could leave the actor waiting 30 s for the cancelled task's sequence
        number and then fail its next task (``ActorUnavailableError``, seen with Ray 2.60 in about one test run in
        six), so no task is cancelled."""
        self._shipped, self._done, self._queue, self._versions, self._trained_here = {}, {}, [], {}, set()
        self._waiting, self._running = [], {}
        self._pending, self._trainer_ref = {}, None  # nothing of the run stays alive
        if self._workers and self.reuse_workers:
            for worker in self._workers:
                worker.unload.remote()
            _IDLE.setdefault(self._pool_key, []).extend(self._workers)
        else:
            for worker in self._workers:
                try:
                    self._ray.kill(worker)
                except Exception:  # pragma: no cover (already gone)
                    pass
        self._workers = []
        self._local = None

    @property
    def workers(self) -> list[Any]:
        """The worker actors (e.g. to kill one in a test)."""
        return list(self._workers)

    # -- the executor interface -------------------------------------------------------------------------------------
    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job and ship it to a worker when the look-ahead window has room."""
        self._pending[job.job_id] = (job, start_weights)
        if self._remote(job):
            heapq.heappush(self._queue, (job.arrival_time, job.job_id))
            self._fill()

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed (a shipped job's result is discarded; a task already on
        a worker finishes there, see :meth:`stop`)."""
        entry = self._pending.pop(job_id, None)
        shipped = self._shipped.pop(job_id, None)
        self._done.pop(job_id, None)
        self._trained_here.discard(job_id)
        if shipped is None and entry is not None:
            self._queue = [(t, k) for t, k in self._queue if k != job_id]
            heapq.heapify(self._queue)
        self._fill()

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """The job's update: from its worker, or computed here for jobs that stay in this process."""
        job, start = self._pending[job_id]
        if job_id not in self._shipped:
            if not self._remote(job):
                trainer = self._local_trainer()
                with generators_kept(trainer.device):
                    update = trainer.train(job, start, fresh)
                del self._pending[job_id]
                self.stats["jobs_local"] += 1
                return update
            self._ship([job_id], place=not self.train_locally)  # needed now: shipped even when the window is full
        value = self._collect(job_id)
        if isinstance(value, _Failed):  # the job stays pending, as sequentially (asked again, it is shipped again)
            self._fill()
            raise value.error
        del self._pending[job_id]
        self._fill()
        here = job_id in self._trained_here
        self._trained_here.discard(job_id)
        self.stats["jobs_trained_locally" if here else "jobs_remote"] += 1
        update = value
        update.job = job  # the simulation's own job object
        update.base_weights = start
        update.weights = update.weights.to(start.device)
        return update

    # -- shipping -----------------------------------------------------------------------------------------------
    def _remote(self, job: ClientJob) -> bool:
        """Whether a job is computed on a worker (else here, at its event)."""
        return self._ship_all and job.request_step is None

    def _local_trainer(self) -> Any:
        """The engine of the jobs trained in this process (built at the run's start, see :meth:`start`)."""
        assert self._local is not None
        return self._local

    def _fill(self) -> None:
        """Ship queued jobs, earliest expected arrival first, while the window has room.

        Which jobs form a task depends only on the order of submits and results (never on wall-clock time), so
        cohorts are deterministic; where and when a task trains does not change its result."""
        room = self._window - len(self._shipped)
        if self._cohort:
            while self._queue and len(self._queue) >= self.cohort_size and room > 0:
                batch = [heapq.heappop(self._queue)[1] for _ in range(self.cohort_size)]
                self._ship(batch, popped=True)
                room -= len(batch)
        else:
            while self._queue and room > 0:
                self._ship([heapq.heappop(self._queue)[1]], popped=True)
                room -= 1
        self._place()

    def _ship(self, job_ids: list[int], failures: int = 0, popped: bool = False, place: bool = True) -> None:
        """Make jobs one task, to be placed on the next free worker (``popped``: already taken off the queue;
        ``place=False``: not yet, as this process is about to train it)."""
        if self._cohort and len(job_ids) == 1 and self._queue and failures == 0:  # a needed job takes queued ones
            self._queue = [(t, k) for t, k in self._queue if k != job_ids[0]]
            heapq.heapify(self._queue)
            while self._queue and len(job_ids) < self.cohort_size:
                job_ids.append(heapq.heappop(self._queue)[1])
        elif not popped:  # (a scan of the queue only for a job needed before its turn, or shipped again)
            self._queue = [(t, k) for t, k in self._queue if k not in job_ids]
            heapq.heapify(self._queue)
        jobs = [self._pending[k][0] for k in job_ids]
        starts = [self._pending[k][1] for k in job_ids]
        shipped = _Shipped(list(job_ids), min(job.arrival_time for job in jobs), failures, jobs, starts)
        for k in job_ids:
            self._shipped[k] = shipped
        heapq.heappush(self._waiting, (shipped.key, next(self._order), shipped))
        self.stats["max_results_waiting"] = max(self.stats["max_results_waiting"], len(self._shipped))
        if place:
            self._place()

    def _place(self) -> None:
        """Put waiting tasks, earliest expected arrival first, on workers with fewer than TASKS_PER_WORKER tasks."""
        while self._waiting:
            worker = min(range(len(self._workers)), key=self._busy.__getitem__)
            if self._busy[worker] >= TASKS_PER_WORKER:
                return
            shipped = heapq.heappop(self._waiting)[2]
            if not self._live(shipped):  # every job of it was cancelled before it left
                continue
            assert shipped.jobs is not None and shipped.starts is not None
            jobs = shipped.jobs  # (a cohort trains whole, cancelled jobs too: its results stay the same)
            starts = [self._start_ref(start) for start in shipped.starts]
            actor = self._workers[worker]
            if self._cohort:
                shipped.ref = actor.train_many.remote(jobs, *starts)
            else:
                shipped.ref = actor.train.remote(jobs[0], starts[0])
            shipped.worker, shipped.actor = worker, actor
            self._running[shipped.ref] = shipped
            self._busy[worker] += 1

    def _live(self, shipped: _Shipped) -> bool:
        """Whether any job of a task is still wanted."""
        return any(self._shipped.get(k) is shipped for k in shipped.batch)

    def _start_ref(self, start: Tensor) -> Any:
        """The object-store reference of a start model (a global version's snapshot): put once, the first time a
        job starting from it is shipped, and dropped when the simulation lets go of the snapshot."""
        key = id(start)
        if key not in self._versions:
            self._versions[key] = self._ray.put(_Wire.of(start))
            weakref.finalize(start, self._versions.pop, key, None)
        return self._versions[key]

    def _collect(self, job_id: int) -> ClientUpdate | _Failed:
        """Wait for a shipped job's result, receiving every other task that finishes meanwhile (its worker gets
        the next waiting task at once)."""
        ray = self._ray
        while job_id not in self._done:
            shipped = self._shipped[job_id]
            if self.train_locally and shipped.ref is None:  # no worker has the job due next: it trains here, now
                self._waiting = [entry for entry in self._waiting if entry[2] is not shipped]
                heapq.heapify(self._waiting)
                self._train_here(shipped)
                continue
            self._place()
            finished, _ = ray.wait(list(self._running), num_returns=1, timeout=0 if self.train_locally else None)
            if not finished and self._waiting:  # (train_locally) the workers are busy: the earliest waiting task
                self._train_here(heapq.heappop(self._waiting)[2])
                continue
            if not finished:
                finished, _ = ray.wait(list(self._running), num_returns=1)
            for ref in finished:
                self._receive(self._running.pop(ref))
        del self._shipped[job_id]
        return self._done.pop(job_id)

    def _train_here(self, shipped: _Shipped) -> None:
        """Train a shipped task in this process (``train_locally``), as a worker would: with the workers' thread
        count and torch settings (this process's at the run's start), leaving this process's random generators as
        they were (:func:`generators_kept`: here a job trains at a wall-clock moment); its results wait for their
        jobs like a worker's, and an error is raised when its job is consumed."""
        jobs, starts, shipped.jobs, shipped.starts = shipped.jobs, shipped.starts, None, None
        live = [k for k in shipped.batch if self._shipped.get(k) is shipped]
        if not live:  # every job of it was cancelled before it trained
            return
        assert jobs is not None and starts is not None
        threads, settings, began = torch.get_num_threads(), _torch_settings(), time.perf_counter()
        torch.set_num_threads(self._threads)
        _apply_torch_settings(self._settings)
        try:
            with generators_kept(self._device):
                trainer = self._local_trainer()
                if self._cohort:
                    updates = trainer.train_many(jobs, starts)
                else:
                    updates = [trainer.train(jobs[0], starts[0], None)]
        except Exception as error:
            self._done.update((k, _Failed(error)) for k in live)
            return
        finally:
            torch.set_num_threads(threads)
            _apply_torch_settings(settings)
            self.stats["local_seconds"] += time.perf_counter() - began
        for k, update in zip(shipped.batch, updates):
            if k in live:
                self._done[k] = update
                self._trained_here.add(k)

    def _receive(self, shipped: _Shipped) -> None:
        """A placed task has finished: keep its results for their jobs; a dead worker is replaced and the task's
        jobs are shipped again (the same jobs: the same result)."""
        ray = self._ray
        self._busy[shipped.worker] -= 1
        jobs, starts, shipped.jobs, shipped.starts = shipped.jobs, shipped.starts, None, None
        live = [k for k in shipped.batch if self._shipped.get(k) is shipped]  # (not the cancelled ones)
        try:
            value, seconds = ray.get(shipped.ref)
        except ray.exceptions.RayTaskError as error:  # the job itself raised: raised when it is consumed
            cause = error.cause if isinstance(getattr(error, "cause", None), Exception) else error
            self._done.update((k, _Failed(cause)) for k in live)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:  # worker or node lost
            self._replace_worker(shipped.worker, shipped.actor)
            if not live:
                return
            if shipped.failures + 1 >= MAX_WORKER_FAILURES:
                failure = RuntimeError(f"a Ray worker died {MAX_WORKER_FAILURES} times computing job {live[0]}")
                failure.__cause__ = error
                self._done.update((k, _Failed(failure)) for k in live)
                return
            self.stats["jobs_recomputed"] += len(live)
            again = _Shipped(shipped.batch, shipped.key, shipped.failures + 1, jobs, starts)  # same task, same results
            for k in live:
                self._shipped[k] = again
            heapq.heappush(self._waiting, (again.key, next(self._order), again))
            return
        self.stats["worker_seconds"] += seconds
        for k, (update, weights) in zip(shipped.batch, value if isinstance(value, list) else [value]):
            if self._shipped.get(k) is shipped:  # (a cohort's other jobs wait here, ready)
                update.weights = weights.tensor()
                self._done[k] = update

    def _replace_worker(self, index: int, actor: Any) -> None:
        """Replace a dead worker (once: the other tasks it had find it replaced already)."""
        if self._workers[index] is not actor:
            return
        try:
            self._ray.kill(actor)
        except Exception:  # pragma: no cover
            pass
        self._workers[index] = self._new_worker()
        self.stats["worker_restarts"] += 1
