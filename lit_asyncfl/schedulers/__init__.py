"""Schedulers: when, and which clients, to dispatch."""

from lit_asyncfl.schedulers.base import Scheduler, resolve_count
from lit_asyncfl.schedulers.k_async import KAsync
from lit_asyncfl.schedulers.keep_concurrency import KeepConcurrency
from lit_asyncfl.schedulers.periodic import PeriodicTrigger
from lit_asyncfl.schedulers.rounds import SynchronousRounds

__all__ = ["KAsync", "KeepConcurrency", "PeriodicTrigger", "Scheduler", "SynchronousRounds", "resolve_count"]
