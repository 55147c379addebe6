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
    dispatch and asks for its update at the arrival event, in virtual-time order.

    Args:
        trainer: The local trainer.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}

    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job."""
        self._pending[job.job_id] = (job, start_weights)

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed."""
        self._pending.pop(job_id, None)

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Compute and return the update of a job (``fresh``: the answer to its server request, if any)."""
        job, start = self._pending[job_id]
        with generators_kept(self.trainer.device):
            update = self.trainer.train(job, start, fresh)
        del self._pending[job_id]  # only now: a job that raised is still pending (the event can be replayed)
        return update
