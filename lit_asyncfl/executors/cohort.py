"""``CohortExecutor``: gathers the pending jobs into cohorts that the ``cohort`` engine trains at once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.engines.base import generators_kept

if TYPE_CHECKING:
    from lit_asyncfl.engines.cohort import CohortEngine

#: Default largest cohort: bounds the stacked weights (a few copies per job) when thousands of clients are in
#: flight; on LeNet-5 the time per update hardly improves beyond a few dozen jobs per cohort.
DEFAULT_MAX_COHORT = 128


class CohortExecutor:
    """Computes, whenever an update is asked for, every pending job at once with a :class:`CohortEngine`.

    Every dispatched job's start model is known at dispatch, so all pending jobs are independent until their
    arrival; the updates are stashed and handed out at the arrival events, in virtual-time order.

    Args:
        trainer: The cohort trainer.
        max_cohort: At most this many jobs per cohort (the asked-for job and the earliest dispatched others);
            ``None``: every pending job.
    """

    def __init__(self, trainer: CohortEngine, max_cohort: int | None = DEFAULT_MAX_COHORT) -> None:
        if max_cohort is not None and max_cohort < 1:
            raise ValueError(f"max_cohort must be >= 1, got {max_cohort}")
        self.trainer = trainer
        self.max_cohort = max_cohort
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}
        self._done: dict[int, ClientUpdate] = {}
        #: Sizes of the cohorts computed so far (for benchmarks and tests).
        self.cohort_sizes: list[int] = []

    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job."""
        if job.request_step is not None:
            raise ValueError("the cohort engine cannot run jobs with a mid-training server request; use engine='fast'")
        self._pending[job.job_id] = (job, start_weights)

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed."""
        self._pending.pop(job_id, None)
        self._done.pop(job_id, None)

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """The update of a job, computing it with every other pending job if it is not computed yet."""
        if job_id not in self._done:
            others = sorted(k for k in self._pending if k != job_id)
            ids = [job_id, *others][: self.max_cohort]
            entries = [self._pending[k] for k in ids]
            self.cohort_sizes.append(len(ids))
            with generators_kept(self.trainer.device):
                updates = self.trainer.train_many([e[0] for e in entries], [e[1] for e in entries])
            for k in ids:  # only now: the jobs of a cohort that raised are still pending
                del self._pending[k]
            self._done.update(zip(ids, updates))
        return self._done.pop(job_id)
