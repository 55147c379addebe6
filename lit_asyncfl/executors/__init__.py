"""Executors: where and when client jobs train (``FederatedTrainer(executor=...)``).

:class:`SequentialExecutor` trains each job in the simulation's process at its event; :class:`CohortExecutor` trains
every pending job at once with the ``cohort`` engine when an update is asked for; :class:`RayExecutor` trains them
ahead on Ray workers and hands each update over at its event (the same weights). :func:`build_executor` builds the
executor of a run from its engine.
"""

from lit_asyncfl.executors.cohort import CohortExecutor
from lit_asyncfl.executors.factory import ENGINES, build_executor
from lit_asyncfl.executors.ray import EXECUTORS, RayExecutor, check_executor, ray_available, release_workers
from lit_asyncfl.executors.sequential import SequentialExecutor

__all__ = [
    "ENGINES",
    "EXECUTORS",
    "CohortExecutor",
    "RayExecutor",
    "SequentialExecutor",
    "build_executor",
    "check_executor",
    "ray_available",
    "release_workers",
]
