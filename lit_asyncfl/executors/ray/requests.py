"""Jobs that ask the server mid-training on the Ray executor (FedASMU's fresh-model request; any client callback with
a ``request_step``): at the job's request event what its merge teaches is learned, as soon as the merge is done,
and the rest of the job trains on, on its worker, until the job's arrival (see ``docs/ray.md``)."""

from __future__ import annotations

import heapq
import math
import time
from typing import Any

import torch
from torch import Tensor

from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.executors.ray.placement import _Failed, _Placement, _rest_due, _Shipped
from lit_asyncfl.executors.ray.worker import _JobRunner
from lit_asyncfl.executors.sequential import train_requested


def _asks_server(callback: Any) -> bool:
    """Whether a client callback's jobs may ask the server mid-training (its
    :attr:`~lit_asyncfl.client_callbacks.ClientCallback.asks_server`, by default whether it overrides
    ``request_step``)."""
    declared = getattr(callback, "asks_server", None)
    if declared is not None:
        return bool(declared)
    return type(callback).request_step is not ClientCallback.request_step


class _Requests(_Placement):
    """The request half of :class:`~lit_asyncfl.executors.ray.executor.RayExecutor` (between its placement and
    itself): the request event of a job and the merge it learns from there."""

    _after: dict[int, ClientUpdate | _Failed]
    _stay: set[int]
    _merge_runner: _JobRunner | None
    _from_state: bool

    def failed_after_request(self, job_id: int) -> BaseException | None:
        """The error a job with a request raised after its merge (kept for its arrival), or ``None``: none was
        kept, or its workers died (the job itself raised nothing)."""
        outcome = self._after.get(job_id)
        return outcome.error if isinstance(outcome, _Failed) and not outcome.lost else None

    def _runners(self, make_trainer: Any, callbacks: Any) -> tuple[_JobRunner | None, _JobRunner | None]:
        """The runner of shipped jobs trained here (``train_locally``) and the one computing the merges of parked jobs
        here (a run with requests, split by the engine): one runner, with copies of the callbacks, from the module as
        it is now, with the workers' thread count; ``None`` where there is none. Merges are computed here only when
        every client callback's ``on_fresh_model`` may be computed from a job's state at its request
        (:attr:`~lit_asyncfl.client_callbacks.ClientCallback.merges_from_request_state`)."""
        requests = any(_asks_server(cb) for cb in callbacks)
        self._from_state = all(
            getattr(cb, "merges_from_request_state", False) or type(cb).on_fresh_model is ClientCallback.on_fresh_model
            for cb in callbacks
        )
        if not (self.train_locally or (requests and self._parts and self._ship_all)):
            return None, None
        threads = torch.get_num_threads()
        torch.set_num_threads(self._threads)
        try:
            runner = _JobRunner(make_trainer(self._device))
        finally:
            torch.set_num_threads(threads)
        return (runner if self.train_locally else None), runner

    def submit_failed(self, job: ClientJob, start_weights: Tensor, error: Exception) -> None:
        """Register a job that already raised after its request (a resumed run): it raises ``error`` at its
        arrival."""
        self._pending[job.job_id] = (job, start_weights)
        self._after[job.job_id] = _Failed(error)

    def request(self, job_id: int, fresh: tuple[Tensor, int] | None) -> None:
        """A job's request event (``fresh``: the server's answer): what its merge taught is learned now, as soon as
        the merge is done; the rest of the job trains on, on its worker, and is collected by :meth:`result` at the
        job's arrival (an error raised there is raised then). Raises what the job raised up to its merge. With a
        carried callback that learns from a job's end (``learns_from_job_result``) the rest is collected here, at
        the request event, and what the job taught is committed here, where the sequential executor trains the
        whole job."""
        job, start = self._pending[job_id]
        if job_id in self._stay:  # trained here, whole, now (as the sequential executor does)
            outcome = train_requested(self._local_trainer(), job, start, fresh)
            self._after[job_id] = _Failed(outcome) if isinstance(outcome, Exception) else outcome
            return
        if job_id not in self._shipped:
            self._ship([job_id], place=not self.train_locally)  # needed now: shipped even when the window is full
        began = time.perf_counter()
        value = self._merge(job_id, fresh)
        self.stats["request_seconds"] += time.perf_counter() - began
        if isinstance(value, _Failed):  # the job stays pending, as sequentially (asked again, it is shipped again)
            self._fill()
            raise value.error
        for cb, result in zip(self._carried, value):  # what the merge taught, learned now, as sequentially
            cb.commit_merge_result(job, result)
        if self._whole:  # the rest collected now: what the job's end taught is learned now too, as sequentially
            update = self._consume(job_id)  # (a failure is kept in _after, raised at the arrival)
            if not isinstance(update, _Failed):
                self._after[job_id] = update
        self._fill()

    def _merge(self, job_id: int, fresh: tuple[Tensor, int] | None) -> Any:
        """What the merge of a job with a request taught, at its request event (or its :class:`_Failed`); the merge
        is computed once.

        Its part before the request is parked on a worker (or here), or running (waited for), or not on a worker
        yet (then it goes first, to the next free trainer, with the answer, and its merge is computed there, part
        3). A job parked here is merged here, on its own engine. A job parked on a worker is merged there (part 3,
        first in line for that worker) when the worker is free, or when the merge cannot be computed from the job's
        state at its request; else (its worker is busy) the merge is computed here from that state (its
        :class:`_MergePoint`) and what it changed goes to the worker with the rest of the job. The rest (part 2)
        waits, due at about the job's arrival, for where the job is parked, and is collected at the arrival."""
        shipped = self._shipped[job_id]
        if fresh is not None:  # (the server's weights change in place after this event; a recomputation needs them)
            fresh = (fresh[0].clone(), fresh[1])
        if shipped.ref is None and job_id not in self._parked and shipped.part == 1:  # not placed yet
            self._take(shipped)
            shipped.part, shipped.fresh, shipped.from_start = 3, fresh, True
            heapq.heappush(self._waiting, (-math.inf, next(self._order), shipped))  # needed now: first
            return self._collect(job_id, merged=True)
        failed = self._collect(job_id, parked=True)
        if failed is not None:  # the part before the request raised
            return failed
        job, start = self._pending[job_id]
        worker, actor = self._parked[job_id]
        point = self._points.pop(job_id, None)
        here = worker < 0 or fresh is None or (point is not None and self._from_state and self._busy[worker] > 0)
        if not here or (worker >= 0 and self._workers[worker] is not actor):  # on its worker (or from the start
            del self._parked[job_id]  # on the next free one, if it died meanwhile), first in line
            task = _Shipped([job_id], -math.inf, 0, [job], [start], shipped.states, part=3, fresh=fresh)
            task.worker, task.actor, task.from_start = worker, actor, self._workers[worker] is not actor
            self._shipped[job_id] = task
            heapq.heappush(self._waiting, (task.key, next(self._order), task))
            self._place()
            return self._collect(job_id, merged=True)
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            with self._like_a_worker():
                if worker < 0:  # parked here: on its own engine (which forgets the job if the merge raises)
                    learned, merged = self._here.merge(job, fresh), None
                else:
                    learned, merged = self._merger().learn_merge(job, point, shipped.states, fresh)
        except Exception as error:  # the merge raised: the job fails at its request (no merge counted)
            return _Failed(error)
        finally:
            self.stats["local_seconds"] += time.perf_counter() - began
            cpu = time.thread_time() - cpu
            self.stats["local_cpu_seconds"] += cpu
            self.stats["merge_cpu_seconds"] += cpu
        self.stats["merges_here"] += fresh is not None
        self.stats["merges_from_state"] += fresh is not None and worker >= 0
        del self._parked[job_id]
        task = _Shipped([job_id], _rest_due(self._whole, job), 0, [job], [start], shipped.states, part=2, fresh=fresh,
                        merged=merged)  # fmt: skip
        task.worker, task.actor = worker, actor
        self._shipped[job_id] = task
        heapq.heappush(self._waiting, (task.key, next(self._order), task))
        self._place()
        return learned

    def _place_rests(self) -> None:
        """Give each worker every waiting rest of a job parked on it (its merge done at the job's request event), as
        many as wait, and nothing else: the run's loop is over, and writing the end-of-run checkpoint waits for every
        job past its request (:meth:`~lit_asyncfl.core.simulator.Simulator.state_dict`), so each worker trains its
        rests while this process evaluates the final model, where they would wait for that evaluation's end. The rest
        of a job whose worker died (trained again whole, with its answer: part 0) goes to the next free worker. The
        other waiting tasks (jobs before their request, rests parked here) stay waiting."""
        rests = [entry for entry in self._waiting if _rest_on_a_worker(entry[2])]
        others = [entry for entry in self._waiting if not _rest_on_a_worker(entry[2])]
        self._waiting = rests
        heapq.heapify(self._waiting)
        try:
            self._place(reserve=math.inf)  # (a rest parked on a worker goes to that worker only)
        finally:
            for entry in others:
                heapq.heappush(self._waiting, entry)

    def _merger(self) -> _JobRunner:
        """The runner that computes merges here (:meth:`_JobRunner.learn_merge`; this process's own with
        ``train_locally``), built at the run's start."""
        assert self._merge_runner is not None
        return self._merge_runner


def _rest_on_a_worker(shipped: _Shipped) -> bool:
    """Whether a waiting task is the rest of a job past its request that a worker trains: parked on it (part 2), or
    trained again whole with its answer after its worker died (part 0 of a job with a request: a job with one is
    shipped in parts, so only such a rest is whole)."""
    if shipped.part == 2:
        return shipped.worker >= 0
    return shipped.part == 0 and any(job.request_step is not None for job in shipped.jobs or ())
