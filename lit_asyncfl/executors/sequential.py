"""``SequentialExecutor``: computes each job of a per-client engine when its update is needed."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generators_kept


class SequentialExecutor:
    """Computes each job when its update is needed, one after the other, with a per-client engine
    (:class:`~lit_asyncfl.engines.FastEngine` or
    :class:`~lit_asyncfl.engines.LightningEngine`).

    Executors decouple *when* an update is computed from *when* it is consumed: the simulator submits a job at
    dispatch and asks for its update at the arrival event, in virtual-time order. A job that asks the server
    mid-training is computed at its request event (:meth:`request`): what its merge teaches is learned there, and
    its update (or the error it raised after its request) waits for its arrival event.

    Args:
        trainer: The local trainer.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}
        self._after: dict[int, ClientUpdate | Exception] = {}  # requested jobs: their update or later error

    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job."""
        self._pending[job.job_id] = (job, start_weights)

    def submit_failed(self, job: ClientJob, start_weights: Tensor, error: Exception) -> None:
        """Register a job that already raised after its request (a resumed run): it raises ``error`` at its
        arrival."""
        self._pending[job.job_id] = (job, start_weights)
        self._after[job.job_id] = error

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed."""
        self._pending.pop(job_id, None)
        self._after.pop(job_id, None)

    def request(self, job_id: int, fresh: tuple[Tensor, int] | None) -> None:
        """A job's request event (``fresh``: the server's answer): train it, learning from its merge now.

        Raises what the job raised up to its request and merge (the job stays pending: the event can be
        replayed); an error raised after them is raised by :meth:`result`, at the job's arrival."""
        job, start = self._pending[job_id]
        self._after[job_id] = train_requested(self.trainer, job, start, fresh)

    def failed_after_request(self, job_id: int) -> BaseException | None:
        """The error a job with a request raised after its merge (kept for its arrival), or ``None``."""
        outcome = self._after.get(job_id)
        return outcome if isinstance(outcome, Exception) else None

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Compute and return the update of a job (``fresh``: the answer to its server request, if any); a job
        that made its request returns the update computed then."""
        if job_id in self._after:
            outcome = self._after[job_id]
            if isinstance(outcome, Exception):
                raise outcome  # (kept: asked again, it raises again)
            del self._after[job_id], self._pending[job_id]
            return outcome
        job, start = self._pending[job_id]
        with generators_kept(self.trainer.device):
            update = self.trainer.train(job, start, fresh)
        del self._pending[job_id]  # only now: a job that raised is still pending (the event can be replayed)
        return update


def train_requested(
    trainer: Any, job: ClientJob, start: Tensor, fresh: tuple[Tensor, int] | None
) -> ClientUpdate | Exception:
    """Train a job that asks the server mid-training, in this process, whole, with the server's answer ``fresh``:
    its update, or the error it raised after its request (after the merge, when the server had a newer model),
    which belongs to its arrival event. An error up to then is raised (it belongs to the request event).

    Once every callback's ``on_fresh_model`` returned (the merge is done), the run's own callbacks learn what it
    taught (``merge_result``, then ``commit_merge_result``: FedASMU's
    :class:`~lit_asyncfl.client_callbacks.FreshModelMerge`), at the point where the Ray executor learns it: what the
    merge taught stays when the rest raises, and a job that raises before or in its merge teaches nothing. With an
    engine that cannot stop at the request (``lightning``), a job to which the server had nothing newer has no point
    between its request and its end that this function sees: its error counts as one of the request (the Ray
    executor trains those jobs with the same function).
    """
    passed = [False]  # the request (and the merge, if any) went through
    merge = trainer.fresh_model
    callbacks = list(getattr(trainer, "callbacks", ()))

    def learned() -> None:  # what the merge taught (nothing when the server had nothing newer), learned now
        for cb in callbacks:
            cb.commit_merge_result(job, cb.merge_result(job))
        passed[0] = True

    def watched(*args: Any) -> None:
        merge(*args)
        learned()

    trainer.fresh_model = watched  # (an instance attribute: the method again after the job)
    try:
        with generators_kept(trainer.device):
            if not hasattr(trainer, "train_parts"):
                return trainer.train(job, start, fresh)
            from lit_asyncfl.engines.base import OneDNN
            from lit_asyncfl.engines.fast import first_part, next_part

            parts = trainer.train_parts(job, start, True)  # (FastEngine.train's computation, in its two parts)
            with OneDNN(trainer.onednn):
                first_part(parts)
                if fresh is None:  # no merge: the request is behind it
                    learned()
                return next_part(parts, fresh)
    except Exception as error:
        if not passed[0]:
            raise
        return error
    finally:
        del trainer.fresh_model
