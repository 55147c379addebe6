"""Local-training engines: how one client job trains a module (``FederatedTrainer(engine=...)``).

``fast`` (:class:`LocalTrainer`, a plain PyTorch loop), ``lightning`` (:class:`LightningLocalTrainer`, a
``lightning.Trainer`` per job) and ``cohort`` (:class:`CohortTrainer`, many jobs at once with ``torch.func``), on
their common base (:class:`LocalEngine`) and the CPU kernel choice (:class:`OneDNN`).
"""

from lit_asyncfl.engines.base import LocalEngine, generators_kept, parse_optimizers
from lit_asyncfl.engines.cohort import CohortExecutor, CohortJobTrainer, CohortTrainer, check_cohort_support
from lit_asyncfl.engines.fast import LocalTrainer
from lit_asyncfl.engines.kernels import OneDNN, choose_onednn
from lit_asyncfl.engines.lightning import LightningLocalTrainer

__all__ = [
    "CohortExecutor",
    "CohortJobTrainer",
    "CohortTrainer",
    "LightningLocalTrainer",
    "LocalEngine",
    "LocalTrainer",
    "OneDNN",
    "check_cohort_support",
    "choose_onednn",
    "generators_kept",
    "parse_optimizers",
]
