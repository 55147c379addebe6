"""Local-training engines: how one client job trains a module (``FederatedTrainer(engine=...)``).

``fast`` (:class:`FastEngine`, a plain PyTorch loop), ``lightning`` (:class:`LightningEngine`, a
``lightning.Trainer`` per job) and ``cohort`` (:class:`CohortEngine`, many jobs at once with ``torch.func``), on
their common base (:class:`LocalEngine`), the CPU kernel choice (:class:`OneDNN`) and the cohort's channels-last
convolutions and pooling over the stacked jobs (:class:`BatchedKernels`).

The engines' former names stay importable as aliases of the same classes: ``LocalTrainer`` (:class:`FastEngine`),
``LightningLocalTrainer`` (:class:`LightningEngine`) and ``CohortTrainer`` (:class:`CohortEngine`). ``Trainer`` now
names only what a module sees as ``self.trainer`` (:class:`~lit_asyncfl.loops.JobTrainer`,
:class:`CohortJobTrainer`) and the run's :class:`~lit_asyncfl.FederatedTrainer`. The cohort engine's executor
moved to the executors (:class:`~lit_asyncfl.executors.CohortExecutor`) and stays importable from here.
"""

from typing import Any

from lit_asyncfl.engines.base import LocalEngine, OneDNN, choose_onednn, generators_kept, parse_optimizers
from lit_asyncfl.engines.cohort import CohortEngine, check_cohort_support
from lit_asyncfl.engines.cohort import (
    CohortTrainer as CohortTrainer,  # the former name (an alias)
)
from lit_asyncfl.engines.cohort_kernels import BatchedKernels
from lit_asyncfl.engines.cohort_step import CohortJobTrainer
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.engines.fast import LocalTrainer as LocalTrainer  # the former name (an alias)
from lit_asyncfl.engines.lightning import LightningEngine
from lit_asyncfl.engines.lightning import LightningLocalTrainer as LightningLocalTrainer  # the former name

__all__ = [
    "BatchedKernels",
    "CohortEngine",
    "CohortJobTrainer",
    "FastEngine",
    "LightningEngine",
    "LocalEngine",
    "OneDNN",
    "check_cohort_support",
    "choose_onednn",
    "generators_kept",
    "parse_optimizers",
]


def __getattr__(name: str) -> Any:
    """``CohortExecutor``, from where it lives now (the executors package imports the engines: looked up when asked
    for, not imported here)."""
    if name == "CohortExecutor":
        from lit_asyncfl.executors.cohort import CohortExecutor

        return CohortExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
