"""Schedulers: when, and which clients, to dispatch."""

from lit_asyncfl.schedulers.base import Scheduler, resolve_count
from lit_asyncfl.schedulers.buffered_concurrency import BufferedConcurrency
from lit_asyncfl.schedulers.compass import CompassScheduler
from lit_asyncfl.schedulers.deadline_rounds import AvailabilityPrioritySelection, DeadlineRounds
from lit_asyncfl.schedulers.k_async import KAsync
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.schedulers.periodic import PeriodicTrigger
from lit_asyncfl.schedulers.rounds import SynchronousRounds
from lit_asyncfl.schedulers.selection import (
    DeadlineSelection,
    OortSelection,
    RandomSelection,
    Selection,
    UtilitySelection,
)
from lit_asyncfl.schedulers.semi_async import SemiAsyncRounds
from lit_asyncfl.schedulers.semi_async_state import SemiAsyncRoundState
from lit_asyncfl.schedulers.view import SCHEDULER_VIEW, SchedulerView

__all__ = [
    "SCHEDULER_VIEW",
    "AvailabilityPrioritySelection",
    "BufferedConcurrency",
    "CompassScheduler",
    "DeadlineRounds",
    "DeadlineSelection",
    "KAsync",
    "KeepConcurrency",
    "OortSelection",
    "PeriodicTrigger",
    "RandomSelection",
    "Scheduler",
    "SchedulerView",
    "Selection",
    "SemiAsyncRoundState",
    "SemiAsyncRounds",
    "SynchronousRounds",
    "UtilitySelection",
    "resolve_count",
]
