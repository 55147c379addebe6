"""The Lightning emulation: what a module sees where no ``lightning.Trainer`` runs it.

:class:`JobTrainer` stands in for ``self.trainer``; :func:`run_evaluation` runs a module's validation or test hooks
and ``self.log`` calls as Lightning's evaluation loop does (:class:`EpochLog`, :class:`JobLog`);
:func:`check_lightning_contract` refuses, at fit start, what the emulation cannot honour.
"""

from lit_asyncfl.loops.contract import check_lightning_contract, check_model_fits_data
from lit_asyncfl.loops.job_trainer import JobTrainer
from lit_asyncfl.loops.validation_loop import EpochLog, JobLog, run_evaluation

__all__ = ["EpochLog", "JobLog", "JobTrainer", "check_lightning_contract", "check_model_fits_data", "run_evaluation"]
