"""Client side, as it was imported before the engines, executors, client callbacks and the Lightning emulation
got folders of their own (:mod:`lit_asyncfl.engines`, :mod:`lit_asyncfl.executors`,
:mod:`lit_asyncfl.client_callbacks`, :mod:`lit_asyncfl.loops`): every name and module path users import from here
keeps working.

The old module paths (``lit_asyncfl.client.fast_engine``, ...) are the new modules themselves, registered under
their old names (not copies: a class, a constant or a patch is the same object under either path).
"""

import sys

from lit_asyncfl.client_callbacks import base as callbacks
from lit_asyncfl.client_callbacks import client_state as client_state_callbacks
from lit_asyncfl.client_callbacks import fresh_merge
from lit_asyncfl.client_callbacks import staleness as staleness_callbacks
from lit_asyncfl.client_callbacks.base import ClientCallback, LearningRateDecay, ProximalTerm
from lit_asyncfl.client_callbacks.client_state import DynamicRegularizer, ModelContrastive
from lit_asyncfl.client_callbacks.fresh_merge import FreshModelMerge
from lit_asyncfl.client_callbacks.staleness import DecayedCorrection, DelayAdaptiveStepSize, ParticipationLearningRate
from lit_asyncfl.engines import base as engine_base
from lit_asyncfl.engines import cohort, kernels
from lit_asyncfl.engines import fast as fast_engine
from lit_asyncfl.engines import lightning as lightning_engine
from lit_asyncfl.engines.base import LocalEngine, OneDNN
from lit_asyncfl.engines.cohort import CohortTrainer
from lit_asyncfl.engines.cohort_step import CohortJobTrainer
from lit_asyncfl.engines.fast import LocalTrainer
from lit_asyncfl.engines.lightning import LightningLocalTrainer
from lit_asyncfl.executors import factory as engines
from lit_asyncfl.executors import ray as ray_executor
from lit_asyncfl.executors import sequential
from lit_asyncfl.executors.cohort import CohortExecutor
from lit_asyncfl.executors.factory import ENGINES, build_executor
from lit_asyncfl.executors.ray import RayExecutor, release_workers
from lit_asyncfl.executors.sequential import SequentialExecutor
from lit_asyncfl.loops import contract, job_trainer
from lit_asyncfl.loops.stand_in import JobTrainer
from lit_asyncfl.rl import time_slots
from lit_asyncfl.rl.time_slots import SlotPolicy, TimeSlotSelector

#: Module paths users imported before the move -> the modules now there.
MOVED_MODULES = {
    "callbacks": callbacks,
    "client_state_callbacks": client_state_callbacks,
    "cohort": cohort,
    "contract": contract,
    "engine_base": engine_base,
    "engines": engines,
    "fast_engine": fast_engine,
    "fresh_merge": fresh_merge,
    "job_trainer": job_trainer,
    "kernels": kernels,
    "lightning_engine": lightning_engine,
    "ray_executor": ray_executor,
    "sequential": sequential,
    "staleness_callbacks": staleness_callbacks,
    "time_slots": time_slots,
}
for _name, _module in MOVED_MODULES.items():
    sys.modules[f"{__name__}.{_name}"] = _module

__all__ = [
    "ENGINES",
    "ClientCallback",
    "CohortExecutor",
    "CohortJobTrainer",
    "CohortTrainer",
    "DecayedCorrection",
    "DelayAdaptiveStepSize",
    "DynamicRegularizer",
    "FreshModelMerge",
    "JobTrainer",
    "LearningRateDecay",
    "LightningLocalTrainer",
    "LocalEngine",
    "LocalTrainer",
    "ModelContrastive",
    "OneDNN",
    "ParticipationLearningRate",
    "ProximalTerm",
    "RayExecutor",
    "SequentialExecutor",
    "SlotPolicy",
    "TimeSlotSelector",
    "build_executor",
    "release_workers",
]
