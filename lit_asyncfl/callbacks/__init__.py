"""Run callbacks: what happens around the global loop (model: Lightning's callbacks, one per file).

User callbacks, passed as ``FederatedTrainer(callbacks=[...])`` or ``--trainer.callbacks+=...``:

- :class:`ModelCheckpoint`: keep the best global models by a monitored metric (Lightning checkpoints).
- :class:`EarlyStopping`: stop when the monitored global metric stops improving.
- :class:`PerClientEvaluation`: evaluate the global (and fine-tuned) model on every client's held-out samples.
- :class:`Callback`: the base class of your own.

Built in (every trainer has them; see each for its trainer argument): :class:`ProgressBar`
(``enable_progress_bar``), :class:`InterruptHandler` (Ctrl-C), :class:`RunOutputs` (``history.csv``,
``summary.json``, plots; ``print_summary``), :class:`RunCheckpoint` (``checkpoints/last.ckpt``;
``checkpoint_every``) and :class:`LoggerConnector` (``logger``).
"""

from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.callbacks.early_stopping import EarlyStopping
from lit_asyncfl.callbacks.interrupt import InterruptHandler
from lit_asyncfl.callbacks.logger_connector import LoggerConnector
from lit_asyncfl.callbacks.model_checkpoint import ModelCheckpoint
from lit_asyncfl.callbacks.per_client_evaluation import PerClientEvaluation
from lit_asyncfl.callbacks.progress import ProgressBar
from lit_asyncfl.callbacks.run_checkpoint import RunCheckpoint
from lit_asyncfl.callbacks.run_outputs import RunOutputs

__all__ = [
    "Callback",
    "EarlyStopping",
    "InterruptHandler",
    "LoggerConnector",
    "ModelCheckpoint",
    "PerClientEvaluation",
    "ProgressBar",
    "RunCheckpoint",
    "RunOutputs",
]
