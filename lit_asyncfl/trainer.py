"""``FederatedTrainer``: holds a federated run's settings, wires its parts together at fit start, and runs it.

The trainer's own jobs live in :mod:`lit_asyncfl.run` (the argument checks, the wiring, the checkpoint of a run,
its end, ``validate``/``test``). What happens around the global loop lives in run callbacks
(:mod:`lit_asyncfl.callbacks`): progress and Ctrl-C, logging, output files, checkpoints, and the user's own. The
global evaluation is the run's validation loop (:class:`~lit_asyncfl.evaluation.GlobalEvaluation`); the checkpoint
format is :mod:`lit_asyncfl.checkpoint`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.loggers import Logger

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.algorithms import Algorithm
from lit_asyncfl.availability import AlwaysAvailable, Availability
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.callbacks.connector import CallbackConnector, configure_callbacks
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.simulator import Simulator
from lit_asyncfl.data.loaders import eval_data, fit_data
from lit_asyncfl.devices import DeviceModel, UniformRatio
from lit_asyncfl.evaluation import GlobalEvaluation
from lit_asyncfl.executors.factory import DEFAULT_NUM_THREADS, resolve_device
from lit_asyncfl.executors.ray.executor import RayExecutor
from lit_asyncfl.executors.sequential import SequentialExecutor
from lit_asyncfl.loggers import claim_log_dir, resolve_loggers
from lit_asyncfl.run.checkpointing import restore_run, save_run_checkpoint
from lit_asyncfl.run.checks import check_trainer_arguments, resolve_algorithm
from lit_asyncfl.run.ending import finish_run, record_failure
from lit_asyncfl.run.stages import run_stage
from lit_asyncfl.run.wiring import build_run
from lit_asyncfl.trainer_flags import lightning_flags_refused


class FederatedTrainer:
    """Simulates federated training of a ``LightningModule`` on a virtual clock.

    The training set of the data module is split into ``num_clients`` clients; the algorithm's scheduler dispatches
    clients, each trains ``local_epochs`` epochs on its shard with the module's own ``training_step`` and
    ``configure_optimizers``, and its update reaches the server after a simulated duration drawn from the device
    model. The global model is evaluated every ``eval_every`` versions with the module's ``validation_step``.

    After :meth:`fit`: :attr:`global_model` (the module, holding the final global weights), :attr:`history` (one
    dict per evaluation), :attr:`summary`, and in :attr:`log_dir` ``history.csv``, ``summary.json``,
    ``accuracy.png`` and ``checkpoints/last.ckpt`` (a Lightning checkpoint of the global model that also resumes
    the run). :meth:`validate` and :meth:`test` evaluate a trained model, from a checkpoint or after ``fit``.

    Results depend only on the configuration and ``seed``: never on wall-clock time. The global RNGs are seeded
    at construction, so a model built after the trainer starts from the same initial weights each run.

    Args:
        algorithm: An :class:`~lit_asyncfl.algorithms.Algorithm` (e.g. ``FedAsync()``) or a preset name
            (``"fedavg"``, ``"fedprox"``, ``"fedasync"``, ``"fedbuff"``, ...).
        num_clients: Number of simulated clients.
        local_epochs: Local epochs ``E`` per client job.
        max_virtual_time: Stop after the last event at or before this virtual time (seconds).
        max_versions: Stop when the global model reaches this version (number of aggregations).
        device_model: Simulated device heterogeneity (default: :class:`~lit_asyncfl.devices.UniformRatio` with a
            5x slowest/fastest ratio).
        eval_every: Evaluate the global model every this many versions (and at the start and end).
        target_accuracy: Value of the monitored metric whose first attainment is reported as ``time_to_target``
            (reached at or above it for ``mode="max"``, at or below for ``"min"``).
        seed: Seed of everything random in the run (partition, devices, client choice, local batches, init).
        accelerator: ``"cpu"``, ``"cuda"`` (alias ``"gpu"``) or ``"auto"``.
        logger: A Lightning logger (or several), ``True`` for a ``CSVLogger`` under ``default_root_dir``, or
            ``False``/``None`` for none. Metrics are logged against the version as step, with ``virtual_time``.
        callbacks: Run callbacks (:class:`~lit_asyncfl.callbacks.Callback`), e.g.
            :class:`~lit_asyncfl.callbacks.ModelCheckpoint` and :class:`~lit_asyncfl.callbacks.EarlyStopping`;
            called in this order, between the built-in progress/interrupt callbacks and the built-in outputs,
            run checkpoint and loggers (a ``ProgressBar`` given here replaces the built-in one).
        monitor: The validation metric that decides ``best_accuracy`` and ``time_to_target`` and fills the
            ``accuracy`` column of the history (e.g. ``"val_acc"``). ``None``: the logged metric ending in
            ``acc``/``accuracy`` (else ``r2``), announced at the first evaluation.
        mode: ``"max"`` if higher values of the monitored metric are better, ``"min"`` if lower ones are.
        default_root_dir: Where the default logger and the outputs go.
        enable_progress_bar: Show a progress bar over virtual time (or versions).
        print_summary: Print the summary table at the end of :meth:`fit`.
        checkpoint_every: Also write ``checkpoints/last.ckpt`` every this many events (``None``: only at the end).
        checkpoint_every_seconds: Also write ``checkpoints/last.ckpt`` (atomically) at the first event boundary after
            every this many seconds of wall time, so that a killed run (``kill -9``, out of memory) loses at most
            that much; ``None``: only at the end and every ``checkpoint_every`` events. Writing never changes
            results.
        on_client_error: What an exception raised in a client job does: ``"raise"`` ends the run (the history,
            summary, plots and a resumable ``last.ckpt`` at the event boundary before the failing job's event are
            written, then a :class:`~lit_asyncfl.core.simulator.ClientJobError` naming the client is raised);
            ``"drop"`` drops the job (summary ``updates_dropped`` and ``drop_reasons["client_error"]``, a warning
            per job, the device idle again; synchronous rounds close with the members that answered) and goes
            on. ``"drop"`` needs ``engine="fast"`` or ``"lightning"`` (a cohort trains its jobs in one call). A
            checkpoint of a ``"raise"`` run may be resumed with ``"drop"`` (not the reverse once jobs were dropped).
        num_threads: Intra-op threads (``torch.set_num_threads``) for the run; ``None``: the engine's default, one
            thread for ``fast`` and ``lightning`` (a client update is too small to split over threads, and extra
            threads slow it down as soon as another process competes for the cores), also for ``cohort``, which
            gains from more threads only on an otherwise idle machine.
        engine: How client updates are computed: ``"fast"`` (a minimal loop over the module's ``training_step``
            and ``configure_optimizers``), ``"lightning"`` (a real ``lightning.Trainer`` per update, for modules
            that need one: ``self.log``, ``self.trainer``, manual optimization; bit-identical to ``fast``) or
            ``"cohort"`` (every in-flight job at once with ``torch.func.vmap``; plain SGD, no BatchNorm; equal to
            ``fast`` up to float32 rounding). See :mod:`lit_asyncfl.engines`.
        onednn: Use oneDNN (``torch.backends.mkldnn``) kernels during local training; ``None``: automatic, off on
            the CPU for small convolutions (where the plain kernels are faster), else unchanged. Switching it
            changes float results in the last bits (about 1e-8 in LeNet-5 weights), never their determinism.
        compile_cohort: ``torch.compile`` the ``cohort`` engine's batched step (about a minute of compilation first,
            then ~25% faster steps for cohorts of one size; each new cohort size recompiles, so whole runs with
            cohorts of many sizes do not gain: ``docs/speed.md``; needs a C++ compiler); an error with the other
            engines.
        availability: When each simulated device is online (:mod:`lit_asyncfl.availability`; default
            :class:`~lit_asyncfl.availability.AlwaysAvailable`, every device all the time). Schedulers dispatch only
            online devices; a job whose device goes offline or crashes before its update arrives is dropped (summary
            ``updates_dropped`` and ``drop_reasons``; ``mean_online_fraction``; ``num_online`` in the history;
            ``availability.png`` in the outputs).
        executor: Where client jobs are computed: ``"sequential"`` (in this process, each when its update is
            needed), ``"ray"`` (on Ray workers with :class:`~lit_asyncfl.executors.RayExecutor`'s
            defaults: one CPU worker per core of the local or joined Ray cluster), or a ``RayExecutor(...)`` with
            its own settings (workers, GPUs per worker, look-ahead, cluster address). Updates are applied in the
            same virtual-time order either way: on CPU the weights are identical (needs the ``ray`` extra).
        client_state_budget: Bytes of per-client state (MOON's previous local models, FedDyn's corrections: the
            :class:`~lit_asyncfl.core.client_state.ClientStateStore` of the client callbacks that keep any) held in
            memory; the least recently used entries beyond it are written to ``<log_dir>/client_state/``. A
            resumable checkpoint holds the entries in memory (so under the budget it is self-contained) and refers
            to the files of the others (never copied into each checkpoint; named relative to the checkpoint, so the
            run directory may be moved or copied whole). Where an entry lives never changes a result, and a run may
            resume under another budget. A file that cannot be written (a full disk) ends the run with a
            :class:`~lit_asyncfl.core.client_state.ClientStateError`, never blamed on a client. ``None``: all in
            memory.

    Example:
        >>> from lit_asyncfl.algorithms import FedAsync
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> from lit_asyncfl.models import LogisticRegression
        >>> import tempfile
        >>> trainer = FederatedTrainer(FedAsync(concurrency=2), num_clients=4, max_versions=3, logger=False,
        ...                            default_root_dir=tempfile.mkdtemp(), enable_progress_bar=False,
        ...                            print_summary=False)
        >>> trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        >>> trainer.summary["versions"], trainer.history[-1]["version"]
        (3, 3)
    """

    @lightning_flags_refused  # lightning.Trainer's flags and seed_everything: refused naming their routes
    def __init__(
        self,
        algorithm: Algorithm | str = "fedasync",
        num_clients: int = 100,
        local_epochs: int = 1,
        max_virtual_time: float | None = None,
        max_versions: int | None = None,
        device_model: DeviceModel | None = None,
        eval_every: int = 10,
        target_accuracy: float = 0.8,
        seed: int = 0,
        accelerator: str = "cpu",
        logger: Logger | Iterable[Logger] | bool | None = True,
        callbacks: list[Callback] | Callback | None = None,
        monitor: str | None = None,
        mode: str = "max",
        default_root_dir: str = "runs",
        enable_progress_bar: bool = True,
        print_summary: bool = True,
        checkpoint_every: int | None = None,
        num_threads: int | None = None,
        engine: str = "fast",
        onednn: bool | None = None,
        compile_cohort: bool = False,
        checkpoint_every_seconds: float | None = 300.0,
        on_client_error: str = "raise",
        availability: Availability | None = None,
        executor: str | RayExecutor = "sequential",
        client_state_budget: int | None = 2**30,
    ) -> None:
        init_args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        self.algorithm = resolve_algorithm(algorithm)
        check_trainer_arguments(self.algorithm, init_args)

        self.num_clients = num_clients
        self.local_epochs = local_epochs
        self.max_virtual_time = max_virtual_time
        self.max_versions = max_versions
        self.device_model = device_model if device_model is not None else UniformRatio(ratio=5.0)
        self.availability = availability if availability is not None else AlwaysAvailable()
        self.eval_every = eval_every
        self.target_accuracy = target_accuracy
        self.seed = seed
        self.device = resolve_device(accelerator)
        self.default_root_dir = default_root_dir
        self.loggers = resolve_loggers(logger, default_root_dir, self.algorithm.name)
        self.callbacks = configure_callbacks(
            callbacks, self.loggers, enable_progress_bar, print_summary, checkpoint_every, checkpoint_every_seconds
        )
        self.evaluation = GlobalEvaluation(eval_every, monitor, mode, target_accuracy)
        self.checkpoint_every = checkpoint_every
        self.num_threads = num_threads
        self.engine = engine
        self.onednn = onednn
        self.compile_cohort = compile_cohort
        self.checkpoint_every_seconds = checkpoint_every_seconds
        self.on_client_error = on_client_error
        self.client_state_budget = client_state_budget
        #: The run's per-client state store (``None`` when no client callback keeps per-client state).
        self.client_state: ClientStateStore | None = None
        #: The Ray executor of the run (``None``: jobs are computed in this process).
        self.executor: RayExecutor | None = (
            RayExecutor() if executor == "ray" else (executor if isinstance(executor, RayExecutor) else None)
        )
        #: Configuration recorded with the run (the CLI stores the full parsed config here).
        self.run_config: dict[str, Any] | None = None
        #: Set to ``True`` (or call :meth:`request_stop`) to end the run at the next event boundary.
        self.should_stop = False
        #: Why the last run ended (``"max_versions"``, ``"early_stopping"``, ...).
        self.stop_reason: str | None = None
        #: Whether the last ``fit`` got past its start (restored or started, initial model evaluated): only then
        #: does a failure write outputs and a checkpoint (a refused resume must not overwrite its ``last.ckpt``).
        self.run_started = False
        #: ``True`` during the evaluation of the final model that a run adds when it ends between two scheduled
        #: evaluations (a resumed run never sees it, so ranking and stopping callbacks skip it).
        self.final_evaluation = False

        self.global_model: L.LightningModule | None = None
        self.datamodule: L.LightningDataModule | None = None
        self.summary: dict[str, Any] = {}
        self.simulator: Simulator | None = None
        self._init_args = init_args
        self._hparams: dict[str, Any] = {}
        self._fingerprint: dict[str, Any] = {}
        self._flat: FlatParameters | None = None
        self._wall_offset = 0.0
        self._wall_start = 0.0
        self._log_dir: str | None = None
        self._hooks = CallbackConnector(self)
        self._final_state: dict[str, Any] | None = None
        self._user_datamodule: L.LightningDataModule | None = None
        seed_everything(seed, verbose=False)

    @property
    def logger(self) -> Logger | None:
        """The first logger, or ``None``."""
        return self.loggers[0] if self.loggers else None

    @property
    def history(self) -> list[dict[str, Any]]:
        """One row per evaluation of the global model (see :class:`~lit_asyncfl.evaluation.GlobalEvaluation`)."""
        return self.evaluation.history

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """What the loggers record: the CLI config, else the model's, data module's, algorithm's and trainer's."""
        return self.run_config if self.run_config is not None else self._hparams

    @property
    def log_dir(self) -> str:
        """Directory of the run's outputs.

        The first logger's ``log_dir`` (CSV, TensorBoard), else a new ``default_root_dir/<algorithm>/version_N``
        (loggers without a local log dir, such as W&B, or no logger), fixed for the duration of a ``fit``.
        """
        if self._log_dir is None:
            self._log_dir = claim_log_dir(self.loggers, self.default_root_dir, self.algorithm.name)
        return self._log_dir

    @property
    def effective_num_threads(self) -> int:
        """The intra-op threads a fit uses: ``num_threads``, else the engine's default."""
        return self.num_threads if self.num_threads is not None else DEFAULT_NUM_THREADS[self.engine]

    @property
    def job_num_threads(self) -> int:
        """The intra-op threads client jobs train with: a Ray executor's own ``num_threads``, else the run's."""
        if self.executor is not None and self.executor.num_threads is not None:
            return self.executor.num_threads
        return self.effective_num_threads

    def request_stop(self, reason: str = "callback") -> None:
        """End the run at the next event boundary; ``reason`` (the first one asked) becomes the ``stop_reason``."""
        if not self.should_stop or self.stop_reason is None:
            self.stop_reason = reason
        self.should_stop = True

    # -- public API -------------------------------------------------------------------------------------------
    def fit(
        self,
        model: L.LightningModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: L.LightningDataModule | None = None,
        ckpt_path: str | None = None,
    ) -> None:
        """Run the federated simulation (the data given as to ``lightning.Trainer.fit``).

        Args:
            model: The model; its initial weights are the initial global model, and it holds the final global
                weights afterwards (also as :attr:`global_model`).
            train_dataloaders: A ``DataLoader`` whose dataset is split into the clients (its ``batch_size``,
                ``collate_fn`` and ``drop_last`` are each client's), or a data module (as in Lightning,
                ``fit(model, dm)`` is ``fit(model, datamodule=dm)``). ``None``: the data module's, else the
                module's own ``train_dataloader`` hook.
            val_dataloaders: What evaluates the global model (a ``DataLoader`` or a list of them); ``None``: the
                module's own ``val_dataloader`` hook where it has one, else no evaluation.
            datamodule: A :class:`~lit_asyncfl.data.FederatedDataModule`, or any ``LightningDataModule`` (split IID
                unless wrapped in :class:`~lit_asyncfl.data.PartitionedDataModule`).
            ckpt_path: Resume from a checkpoint written by this trainer (same configuration; budgets may differ).
        """
        datamodule = fit_data(model, train_dataloaders, val_dataloaders, datamodule, self.engine)
        torch.set_num_threads(self.effective_num_threads)
        self._wall_start, self._wall_offset = time.perf_counter(), 0.0
        self._log_dir = None
        self.should_stop, self.stop_reason = False, None
        self.summary = {}
        self.run_started = False
        checkpoint = ckpt.load(ckpt_path, self.device) if ckpt_path is not None else None
        try:
            sim = self._build(model, datamodule)
            _ = self.log_dir  # created (exclusively) and checked writable before anything runs
        except BaseException:
            if self.executor is not None:
                self.executor.stop()
            raise
        try:
            if checkpoint is not None:
                restore_run(self, checkpoint, str(ckpt_path))
            self._hooks.call("on_fit_start")
            if checkpoint is None:
                sim.start()
                self._hooks.raise_pending()  # a callback that raised during the first dispatches' evaluation
                if not self.history:  # the scheduler may have evaluated the initial model already
                    self._hooks.evaluate(sim)
            self.run_started = True
            loop_reason = sim.run(
                self.max_virtual_time,
                self.max_versions,
                self._hooks.after_event,
                max_stalled_arrivals=max(100, 10 * self.num_clients),
            )
            finish_run(self, sim, loop_reason)
            self._hooks.call("on_fit_end")
        except BaseException as exc:
            record_failure(self, sim, exc)
            raise  # the original exception, never one raised while handling it
        finally:
            if self.executor is not None:
                self.executor.stop()  # the run's workers are released (kept for the next run, or ended)
            if self.client_state is not None:
                self.client_state.release()  # memory freed; files only the last checkpoint refers to are kept

    def validate(
        self,
        model: L.LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: L.LightningDataModule | None = None,
    ) -> list[dict[str, float]]:
        """Evaluate a model on the validation data, as ``lightning.Trainer.validate`` does.

        Args:
            model: The model (default: the global model after :meth:`fit`).
            dataloaders: The validation loader(s), or a data module (as in Lightning, ``validate(model, dm)`` is
                ``validate(model, datamodule=dm)``).
            datamodule: The data. Without ``dataloaders`` or ``datamodule``: a passed module's own
                ``val_dataloader`` hook, else the data of :meth:`fit`.
            ckpt_path: Weights to evaluate: a checkpoint of this library or any Lightning checkpoint of the model,
                ``"best"`` (the best model of a :class:`~lit_asyncfl.callbacks.ModelCheckpoint`) or ``"last"``
                (this run's ``last.ckpt``); ``None``: the model's current weights.
            verbose: Print the results table.

        Returns:
            A list with one dict of the logged metrics.
        """
        return run_stage(
            self, "validate", model, eval_data("validate", model, dataloaders, datamodule), ckpt_path, verbose
        )

    def test(
        self,
        model: L.LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | None = None,
        verbose: bool = True,
        datamodule: L.LightningDataModule | None = None,
    ) -> list[dict[str, float]]:
        """Evaluate a model on the test data, as ``lightning.Trainer.test`` does (arguments as :meth:`validate`).

        Returns:
            A list with one dict of the logged metrics.
        """
        return run_stage(self, "test", model, eval_data("test", model, dataloaders, datamodule), ckpt_path, verbose)

    def save_checkpoint(self, path: str | os.PathLike, weights_only: bool = False) -> None:
        """Write a Lightning checkpoint of the current global model (atomically).

        Args:
            path: Where to write it.
            weights_only: Save the global model only. Otherwise the file also holds the whole simulation, the
                history and the run callbacks' states, and resumes the run exactly: that needs a consistent state,
                i.e. an event boundary (e.g. in ``on_event_end`` or ``on_fit_end``, not ``on_evaluation_end``).
        """
        save_run_checkpoint(self, path, weights_only)

    # -- wiring -----------------------------------------------------------------------------------------------
    def _build(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> Simulator:
        return build_run(self, model, datamodule, sequential=SequentialExecutor)

    def _wall_seconds(self) -> float:
        return self._wall_offset + (time.perf_counter() - self._wall_start)
