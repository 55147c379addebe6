"""The Ray executor: client jobs computed on Ray workers, consumed in virtual-time order."""

from lit_asyncfl.executors.ray.executor import (
    EXECUTORS,
    MAX_WORKER_FAILURES,
    TASKS_PER_WORKER,
    RayExecutor,
    check_executor,
    ray_available,
    release_workers,
)

__all__ = [
    "EXECUTORS",
    "MAX_WORKER_FAILURES",
    "TASKS_PER_WORKER",
    "RayExecutor",
    "check_executor",
    "ray_available",
    "release_workers",
]
