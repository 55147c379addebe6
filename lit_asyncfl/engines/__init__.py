"""Local-training engines: how one client job trains a module (``FederatedTrainer(engine=...)``).

``fast`` (:class:`FastEngine`, a plain PyTorch loop), ``lightning`` (:class:`LightningEngine`, a
``lightning.Trainer`` per job) and ``cohort`` (:class:`CohortEngine`, many jobs at once with ``torch.func``), on
their common base (:class:`LocalEngine`) and the CPU kernel choice (:class:`OneDNN`).

The engines' former names stay importable as aliases of the same classes: ``LocalTrainer`` (:class:`FastEngine`),
``LightningLocalTrainer`` (:class:`LightningEngine`) and ``CohortTrainer`` (:class:`CohortEngine`). ``Trainer`` now
names only what a module sees as ``self.trainer`` (:class:`~lit_asyncfl.loops.JobTrainer`,
:class:`CohortJobTrainer`) and the run's :class:`~lit_asyncfl.FederatedTrainer`.
"""

from lit_asyncfl.engines.base import LocalEngine, generators_kept, parse_optimizers
from lit_asyncfl.engines.cohort import (
    CohortEngine,
    CohortExecutor,
    CohortJobTrainer,
    check_cohort_support,
)
from lit_asyncfl.engines.cohort import (
    CohortTrainer as CohortTrainer,  # the former name (an alias)
)
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.engines.fast import LocalTrainer as LocalTrainer  # the former name (an alias)
from lit_asyncfl.engines.kernels import OneDNN, choose_onednn
from lit_asyncfl.engines.lightning import LightningEngine
from lit_asyncfl.engines.lightning import LightningLocalTrainer as LightningLocalTrainer  # the former name

__all__ = [
    "CohortEngine",
    "CohortExecutor",
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
