"""The Lightning emulation: what a module sees where no ``lightning.Trainer`` runs it.

:class:`JobTrainer` stands in for ``self.trainer``; :func:`run_evaluation` runs a module's validation or test hooks
as Lightning's evaluation loop does; :class:`EpochLog` and :class:`JobLog` reduce ``self.log`` calls as Lightning does
(in an evaluation epoch, in a client job);
:func:`check_lightning_contract` refuses, at fit start, what the emulation cannot honour.
"""

from lit_asyncfl.loops.contract import check_lightning_contract, check_model_fits_data
from lit_asyncfl.loops.stand_in import EpochLog, JobLog, JobTrainer
from lit_asyncfl.loops.validation_loop import run_evaluation

__all__ = ["EpochLog", "JobLog", "JobTrainer", "check_lightning_contract", "check_model_fits_data", "run_evaluation"]
