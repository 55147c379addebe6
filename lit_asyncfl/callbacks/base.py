"""``Callback``: the hooks through which run callbacks observe a federated fit (model: Lightning's ``Callback``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientUpdate
    from lit_asyncfl.data.shards import ClientShards, DatasetShards
    from lit_asyncfl.trainer import FederatedTrainer


class Callback:
    """Base class of run callbacks: every hook is empty; override the ones you need.

    A callback observes the *global* loop of a federated run, as a Lightning ``Callback`` observes a fit: the
    global model's new versions, its evaluations, the simulator's events, and the start and end of the run. Every
    hook receives the :class:`~lit_asyncfl.FederatedTrainer`; its ``simulator``, ``history`` and ``global_model``
    hold the run's state. To end the run, call ``trainer.request_stop("my_reason")`` (or set
    ``trainer.should_stop = True``, as in Lightning): the run stops at the next event boundary, evaluates the
    global model, and reports the reason as the summary's ``stop_reason``.

    State returned by :meth:`state_dict` is saved in every checkpoint under :attr:`state_key` and handed back to
    :meth:`load_state_dict` when a run resumes, so a resumed run keeps, e.g., its best scores and patience.

    Hooks are called in the order of the trainer's ``callbacks`` (the built-in ones around them: progress and
    interrupt handling first; outputs, the run checkpoint and the loggers last). An exception raised in a hook
    called inside an event (``on_new_version``, ``on_evaluation_end``, ``on_scheduler_metrics``,
    ``on_client_update``) ends the run at the end of that event, once the other callbacks had the hook, so that
    ``last.ckpt`` holds a consistent state to resume from.

    Example:
        >>> class PrintAccuracy(Callback):
        ...     def on_evaluation_end(self, trainer, metrics):
        ...         print(f"version {metrics['version']}: {metrics['accuracy']:.2f}")
        >>> from lit_asyncfl import FederatedTrainer
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> from lit_asyncfl.models import LogisticRegression
        >>> import tempfile
        >>> trainer = FederatedTrainer("fedasync", num_clients=4, max_versions=2, eval_every=1, logger=False,
        ...                            callbacks=[PrintAccuracy()], default_root_dir=tempfile.mkdtemp(),
        ...                            enable_progress_bar=False, print_summary=False)
        >>> trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        version 0: 0.04
        version 1: 0.66
        version 2: 0.84
    """

    @property
    def state_key(self) -> str:
        """Identifier of this callback's state in a checkpoint (unique among the trainer's callbacks)."""
        return type(self).__qualname__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """A state key made of the class name and the arguments that distinguish two instances."""
        return f"{type(self).__qualname__}{kwargs!r}"

    def setup_client_data(
        self, trainer: FederatedTrainer, shards: ClientShards | DatasetShards
    ) -> ClientShards | DatasetShards:
        """Called once the training set is split into clients, before anything trains (also when resuming); returns
        the shards the clients train on (default: ``shards`` unchanged). E.g.
        :class:`~lit_asyncfl.callbacks.PerClientEvaluation` holds some of each client's samples out."""
        return shards

    def data_fingerprint(self) -> dict[str, Any]:
        """Entries added to the ``data`` part of the run's resume fingerprint, for what :meth:`setup_client_data`
        changed in the clients' data (a checkpoint resumes only with the same), e.g. ``{"client_holdout": 0.2}``;
        the user's data module is not touched. Default: none."""
        return {}

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        """Called when the run is built (and restored from its checkpoint, when resuming), before the first event."""

    def on_new_version(self, trainer: FederatedTrainer) -> None:
        """Called when the server has made a new global version (``trainer.simulator.server.version``)."""

    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        """Called after each evaluation of the global model with its history row (``version``, ``virtual_time``,
        ``accuracy``, every logged metric, ...)."""

    def on_scheduler_metrics(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        """Called when the algorithm's scheduler logs metrics (e.g. a round's latency) at the current version."""

    def on_client_update(self, trainer: FederatedTrainer, update: ClientUpdate, aggregated: bool) -> None:
        """Called when the server has processed a client's update (``update.metrics``: what its ``training_step``
        logged, as the job's means; ``aggregated``: whether it made a new global version)."""

    def on_event_end(self, trainer: FederatedTrainer) -> None:
        """Called after each simulator event: a consistent state (the only point a resumable checkpoint is taken)."""

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        """Called at the end of the run, after the final evaluation, with ``trainer.summary`` filled in."""

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        """Called when the run raises (a second Ctrl-C included), before the exception propagates. Every callback's
        is called even if another one raises; the run's original exception is the one raised (what an
        ``on_exception`` raises is logged and attached to it as a note)."""

    def on_save_checkpoint(self, trainer: FederatedTrainer, checkpoint: dict[str, Any]) -> None:
        """Called when a checkpoint is written; entries added to ``checkpoint`` are saved with it."""

    def on_load_checkpoint(self, trainer: FederatedTrainer, checkpoint: dict[str, Any]) -> None:
        """Called when a run resumes from ``checkpoint``, after every state was restored."""

    def state_dict(self) -> dict[str, Any]:
        """This callback's state to checkpoint (plain values and tensors)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict` when a run resumes."""
