"""``RayExecutor``: in-flight client jobs computed on Ray workers, consumed in virtual-time order.

Every dispatched job's start model is known at dispatch and its seed is its own, so jobs are independent until their
updates are consumed. The executor ships each job to a worker as soon as it is submitted (within a look-ahead
window) and hands its update to the simulator at the job's event: the simulator alone decides the order in which
updates are applied, so the weights equal the sequential executor's exactly (on CPU, with the same engine and
thread count) whatever the number of workers or the order in which they finish.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check, check_bool, check_int, check_number, check_str
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generators_kept
from lit_asyncfl.executors.ray.placement import _due, _Failed, _Shipped
from lit_asyncfl.executors.ray.pool import _WorkerPool
from lit_asyncfl.executors.ray.requests import _asks_server, _Requests
from lit_asyncfl.executors.ray.wire import _Shared, _SharedFiles
from lit_asyncfl.executors.ray.worker import _import_ray, _torch_settings, carried, detached

log = logging.getLogger("lit_asyncfl")

#: Accepted ``executor`` names (``FederatedTrainer(executor=...)``; a :class:`RayExecutor` object is accepted too).
EXECUTORS = ("sequential", "ray")


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


class RayExecutor(_WorkerPool, _Requests):  # (the pool first: its _replace_worker, not placement's stub)
    """Computes client jobs on Ray workers (``FederatedTrainer(executor=RayExecutor(...))``, or ``executor="ray"``
    for the defaults; ``--trainer.executor=ray`` on the command line).

    Jobs are shipped as soon as they are dispatched, earliest expected arrival first, and at most ``max_ahead``
    shipped jobs wait to be consumed (so at most that many results, plus the in-flight jobs' start models, are
    alive). Each worker holds at most :data:`TASKS_PER_WORKER` of them (one training, one queued); the others wait in
    this process and go, due first, to whichever worker frees up first, so the update the simulation needs next is
    never stuck behind a long queue on a busy worker while another worker idles. Only this process gives workers
    tasks, so before it is busy for a while it gives them more: before an evaluation during the run (:meth:`pause`),
    and with ``train_locally`` before it trains a job itself. Each global version goes into Ray's
    object store once and every job starting from it refers to it. Each worker builds the engine once: the module
    copy and the clients' data stay resident on it. With ``train_locally`` workers run at the priority of Ray's node
    processes, as peers of this process (:data:`~lit_asyncfl.executors.ray.pool.WORKER_RUNTIME_ENV`; Ray's default,
    kept otherwise, runs them 15 ``nice`` levels lower, and a worker sharing a core with this process lost it).

    Client callbacks with state across jobs declare
    :attr:`~lit_asyncfl.client_callbacks.ClientCallback.carries_state` (MOON, FedDyn, ASO-Fed, FedSA, FedASMU, local
    DP): a job carries its client's part of the state to the worker (read when it is shipped; a later job of the
    same client is never shipped before it is consumed) and brings what it learned back, committed when its update
    is consumed, where the sequential executor learns it; the client state store stays here, its single owner. A job
    that asks the server mid-training (FedASMU's fresh-model request) trains in parts with the ``fast`` engine: up
    to its request as soon as it is shipped, parked on its worker with an engine of its own; at the request event
    its merge is computed once, on that worker when it is free, else here from the job's state at its request
    (``merges_from_request_state``), and learned from here (:meth:`request`); the rest, after the merge, trains on
    the job's worker and is collected at the job's arrival (an error
    raised after the request fails the job there, as with the sequential executor); with a carried callback that
    learns from a job's end (``learns_from_job_result``) it is collected at the request event instead, and what the
    job taught committed there, where the sequential executor trains the whole job. What stays in the simulation's
    process (computed at its event, counted in :attr:`stats` as ``jobs_local``, named by a warning at the start):
    every job of a run with a callback that declares neither ``runs_on_workers`` nor ``carries_state``, and jobs with a
    request under the ``lightning`` engine (trained whole at the request event).

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
            seeds and thread count), after giving the workers waiting tasks for as long as that job will take it
            (at the paces measured so far). Where the workers share this process's cores, ``num_workers`` one below the
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
        #: ``jobs_recomputed``, ``worker_restarts``, ``max_results_waiting``, ``merges_here`` and
        #: ``merges_on_workers`` (where the merges of jobs with a request were computed, each once;
        #: ``merges_from_state``, among ``merges_here``, counts those computed from the state at its request of a
        #: job parked on a busy worker, whose effects then go to that worker),
        #: ``worker_seconds`` (the workers' time
        #: spent training, summed; divided by wall time and workers it is their utilisation), ``local_seconds``
        #: (this process's: ``train_locally``'s jobs and the merges of parked jobs), ``wait_seconds`` (this
        #: process's time waiting for a worker's result), ``request_seconds`` (its time at request events, until
        #: the merge's learning is known: waiting or computing), and the CPU time of the trainers' tasks and the local
        #: steps they trained: ``worker_cpu_seconds`` and ``worker_steps`` (the workers' tasks), ``local_cpu_seconds``
        #: (the tasks this process trained, ``train_locally``, and the merges it computed; ``merge_cpu_seconds``: those
        #: merges' alone) and ``local_steps`` (those tasks'; a merge trains no step, so a step's CPU time here is
        #: ``local_cpu_seconds - merge_cpu_seconds`` over it): CPU seconds per step, compared with a sequential run's
        #: (without its merges), say how much
        #: slower a step computes beside the other trainers (what the cores share), apart from the time another
        #: process held the core; reported in the run summary. The CPU time is ``time.thread_time()``, the thread
        #: that runs the task: it is meaningless with more than one intra-op thread (``num_threads``), whose other
        #: threads it leaves out, and on GPU workers.
        self.stats: dict[str, float] = {}
        self._ray: Any = None
        self._workers: list[Any] = []
        self._building: list[tuple[Any, Any]] = []
        self._files: _SharedFiles | None = None
        self._reading: set[Any] = set()
        self._pipes: dict[Any, Any] = {}
        self._sockets: dict[Any, str] = {}
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
        self._start_ray(ray)
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
        local = [
            type(cb).__name__
            for cb in callbacks
            if not getattr(cb, "runs_on_workers", False) and not getattr(cb, "carries_state", False)
        ]
        self._ship_all = not local
        self._carried = carried(callbacks)  # (the run's own: they commit what the jobs bring back)
        # a job with a request is collected whole at its request event, its callbacks' learning committed there (as
        # sequentially, where it trains whole then), unless every carried callback learns nothing from a job's end
        self._whole = any(getattr(cb, "learns_from_job_result", True) for cb in self._carried)
        self._parts = hasattr(self._local, "train_parts")  # jobs with a request go in parts (the fast engine)
        requests = [type(cb).__name__ for cb in callbacks if _asks_server(cb)]
        stay = []
        if local:
            stay.append(f"every job: the client callback(s) {', '.join(local)} keep state across jobs and declare "
                        "neither runs_on_workers nor carries_state")  # fmt: skip
        elif requests and not self._parts:
            stay.append(f"the jobs of {', '.join(requests)} that ask the server mid-training: with "
                        f"{type(self._local).__name__} they train whole at their request (engine='fast' splits "
                        "them)")  # fmt: skip
        if stay:
            log.warning(
                "lit_asyncfl: executor='ray' trains %s in the simulation's process%s",
                stay[0],
                f", on {torch.device(device)}, not on the GPU workers" if worker_device == "cuda" else "",
            )
        n = self.num_workers or self._default_workers(ray)
        self._worker_device = worker_device
        self._threads = self.num_threads or num_threads
        self._window = self.max_ahead or 4 * (n + self.train_locally)
        with detached(callbacks):  # the client state store stays here: jobs carry their entries
            self._trainer_ref = ray.put(make_trainer)  # the module and every client's data, shipped once
        self._settings = _torch_settings()  # what the workers train with (and this process, train_locally)
        self._start_workers(ray, n)
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}
        self._queue: list[tuple[float, int]] = []  # unshipped jobs: (expected consumption time, job id)
        self._shipped: dict[int, _Shipped] = {}  # job id -> its task, from shipping until the job is consumed
        self._waiting: list[tuple[float, int, _Shipped]] = []  # shipped tasks not on a worker yet (earliest first)
        self._running: dict[Any, _Shipped] = {}  # result ref -> task, for tasks placed on a worker and not received
        self._done: dict[int, ClientUpdate | _Failed] = {}  # received results, until their jobs are consumed
        self._versions: dict[int, Any] = {}  # id(a snapshot) -> its object ref, while the snapshot lives
        self._shared_starts: dict[int, _Shared] = {}  # id(a snapshot) -> its file in shared memory, while it lives
        self._busy = [0] * n  # tasks placed on each worker and not received
        self._order = itertools.count()
        self._trained_here: set[int] = set()  # jobs this process trained (train_locally), until consumed
        self._pace = {"worker": [0.0, 0.0], "here": [0.0, 0.0]}  # (seconds, steps) trained: see _place's reserve
        self._pause_seconds: float | None = None  # how long the last pause lasted
        self._parked: dict[int, tuple[int, Any]] = {}  # job id -> (worker index or -1: here, actor): first part done
        self._merged: dict[int, list[Any]] = {}  # job id -> what its merge taught, until its request event takes it
        self._points: dict[int, Any] = {}  # job id -> its state at its request (parked), until its request event
        self._after: dict[int, ClientUpdate | _Failed] = {}  # jobs collected at their request, or failed after it
        self._stay: set[int] = set()  # jobs computed here, at their events
        self._here, self._merge_runner = self._runners(make_trainer, callbacks)
        self.stats = dict.fromkeys(
            ("jobs_remote", "jobs_local", "jobs_trained_locally", "jobs_recomputed", "worker_restarts",
             "max_results_waiting", "merges_here", "merges_from_state", "merges_on_workers", "worker_steps",
             "local_steps"), 0,
        )  # fmt: skip
        self.stats.update(dict.fromkeys(
            ("worker_seconds", "local_seconds", "wait_seconds", "request_seconds", "worker_cpu_seconds",
             "local_cpu_seconds", "merge_cpu_seconds"), 0.0,
        ))  # fmt: skip
        return self

    def stop(self) -> None:
        """The run is over: its workers wait for the next run (``reuse_workers``) or end; Ray keeps running.

        Tasks still placed on the workers (:data:`TASKS_PER_WORKER` each, or more where they got tasks before this
        process was busy: after the final evaluation's pause, every rest of a job parked on them) finish and their
        results are dropped: Ray's ``ray.cancel`` of an actor task could leave the actor waiting 30 s for the
        cancelled task's sequence number and then fail its next task (``ActorUnavailableError``, seen with Ray 2.60
        in about one test run in six), so no task is cancelled."""
        self._shipped, self._done, self._queue, self._versions, self._trained_here = {}, {}, [], {}, set()
        self._shared_starts = {}
        self._waiting, self._running = [], {}
        self._pending, self._trainer_ref = {}, None  # nothing of the run stays alive
        self._parked, self._stay, self._here, self._merged, self._after = {}, set(), None, {}, {}
        self._points, self._merge_runner = {}, None
        self._stop_workers()
        self._local = None

    @property
    def workers(self) -> list[Any]:
        """The worker actors (e.g. to kill one in a test)."""
        return list(self._workers)

    # -- the executor interface -------------------------------------------------------------------------------------
    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job and ship it to a worker when the look-ahead window has room."""
        remote = self._remote(job)
        self._pending[job.job_id] = (job, start_weights)
        if remote:
            heapq.heappush(self._queue, (_due(job), job.job_id))
            self._fill()
        else:
            self._stay.add(job.job_id)

    @contextlib.contextmanager
    def pause(self, final: bool = False) -> Iterator[None]:
        """This process does other work than jobs inside (an evaluation of the global model): the workers first get
        waiting tasks for as long as the last pause lasted, at their measured pace (every waiting task before the
        first pause, or before they have trained anything), since only this process gives them tasks. ``final``: the
        run's last evaluation, after its loop: the workers get only the rests of the jobs past their request parked
        on them (see :meth:`_place_rests`), which the end-of-run checkpoint waits for. Where jobs train does not
        change their results."""
        if not self._workers:  # (not started)
            yield
            return
        if final:
            self._poll()
            self._place_rests()
            yield
            self._built()
            return
        seconds, steps = self._pace["worker"]
        known = self._pause_seconds is not None and seconds > 0 and steps > 0
        self._poll()
        self._place(reserve=self._pause_seconds * steps / seconds if known else math.inf)  # type: ignore[operator]
        began = time.perf_counter()
        try:
            yield
        finally:
            self._pause_seconds = time.perf_counter() - began
        self._built()  # (the initial evaluation overlapped the workers' engine builds: a failure is raised now)

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed (a shipped job's result is discarded; a task already on
        a worker finishes there, see :meth:`stop`)."""
        entry = self._pending.pop(job_id, None)
        shipped = self._shipped.pop(job_id, None)
        self._done.pop(job_id, None)
        self._trained_here.discard(job_id)
        self._stay.discard(job_id)
        self._merged.pop(job_id, None)
        self._after.pop(job_id, None)
        self._points.pop(job_id, None)
        if shipped is not None and shipped.part == 2 and shipped.ref is None:  # parked, its rest not placed yet
            if shipped.worker < 0:
                self._here.discard(job_id)
            else:
                self._tell(shipped.actor, "discard", job_id)
        worker, actor = self._parked.pop(job_id, (None, None))
        if worker is not None and worker < 0:
            self._here.discard(job_id)
        elif actor is not None:
            self._tell(actor, "discard", job_id)
        if shipped is None and entry is not None:
            self._queue = [(t, k) for t, k in self._queue if k != job_id]
            heapq.heapify(self._queue)
        self._fill()

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """The job's update: from its worker, or computed here for jobs that stay in this process (a job with a
        request: the rest after its merge, see :meth:`request`)."""
        if job_id in self._after:  # collected at its request, or failed after it
            outcome = self._after[job_id]
            if isinstance(outcome, _Failed):
                raise outcome.error  # (kept: asked again, it raises again)
            del self._after[job_id]
            self._pending.pop(job_id, None)  # (a job collected at its request left it then)
            if job_id in self._stay:
                self._stay.discard(job_id)
                self.stats["jobs_local"] += 1
            return outcome
        job, start = self._pending[job_id]
        if job_id in self._stay:
            trainer = self._local_trainer()
            with generators_kept(trainer.device):
                update = trainer.train(job, start, fresh)
            del self._pending[job_id]
            self._stay.discard(job_id)
            self.stats["jobs_local"] += 1
            return update
        if job_id not in self._shipped:
            if job.request_step is not None:
                raise RuntimeError(f"job {job_id}'s update was asked for before its request event")
            self._ship([job_id], place=not self.train_locally)  # needed now: shipped even when the window is full
        value = self._consume(job_id)
        if isinstance(value, _Failed):
            raise value.error
        return value

    def _consume(self, job_id: int) -> ClientUpdate | _Failed:
        """Collect a shipped job's update and commit what its carried callbacks learned (as the sequential executor
        learns it, at the end of the job's training); a failed job stays pending (asked again, it is shipped again),
        except one with a request, whose merge was learned from (its failure is kept and raised again)."""
        job, start = self._pending[job_id]
        value = self._collect(job_id)
        if isinstance(value, _Failed):
            if job.request_step is not None:  # (never again: its merge was learned from)
                self._after[job_id] = value
            self._fill()
            return value
        del self._pending[job_id]
        self._fill()
        here = job_id in self._trained_here
        self._trained_here.discard(job_id)
        self.stats["jobs_trained_locally" if here else "jobs_remote"] += 1
        update, results = value
        for cb, result in zip(self._carried, results):  # what the job learned, committed now, as sequentially
            cb.commit_job_result(job, result)
        update.job = job  # the simulation's own job object
        update.base_weights = start
        update.weights = update.weights.to(start.device)
        return update
