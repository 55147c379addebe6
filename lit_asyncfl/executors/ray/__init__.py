"""The Ray executor: client jobs computed on Ray workers, consumed in virtual-time order.

:mod:`~lit_asyncfl.executors.ray.executor` (the executor: its options, a run's start and stop, the executor
interface), :mod:`~lit_asyncfl.executors.ray.placement` (which task goes to which worker when),
:mod:`~lit_asyncfl.executors.ray.pool` (starting Ray and the workers, the pool of idle workers),
:mod:`~lit_asyncfl.executors.ray.worker` (the worker actor) and :mod:`~lit_asyncfl.executors.ray.wire` (tensors between
processes).
"""

from lit_asyncfl.executors.ray.executor import EXECUTORS, RayExecutor, check_executor
from lit_asyncfl.executors.ray.placement import MAX_WORKER_FAILURES, TASKS_PER_WORKER
from lit_asyncfl.executors.ray.pool import release_workers
from lit_asyncfl.executors.ray.worker import ray_available

__all__ = [
    "EXECUTORS",
    "MAX_WORKER_FAILURES",
    "TASKS_PER_WORKER",
    "RayExecutor",
    "check_executor",
    "ray_available",
    "release_workers",
]
