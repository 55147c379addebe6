"""The Ray executor's placement: which jobs leave the simulation's process, how they are grouped into tasks, and
which worker (or this process, ``train_locally``) trains each task when; results wait here until their jobs are
consumed. Which jobs form a task depends only on the order of submits and results, never on wall-clock time."""

from __future__ import annotations

import contextlib
import copy
import heapq
import logging
import math
import select
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.core.jobs import ExecutorError
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generators_kept
from lit_asyncfl.executors.ray.pipe import _Call, _finished, _Lost, _Pipe
from lit_asyncfl.executors.ray.wire import INLINE_BYTES, _dropped, _inline, _read_once, _Shared, _SharedFiles, _Wire
from lit_asyncfl.executors.ray.worker import Took, _apply_torch_settings, _torch_settings

log = logging.getLogger("lit_asyncfl")

#: How many times a job whose worker died is recomputed on a new worker before the job fails.
MAX_WORKER_FAILURES = 3

#: Tasks placed on one worker at a time: one training, one waiting (it hides the round trip). Every other shipped
#: task waits in this process, earliest expected arrival first, and goes to whichever worker frees up first (more go
#: before this process is busy elsewhere: see ``_Placement._place``'s ``reserve``).
TASKS_PER_WORKER = 2


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
    states: list[Any] | None = None  # what the carried callbacks' state a (single) job reads, taken when shipped
    #: 0: the whole job; 1: up to its request (then parked); 2: the rest of a parked job after its merge (on the
    #: worker it is parked on, or here: ``worker`` -1); 3: the merge of a parked job with ``fresh``, where it is
    #: parked (its learning goes back; the job stays parked for its part 2)
    part: int = 0
    fresh: tuple[Tensor, int] | None = None  # the server's answer to the job's request (parts 0, 2 and 3)
    from_start: bool = False  # (part 3) the job's part before its request trains first: it is parked nowhere
    merged: Any = None  # (part 2) what its merge changed, computed in this process (``None``: where it is parked)


@dataclass
class _Failed:
    """A job's result when its task raised on a worker: raised when the job is consumed, as sequentially
    (``lost``: its workers died, the job itself raised nothing)."""

    error: BaseException
    lost: bool = False


class _Placement:
    """The shipping half of :class:`~lit_asyncfl.executors.ray.executor.RayExecutor` (its base class): the queue
    of jobs not shipped yet, the tasks waiting for a worker, the tasks on workers and the received results. The run's
    state it works on is set by ``RayExecutor.start`` and cleared by ``RayExecutor.stop``."""

    _ray: Any
    _workers: list[Any]
    _local: Any
    _device: torch.device
    _threads: int
    _settings: dict[str, Any]
    _ship_all: bool
    _cohort: bool
    _window: int
    cohort_size: int
    train_locally: bool
    stats: dict[str, float]
    _pending: dict[int, tuple[ClientJob, Tensor]]
    _queue: list[tuple[float, int]]
    _shipped: dict[int, _Shipped]
    _waiting: list[tuple[float, int, _Shipped]]
    _running: dict[Any, _Shipped]
    _done: dict[int, ClientUpdate | _Failed]
    _versions: dict[int, Any]  # id(a start model) -> its object-store reference (None: sent inside a task once)
    _shared_starts: dict[int, _Shared]  # id(a start model) -> its file in shared memory (workers on this node)
    _files: _SharedFiles | None
    _reading: set[Any]
    _pipes: dict[Any, _Pipe]  # worker -> its socket, where tasks go to it (workers on this node)
    _busy: list[int]
    _order: Any
    _trained_here: set[int]

    _carried: list[Any]
    _parts: bool
    _here: Any
    _parked: dict[int, tuple[int, Any]]
    _merged: dict[int, list[Any]]
    _points: dict[int, Any]
    _whole: bool
    #: seconds and local steps trained on the workers, and here (``train_locally``): their pace
    _pace: dict[str, list[float]]

    def _remote(self, job: ClientJob) -> bool:
        """Whether a job is computed on a worker (else here, at its event): every callback runs on workers or
        carries its state, a job with a request can be split there (``fast`` engine), and a job carrying state
        has no earlier job of its client in flight (whose result it would read)."""
        if not self._ship_all or (job.request_step is not None and not self._parts):
            return False
        if self._carried:
            return not any(j.client == job.client and k != job.job_id for k, (j, _) in self._pending.items())
        return True

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
        shipped = _Shipped(list(job_ids), min(map(_due, jobs)), failures, jobs, starts)
        if not self._cohort:
            shipped.states = [cb.job_state(jobs[0]) for cb in self._carried] if self._carried else None
            shipped.part = 1 if jobs[0].request_step is not None else 0
        for k in job_ids:
            self._shipped[k] = shipped
        heapq.heappush(self._waiting, (shipped.key, next(self._order), shipped))
        self.stats["max_results_waiting"] = max(self.stats["max_results_waiting"], len(self._shipped))
        if place:
            self._place()

    def _place(self, reserve: float = 0.0) -> None:
        """Put waiting tasks, earliest expected arrival first, on workers with fewer than TASKS_PER_WORKER tasks,
        or whose tasks behind the one they train hold fewer than ``reserve`` local steps (this process is about to
        be busy for about that long: training a task itself, evaluating; a worker must not run dry meanwhile,
        since only this process places tasks); the merge and the rest of a parked job (parts 3 and 2) wait for the
        worker it is parked on (or for this process)."""
        aside = []
        while self._waiting:
            free = [
                w
                for w in range(len(self._workers))
                if self._busy[w] < TASKS_PER_WORKER or (reserve > 0 and self._queued_steps(w) < reserve)
            ]
            if not free:
                break
            entry = heapq.heappop(self._waiting)
            shipped = entry[2]
            if not self._live(shipped):  # every job of it was cancelled before it left
                continue
            worker = min(free, key=self._busy.__getitem__)
            if _pinned(shipped):  # parked: on its worker, or here (worker -1)
                if shipped.worker >= 0 and self._workers[shipped.worker] is not shipped.actor:  # it died meanwhile
                    if shipped.part == 2:
                        shipped.part = 0  # the whole job, with the answer (its merge was learned from already)
                    else:
                        shipped.from_start = True  # the merge, from the start on the next free worker
                elif shipped.worker not in free:
                    aside.append(entry)
                    continue
                else:
                    worker = shipped.worker
            assert shipped.jobs is not None and shipped.starts is not None
            jobs, starts = shipped.jobs, shipped.starts  # (a cohort trains whole, cancelled jobs too: same results)
            actor = self._workers[worker]
            files = self._files if actor in self._reading else None  # (a worker on this node: through shared memory)
            inline = actor in self._pipes  # (a task through a socket carries every tensor it does not find in a file)
            if self._cohort:
                shipped.ref = self._call(actor, "train_many", jobs, *map(self._start_ref, starts))
            elif shipped.part == 1:
                start = self._start_args(starts[0], files, inline)
                shipped.ref = self._call(actor, "first_part", jobs[0], shipped.states, *start)
            elif shipped.part == 3:  # (from the start: a job parked nowhere, see _merge)
                first = (shipped.states, *self._start_args(starts[0], files, inline)) if shipped.from_start else ()
                shipped.ref = self._call(actor, "merge", jobs[0], _wired(shipped.fresh, files), *first)
            elif shipped.part == 2:
                merged, pieces = _wired_merge(shipped.merged, files)
                shipped.ref = self._call(actor, "resume", jobs[0], merged, *pieces)
            else:
                start = self._start_args(starts[0], files, inline)
                shipped.ref = self._call(actor, "train", jobs[0], shipped.states, _wired(shipped.fresh, files), *start)
            shipped.worker, shipped.actor = worker, actor
            self._running[shipped.ref] = shipped
            self._busy[worker] += 1
        for entry in aside:
            heapq.heappush(self._waiting, entry)

    def _pace_ratio(self) -> float:
        """How many of a worker's local steps last as long as one of this process's (1 until both have trained)."""
        (worker, worker_steps), (here, here_steps) = self._pace["worker"], self._pace["here"]
        if not (worker and worker_steps and here and here_steps):
            return 1.0
        return (here / here_steps) / (worker / worker_steps)

    def _queued_steps(self, worker: int) -> int:
        """The local steps of the tasks placed on ``worker`` behind the first one (the one it trains, or has
        trained and not handed back yet)."""
        placed = [shipped for shipped in self._running.values() if shipped.worker == worker]
        return sum(_steps(shipped) for shipped in placed[1:])

    def _poll(self) -> bool:
        """Receive every task that has finished, without waiting; whether any was received."""
        if not self._running:
            return False
        finished = self._finished(block=False)
        for ref in finished:
            self._receive(self._running.pop(ref))
        return bool(finished)

    def _take(self, task: _Shipped) -> None:
        """Take a waiting task off the tasks waiting for a worker (this process trains it)."""
        self._waiting = [entry for entry in self._waiting if entry[2] is not task]
        heapq.heapify(self._waiting)

    def _live(self, shipped: _Shipped) -> bool:
        """Whether any job of a task is still wanted."""
        return any(self._shipped.get(k) is shipped for k in shipped.batch)

    def _call(self, actor: Any, method: str, *args: Any) -> Any:
        """Give a worker a task (its method with ``args``): through its socket where it has one, else as a Ray actor
        call; the task's reference (a :class:`~lit_asyncfl.executors.ray.pipe._Call`, or Ray's)."""
        pipe = self._pipes.get(actor)
        return pipe.call(method, *args) if pipe is not None else getattr(actor, method).remote(*args)

    def _tell(self, actor: Any, method: str, *args: Any) -> None:
        """Give a worker a task whose result nobody reads (in order with its others)."""
        pipe = self._pipes.get(actor)
        if pipe is not None:
            pipe.tell(method, *args)
        else:
            getattr(actor, method).remote(*args)

    def _finished(self, block: bool) -> list[Any]:
        """The tasks on workers that finished (``block``: waiting for one): their sockets' and Ray's alike."""
        calls = [ref for ref in self._running if isinstance(ref, _Call)]
        refs = [ref for ref in self._running if not isinstance(ref, _Call)]
        if not refs:
            return list(_finished(calls, block))
        if not calls:
            return self._ray.wait(refs, num_returns=1 if block else len(refs), timeout=None if block else 0)[0]
        while True:  # (both: tasks that left before every worker's socket was known)
            done = [*_finished(calls, block=False), *self._ray.wait(refs, num_returns=len(refs), timeout=0)[0]]
            if done or not block:
                return done
            select.select([call.pipe for call in calls if not call.pipe.closed], [], [], 0.002)

    def _start_args(self, start: Tensor, files: _SharedFiles | None = None, inline: bool = False) -> list[Any]:
        """A single job's start model (a global version's snapshot) as its task's last arguments: for a worker on
        this node (``files``), its file in shared memory (written once, for every job starting from it, and removed
        when the simulation lets go of the snapshot); else inside the task the first time a job starting from it is
        placed (:func:`_inline`, up to :data:`INLINE_BYTES`), else as the reference of its copy in Ray's object
        store (:meth:`_start_ref`: put once, the second time, for every later job starting from it). A version one
        job starts from (FedAsync's) thus goes straight to the worker with its task: ``ray.put`` waits for the
        raylet (its object store) to create and seal the object, which held this process 2.6 ms of wall time per put
        (0.7 ms of CPU) while both cores trained, and the worker's read of the argument waits for it again."""
        key = id(start)
        if files is not None:
            shared = self._shared_starts.get(key)
            if shared is None:
                written = files.write(start, taken=False)
                if isinstance(written, _Shared):  # (else shared memory is full: Ray's routes)
                    self._shared_starts[key] = shared = written
                    weakref.finalize(start, _forget_file, self._shared_starts, key)
            if shared is not None:
                return [shared]
        if inline:
            return [_Wire.of(start)]
        if key not in self._versions and start.numel() * start.element_size() <= INLINE_BYTES:
            self._versions[key] = None  # (sent once: a later job starting from it reads the object store's copy)
            weakref.finalize(start, self._versions.pop, key, None)
            stand_ins, pieces = _inline([start])
            return [*stand_ins, *pieces]
        return [self._start_ref(start)]

    def _start_ref(self, start: Tensor) -> Any:
        """The object-store reference of a start model (a global version's snapshot): put once, the first time a
        job starting from it needs it, and dropped when the simulation lets go of the snapshot."""
        key = id(start)
        if self._versions.get(key) is None:
            if key not in self._versions:
                weakref.finalize(start, self._versions.pop, key, None)
            self._versions[key] = self._ray.put(_Wire.of(start))
        return self._versions[key]

    def _collect(self, job_id: int, parked: bool = False, merged: bool = False) -> Any:
        """Wait for a shipped job's result (``parked``: or for its first part to be parked; ``merged``: or for what
        its merge taught, then returned), receiving every other task that finishes meanwhile (its worker gets the
        next waiting task at once)."""
        while job_id not in self._done and not (
            (parked and job_id in self._parked) or (merged and job_id in self._merged)
        ):
            if self.train_locally:  # this process trains, while it waits, what no worker has
                shipped = self._shipped[job_id]
                task = shipped if shipped.ref is None and _here(shipped) else None  # no worker has the job due
                if task is not None:  # next: it trains here, now
                    self._take(task)
                if self._poll() and task is None:  # (the finished tasks first: their workers get the next ones
                    continue  # before this process trains; the job may be done)
                mine = [entry for entry in self._waiting if _here(entry[2])]
                if task is None and mine:  # else the earliest waiting task this process can train
                    task = min(mine)[2]
                    self._take(task)
                if task is not None:
                    self._place(reserve=_steps(task) * self._pace_ratio())  # the workers get enough meanwhile
                    self._train_here(task)
                    continue
            self._place()
            if not self._running:  # (nothing on a worker: the result can never come; ray.wait would block forever)
                raise ExecutorError(
                    f"the Ray executor has no task on a worker that could give job {job_id}'s result (was it stopped?)"
                )
            began = time.perf_counter()
            finished = self._finished(block=True)
            self.stats["wait_seconds"] += time.perf_counter() - began
            for ref in finished:
                self._receive(self._running.pop(ref))
        if merged and job_id in self._merged:
            return self._merged.pop(job_id)
        if job_id not in self._done:
            return None
        del self._shipped[job_id]
        return self._done.pop(job_id)

    @contextlib.contextmanager
    def _like_a_worker(self) -> Iterator[None]:
        """Compute in this process as a worker would: with the workers' thread count and torch settings (this
        process's at the run's start), leaving this process's random generators as they were."""
        threads, settings = torch.get_num_threads(), _torch_settings()
        torch.set_num_threads(self._threads)
        _apply_torch_settings(self._settings)
        try:
            with generators_kept(self._device):
                yield
        finally:
            torch.set_num_threads(threads)
            _apply_torch_settings(settings)

    def _train_here(self, shipped: _Shipped) -> None:
        """Train a shipped task in this process (``train_locally``), as a worker would: with the workers' thread
        count and torch settings (this process's at the run's start), leaving this process's random generators as
        they were (:func:`generators_kept`: here a job trains at a wall-clock moment); its results wait for their
        jobs like a worker's, and an error is raised when its job is consumed."""
        steps, trained = _steps(shipped), _trained_steps(shipped)
        jobs, starts, shipped.jobs, shipped.starts = shipped.jobs, shipped.starts, None, None
        live = [k for k in shipped.batch if self._shipped.get(k) is shipped]
        if not live:  # every job of it was cancelled before it trained
            return
        assert jobs is not None and starts is not None
        runner, began, cpu = self._here, time.perf_counter(), time.thread_time()
        try:
            with self._like_a_worker():
                if self._cohort:
                    done = [(u, []) for u in runner.train_many(jobs, starts)]
                elif shipped.part == 1:
                    point = runner.first_part(jobs[0], starts[0], shipped.states)
                    self._parked[shipped.batch[0]] = (-1, None)
                    if point is not None:
                        self._points[shipped.batch[0]] = point
                    return
                elif shipped.part == 2:
                    done = [runner.resume(jobs[0], shipped.merged)]
                elif shipped.part == 3:  # the merge (its rest waits, parked here, for its turn)
                    if shipped.from_start:
                        runner.first_part(jobs[0], starts[0], shipped.states)
                    merging = time.thread_time()
                    self._merged[shipped.batch[0]] = runner.merge(jobs[0], shipped.fresh)
                    self.stats["merge_cpu_seconds"] += time.thread_time() - merging
                    self.stats["merges_here"] += shipped.fresh is not None
                    self._rest(shipped, jobs, starts, -1, None)
                    return
                else:
                    done = [runner.train(jobs[0], starts[0], shipped.states, shipped.fresh)]
        except Exception as error:
            self._done.update((k, _Failed(error)) for k in live)
            return
        finally:
            self.stats["local_seconds"] += time.perf_counter() - began
            self.stats["local_cpu_seconds"] += time.thread_time() - cpu
            self.stats["local_steps"] += trained
            _paced(self._pace["here"], time.perf_counter() - began, steps)
        for k, result in zip(shipped.batch, done):
            if k in live:
                self._done[k] = result
                self._trained_here.add(k)

    def _receive(self, shipped: _Shipped) -> None:
        """A placed task has finished: keep its results for their jobs; a dead worker is replaced and the task's
        jobs are shipped again (the same jobs: the same result), as are those of a task that found a file of the run's
        shared memory removed (:meth:`_vanished`)."""
        ray = self._ray
        self._built()  # (a worker's first result: its engine's build, not waited for at the start, is checked)
        self._busy[shipped.worker] -= 1
        steps, trained = _steps(shipped), _trained_steps(shipped)
        jobs, starts, shipped.jobs, shipped.starts = shipped.jobs, shipped.starts, None, None
        live = [k for k in shipped.batch if self._shipped.get(k) is shipped]  # (not the cancelled ones)
        value, took, raised, lost = _outcome(ray, shipped.ref)
        if raised is not None:  # the job itself raised: raised when it is consumed
            if self._vanished(raised):  # (a file it was to read was removed: nothing of the job ran)
                self._again(shipped, jobs, starts, live, shipped.failures)
                return
            if shipped.part in (1, 3) and not live:  # (its engine went back to the worker's spares)
                return
            self._done.update((k, _Failed(raised)) for k in live)
            return
        if lost is not None:  # worker or node lost
            self._replace_worker(shipped.worker, shipped.actor)
            if not live:
                return
            if shipped.failures + 1 >= MAX_WORKER_FAILURES:
                failure = RuntimeError(f"a Ray worker died {MAX_WORKER_FAILURES} times computing job {live[0]}")
                failure.__cause__ = lost
                self._done.update((k, _Failed(failure, lost=True)) for k in live)
                return
            self._again(shipped, jobs, starts, live, shipped.failures + 1)
            return
        seconds, cpu = took
        try:
            value = _read(value, shipped, live)  # (this process's copies of the tensors it sent back)
        except FileNotFoundError as error:
            if not self._vanished(error):
                raise
            self._again(shipped, jobs, starts, live, shipped.failures)
            return
        self.stats["worker_seconds"] += seconds
        self.stats["worker_cpu_seconds"] += cpu
        self.stats["worker_steps"] += trained
        _paced(self._pace["worker"], seconds, steps)
        if shipped.part == 1:  # parked on the worker until the simulation reaches its request
            if live:
                self._parked[live[0]] = (shipped.worker, shipped.actor)
                if value is not None:  # (its state at the request, for the merge's learning here)
                    self._points[live[0]] = value
            else:
                self._tell(shipped.actor, "discard", shipped.batch[0])
            return
        if shipped.part == 3:  # the merge went back; the rest waits, parked on the same worker, for its turn
            if not live:
                self._tell(shipped.actor, "discard", shipped.batch[0])
                return
            self._merged[live[0]] = value
            self.stats["merges_on_workers"] += shipped.fresh is not None
            assert jobs is not None and starts is not None
            self._rest(shipped, jobs, starts, shipped.worker, shipped.actor)
            return
        for k, (update, weights, results) in zip(shipped.batch, value if isinstance(value, list) else [value]):
            if self._shipped.get(k) is not shipped:  # (cancelled)
                continue
            update.weights = weights  # (a cohort's other jobs wait here, ready)
            if shipped.part == 2 and shipped.merged is not None:  # (the merge's tensors it did not send back)
                shipped.merged.taken_back(update)
            self._done[k] = (update, results)

    def _again(
        self,
        shipped: _Shipped,
        jobs: list[ClientJob] | None,
        starts: list[Tensor] | None,
        live: list[int],
        failures: int,
    ) -> None:
        """Ship a task's live jobs again, as a new task (the same jobs: the same results): its worker died, or a file
        it was to read in shared memory was removed (then whatever of the job is parked on the worker goes: the task
        starts over from what this process holds)."""
        if not self._cohort and shipped.actor is not None and self._workers[shipped.worker] is shipped.actor:
            self._tell(shipped.actor, "discard", shipped.batch[0])  # (a job parked there, if any: it starts over)
        if not live:
            return
        self.stats["jobs_recomputed"] += len(live)
        again = _Shipped(shipped.batch, shipped.key, failures, jobs, starts)  # same task, same results
        again.states, again.part, again.fresh = shipped.states, shipped.part, shipped.fresh
        again.from_start = shipped.part == 3  # the part before the request went with the worker
        if shipped.part == 2:  # the whole job, with the answer (its merge was learned from already)
            again.part = 0
        for k in live:
            self._shipped[k] = again
        heapq.heappush(self._waiting, (again.key, next(self._order), again))

    def _vanished(self, error: BaseException) -> bool:
        """Whether an error is a file of the run's shared memory gone (removed by another program: systemd-logind's
        ``RemoveIPC=yes`` removes a user's files there when their last session ends); then every later tensor goes
        through Ray, said once by a warning."""
        files = self._files
        path = getattr(error, "filename", None)
        if files is None or not isinstance(error, FileNotFoundError) or not str(path).startswith(files.directory):
            return False
        if not files.full:
            log.warning(
                "lit_asyncfl: the Ray executor's files in shared memory (%s) were removed during the run (by "
                "systemd-logind's RemoveIPC=yes at a logout, or a cleaner): the tasks that were to read them are "
                "computed again, and every tensor goes through Ray from now on (same results)",
                files.directory,
            )
        files.full = True  # (no more files written here)
        self._reading.clear()  # (nor read by the workers)
        self._shared_starts.clear()
        return True

    def _rest(self, merge: _Shipped, jobs: list[ClientJob], starts: list[Tensor], worker: int, actor: Any) -> None:
        """After a parked job's merge (its task ``merge``): the rest of the job waits, due at about its arrival (or
        now, when it is collected at its request), for where it is parked (``worker`` -1: here)."""
        job_id = merge.batch[0]
        rest = _Shipped([job_id], _rest_due(self._whole, jobs[0]), 0, jobs, starts, merge.states, part=2,
                        fresh=merge.fresh)  # fmt: skip
        rest.worker, rest.actor = worker, actor
        self._shipped[job_id] = rest
        heapq.heappush(self._waiting, (rest.key, next(self._order), rest))

    def _replace_worker(self, index: int, actor: Any) -> None:  # (RayExecutor's: it starts workers)
        raise NotImplementedError

    def _built(self) -> None:  # (RayExecutor's: it builds the workers' engines)
        raise NotImplementedError


def _outcome(ray: Any, ref: Any) -> tuple[Any, Took, BaseException | None, BaseException | None]:
    """A finished task's result and its wall and CPU seconds, or what the job raised, or the worker's loss (its
    process or node ended)."""
    try:
        value, took = ref.result() if isinstance(ref, _Call) else ray.get(ref)
    except _Lost as error:
        return None, (0.0, 0.0), None, error
    except ray.exceptions.RayTaskError as error:
        return None, (0.0, 0.0), error.cause if isinstance(getattr(error, "cause", None), Exception) else error, None
    except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as error:
        return None, (0.0, 0.0), None, error
    except Exception as error:  # (what a job raised through a worker's socket: the job's own error)
        if not isinstance(ref, _Call):
            raise
        return None, (0.0, 0.0), error, None
    return value, took, None, None


def _read(value: Any, shipped: _Shipped, live: list[int]) -> Any:
    """A task's result with the tensors it sent back read (files in shared memory: read once, removed), and those
    of its cancelled jobs dropped (their files removed); raises ``FileNotFoundError`` if a file is gone."""
    if shipped.part == 3 or value is None:  # (what a merge taught: no tensor; a state that cannot be read)
        return value
    if shipped.part == 1:  # (a job's state at its request)
        value.weights = value.weights.tensor() if live else _dropped(value.weights)  # (None: nobody reads it)
        return value
    results = value if isinstance(value, list) else [value]
    read = [  # (a cancelled job's weights: None, their file removed)
        (update, weights.tensor() if k in live else _dropped(weights), taught)
        for k, (update, weights, taught) in zip(shipped.batch, results)
    ]
    return read if isinstance(value, list) else read[0]


def _pinned(shipped: _Shipped) -> bool:
    """Whether a task waits for where its job is parked (its merge or its rest; not a merge from the start)."""
    return shipped.part == 2 or (shipped.part == 3 and not shipped.from_start)


def _here(shipped: _Shipped) -> bool:
    """Whether this process can train a task (not the merge or the rest of a job parked on a worker)."""
    return not _pinned(shipped) or shipped.worker < 0


def _rest_due(whole: bool, job: ClientJob) -> float:
    """When the rest of a job after its merge is needed: at its arrival, or at its request when it is collected
    there (``whole``)."""
    return -math.inf if whole else job.dispatch_time + job.timing.total


def _steps(shipped: _Shipped) -> int:
    """About how many local steps a task trains (to keep workers busy while this process is; 0 once received)."""
    jobs = shipped.jobs or []
    if shipped.part == 0 or not jobs:
        return sum(job.num_steps for job in jobs)
    request = jobs[0].request_step or 0
    if shipped.part == 1:
        return request
    if shipped.part == 3:  # (the merge: about a step's work; from the start, the part before the request too)
        return request + 1 if shipped.from_start else 1
    return jobs[0].num_steps - request


def _trained_steps(shipped: _Shipped) -> int:
    """The local steps a task trains (the stats' ``worker_steps`` and ``local_steps``): :func:`_steps` without the
    step the pace counts for a merge, which trains none (a job in parts counts its ``num_steps``)."""
    return _steps(shipped) - (shipped.part == 3 and bool(shipped.jobs))


def _paced(pace: list[float], seconds: float, steps: int) -> None:
    """Count a task's training time and steps in a pace (the last ~50 tasks weigh: the machine's speed drifts)."""
    if steps > 0:
        decay = 0.98
        pace[0], pace[1] = decay * pace[0] + seconds, decay * pace[1] + steps


def _due(job: ClientJob) -> float:
    """When a job's result is needed: at its request (a job with one), else at its arrival."""
    return job.arrival_time if job.request_step is None else job.request_time


def _forget_file(shared: dict[int, _Shared], key: int) -> None:
    """A start model's snapshot is gone: its file in shared memory goes too (every task reading it was received)."""
    file = shared.pop(key, None)
    if file is not None:
        file.discard()


def _wired(fresh: tuple[Tensor, int] | None, files: _SharedFiles | None = None) -> tuple[_Wire | _Shared, int] | None:
    """The server's answer to a job's request as its task carries it (in a file of ``files``, read once)."""
    return None if fresh is None else (_read_once(fresh[0], files), fresh[1])


def _wired_merge(merged: Any, files: _SharedFiles | None = None) -> tuple[Any, list[Any]]:
    """What a merge computed here changed, its weights and the tensors it added to ``job_info`` (FedASMU's merge
    jump, as large as the model), as the rest's task carries them: files in shared memory (``files``: a worker on
    this node; read once), or stand-ins in it and their pieces for its last arguments (:func:`_inline`)."""
    if merged is None or merged.weights is None:
        return merged, []
    merged = copy.copy(merged)
    keys = [k for k, v in merged.info.items() if isinstance(v, Tensor)]
    if files is not None:
        merged.weights = _read_once(merged.weights, files)
        merged.info = {**merged.info, **{k: _read_once(merged.info[k], files) for k in keys}}
        return merged, []
    stand_ins, pieces = _inline([merged.weights, *(merged.info[k] for k in keys)])
    merged.weights = stand_ins[0]
    merged.info = {**merged.info, **dict(zip(keys, stand_ins[1:]))}
    return merged, pieces
