"""``FederatedTrainer``: checks the settings, wires the parts of a federated run together, and runs it.

What happens around the global loop lives in run callbacks (:mod:`lit_asyncfl.callbacks`): progress and Ctrl-C,
logging, output files, checkpoints, and the user's own. The global evaluation is the run's validation loop
(:class:`~lit_asyncfl.evaluation.GlobalEvaluation`); the checkpoint format is :mod:`lit_asyncfl.checkpoint`.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
import warnings
from collections.abc import Iterable
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.loggers import Logger

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl import namespaces
from lit_asyncfl.algorithms import Algorithm, get_algorithm
from lit_asyncfl.availability import AlwaysAvailable, Availability
from lit_asyncfl.callbacks import Callback, ModelCheckpoint, RunCheckpoint
from lit_asyncfl.callbacks.connector import CallbackConnector, configure_callbacks
from lit_asyncfl.checks import check, check_bool, check_choice, check_int, check_number, check_path
from lit_asyncfl.core.client_state import ClientStateStore, relative_manifest, resolved_manifest
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import ON_CLIENT_ERROR, Simulator, sample_profiles
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data.base import FederatedDataModule, PartitionedDataModule
from lit_asyncfl.data.loaders import eval_data, fit_data
from lit_asyncfl.devices import DeviceModel, UniformRatio
from lit_asyncfl.evaluation import GlobalEvaluation, eval_loader, evaluate_stage
from lit_asyncfl.executors.factory import DEFAULT_NUM_THREADS, build_executor, check_engine, resolve_device
from lit_asyncfl.executors.ray.executor import RayExecutor, check_executor
from lit_asyncfl.executors.sequential import SequentialExecutor
from lit_asyncfl.hparams import run_fingerprint, run_hyperparameters
from lit_asyncfl.loggers import claim_log_dir, resolve_loggers
from lit_asyncfl.loops.contract import (
    check_lightning_contract,
    check_manual_optimization,
    check_model_fits_data,
    evaluation_loaders,
)
from lit_asyncfl.reporting import run_summary
from lit_asyncfl.trainer_flags import lightning_flags_refused

log = logging.getLogger("lit_asyncfl")


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
            then ~25% faster steps; needs a C++ compiler); an error with the other engines.
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
        self.algorithm = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
        check(
            isinstance(self.algorithm, Algorithm), f"algorithm must be an Algorithm or a preset name, got {algorithm!r}"
        )
        check_int("num_clients", num_clients, 1)
        check_int("local_epochs", local_epochs, 1)
        check(
            max_virtual_time is not None or max_versions is not None,
            "set a budget: max_virtual_time (virtual seconds) and/or max_versions (aggregations)",
        )
        check_number("max_virtual_time", max_virtual_time, 0, open_min=True, optional=True, finite=False)
        check_int("max_versions", max_versions, 1, optional=True)
        check(
            max_versions is not None or max_virtual_time < float("inf"),
            f"max_virtual_time={max_virtual_time!r} without max_versions leaves the run no finite budget; set a "
            "budget: a finite max_virtual_time (virtual seconds) and/or max_versions (aggregations)",
        )
        check(
            device_model is None or isinstance(device_model, DeviceModel),
            f"device_model must be a DeviceModel or None, got {device_model!r}",
        )
        check(
            availability is None or isinstance(availability, Availability),
            f"availability must be an Availability (see lit_asyncfl.availability) or None, got {availability!r}",
        )
        check_number("target_accuracy", target_accuracy)
        check_path("default_root_dir", default_root_dir)
        check_bool("enable_progress_bar", enable_progress_bar)
        check_bool("print_summary", print_summary)
        check_bool("compile_cohort", compile_cohort)
        check(
            mode == "max" or not self.algorithm.scheduler.needs_accuracy,
            f"{self.algorithm.name} reads the monitored metric as an accuracy (higher is better): use mode='max' "
            "and monitor an accuracy-like metric",
        )
        check(
            isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32,
            f"seed must be an integer in [0, 2**32), got {seed!r}",
        )
        check_int("checkpoint_every", checkpoint_every, 1, optional=True)
        check_engine(engine, onednn, compile_cohort, num_threads)
        check_number("checkpoint_every_seconds", checkpoint_every_seconds, 0, open_min=True, optional=True)
        check_choice("on_client_error", on_client_error, ON_CLIENT_ERROR)
        check(
            on_client_error == "raise" or engine != "cohort",
            "on_client_error='drop' needs engine='fast' or 'lightning': the cohort engine trains its jobs in one "
            "batched call, so one job's failure cannot be told from the others'",
        )
        check_executor(executor)
        check_int("client_state_budget", client_state_budget, 0, optional=True)
        stateful = [type(cb).__name__ for cb in self.algorithm.client_callbacks if cb.uses_client_state]
        check(
            not any(cb.uses_client_state and cb.runs_on_workers for cb in self.algorithm.client_callbacks),
            f"client callbacks {stateful} keep per-client state, which lives in the simulation's process: they "
            "must keep runs_on_workers=False",
        )
        self.algorithm.scheduler.setup(num_clients)  # e.g. concurrency larger than num_clients fails here

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
                self._restore(checkpoint, str(ckpt_path))
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
            self._finish(sim, loop_reason)
            self._hooks.call("on_fit_end")
        except BaseException as exc:
            if self._hooks.pending is not None and self._hooks.pending is not exc:  # the event itself raised after
                log.warning("lit_asyncfl: a run callback had raised earlier in the failing event: %r",
                            self._hooks.pending)  # fmt: skip
                _add_note(exc, f"(a run callback had raised earlier in the same event: {self._hooks.pending!r})")
                self._hooks.pending = None
            if self.run_started:  # else (a refused resume, a failing start) nothing of a run exists to write
                self._summarize_failure(sim, exc)
            for error in self._hooks.call_all("on_exception", exc):  # every callback's, whatever one raises
                _add_note(exc, f"(while handling it, on_exception of a run callback raised {error!r})")
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
        return self._evaluate_stage(
            "validate", model, eval_data("validate", model, dataloaders, datamodule), ckpt_path, verbose
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
        return self._evaluate_stage(
            "test", model, eval_data("test", model, dataloaders, datamodule), ckpt_path, verbose
        )

    def save_checkpoint(self, path: str | os.PathLike, weights_only: bool = False) -> None:
        """Write a Lightning checkpoint of the current global model (atomically).

        Args:
            path: Where to write it.
            weights_only: Save the global model only. Otherwise the file also holds the whole simulation, the
                history and the run callbacks' states, and resumes the run exactly: that needs a consistent state,
                i.e. an event boundary (e.g. in ``on_event_end`` or ``on_fit_end``, not ``on_evaluation_end``).
        """
        sim, model, flat = self.simulator, self.global_model, self._flat
        if sim is None or model is None or flat is None:
            raise RuntimeError("nothing to checkpoint: call fit() first")
        if not weights_only and sim.in_event:
            raise RuntimeError(
                "a resumable checkpoint can only be written between events (on_event_end, on_fit_end); pass "
                "weights_only=True to save the global model alone"
            )
        flat.load(sim.server.weights)
        run: dict[str, Any] = {"version": sim.server.version, "virtual_time": sim.now}
        if not weights_only:
            simulation = sim.state_dict()
            if "client_state" in simulation:  # its files named relative to the checkpoint: the run dir may move
                base = os.path.dirname(os.path.abspath(path))
                simulation["client_state"] = relative_manifest(simulation["client_state"], base)
            run.update(
                fingerprint=self._fingerprint,
                monitor=self.evaluation.monitor_name,
                simulation=simulation,
                **self._resumable_history_and_callbacks(),
                wall_seconds=self._wall_seconds(),
            )
        checkpoint = ckpt.model_checkpoint(model, self._user_datamodule, sim.server.version, run)
        self._hooks.call("on_save_checkpoint", checkpoint)  # as Lightning: the callbacks', then the module's
        model.on_save_checkpoint(checkpoint)
        ckpt.save(checkpoint, path)

    # -- wiring -----------------------------------------------------------------------------------------------
    def _build(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> Simulator:
        if not isinstance(model, namespaces.classes("LightningModule")):
            raise TypeError(f"model must be a LightningModule, got {type(model).__name__}")
        if not isinstance(datamodule, namespaces.classes("LightningDataModule")):
            raise TypeError(f"datamodule must be a LightningDataModule, got {type(datamodule).__name__}")
        dm = datamodule if isinstance(datamodule, FederatedDataModule) else PartitionedDataModule(datamodule)
        dm.prepare_data()
        dm.setup("fit")
        self.datamodule = dm
        dm.check_model(model)
        self._user_datamodule = datamodule
        ckpt.check_hparams_loadable(model)
        ckpt.check_hparams_loadable(datamodule)
        check_lightning_contract(model, self.engine, datamodule)
        algo = self.algorithm
        check_manual_optimization(model, algo.client_callbacks)
        for cb in algo.client_callbacks:
            cb.check_module(model)
        self.client_state = None
        if any(cb.uses_client_state for cb in algo.client_callbacks):
            self.client_state = ClientStateStore(
                self.client_state_budget, directory=lambda: os.path.join(self.log_dir, "client_state")
            )
            for cb in algo.client_callbacks:
                if cb.uses_client_state:
                    cb.client_state = self.client_state
        fraction = max((cb.server_data_fraction for cb in algo.server_callbacks), default=0.0)
        server_set = dm.split_server_data(fraction, self.seed)  # before the clients' partition
        profiles = sample_profiles(self.device_model, self.num_clients, self.seed)
        shards = dm.client_shards(self.num_clients, self.seed, self.device, slowness=profiles.time_per_sample)
        smallest = min(shards.num_samples(c) for c in range(self.num_clients))
        check(
            not dm.drop_last or smallest >= dm.batch_size,
            f"drop_last=True with batch_size={dm.batch_size}, but a client holds {smallest} samples: its jobs would "
            "take no step; use fewer clients, a smaller batch_size or drop_last=False",
        )
        model.to(self.device)
        probe_batch = next(iter(shards.batches(0, dm.batch_size, torch.Generator().manual_seed(self.seed))))
        check_model_fits_data(model, probe_batch, type(datamodule).__name__)
        for cb in algo.client_callbacks:  # what a client callback can only check on a real batch (e.g. MOON's z)
            if callable(getattr(cb, "check_batch", None)):
                cb.check_batch(model, probe_batch)
        self.global_model = model
        self._flat = flat = FlatParameters(model)
        executor = build_executor(
            self.engine,
            model,
            shards,
            dm.batch_size,
            algo.client_callbacks,
            self.device,
            onednn=self.onednn,
            compile_cohort=self.compile_cohort,
            sequential=SequentialExecutor,
            executor=self.executor,
            num_threads=self.effective_num_threads,
        )
        server = Server(
            flat.read(),
            algo.aggregator,
            algo.server_callbacks,
            self.num_clients,
            data=None if server_set is None else tuple(t.to(self.device) for t in server_set.tensors[:2]),
            workspace_factory=lambda: ModelWorkspace(model, self.device),
            param_numel=flat.param_numel,
        )
        hooks = self._hooks
        self.simulator = sim = Simulator(
            server=server,
            scheduler=algo.scheduler,
            executor=executor,
            device_model=self.device_model,
            num_samples=[shards.num_samples(c) for c in range(self.num_clients)],
            local_epochs=self.local_epochs,
            batch_size=dm.batch_size,
            drop_last=dm.drop_last,
            seed=self.seed,
            model_bytes=flat.nbytes,
            client_callbacks=algo.client_callbacks,
            profiles=profiles,
            evaluator=lambda: hooks.current_metrics(sim),
            observers=[hooks],
            on_client_error=self.on_client_error,
            availability=self.availability,
            client_state=self.client_state,
        )
        self._check_some_device_comes_online(sim)
        evaluation = self.evaluation
        loaders = evaluation_loaders(model, lambda: eval_loader(dm), evaluation.monitor, algo.scheduler, self.callbacks)
        self.evaluation.setup(model, flat.load, loaders, self._wall_seconds, self.seed)
        self._final_state = None
        self._hooks.setup()
        self._fingerprint = run_fingerprint(self, model, flat.numel, dm, flat.flat.dtype)
        self._hparams = run_hyperparameters(self, self._init_args, model, datamodule)
        return sim

    def _check_some_device_comes_online(self, sim: Simulator) -> None:
        """Refuse an availability under which no update can ever arrive: no device ever online, or none before the
        virtual-time budget (known at fit start; a trace is exact)."""
        if self.availability.always_online:
            return
        first = self.availability.next_online(np.arange(self.num_clients), 0.0)
        name = type(self.availability).__name__
        check(
            math.isfinite(first),
            f"no device is ever online under the availability {name} (for {self.num_clients} clients): no update "
            "can arrive; check the trace or the model's parameters",
        )
        check(
            self.max_virtual_time is None or first <= self.max_virtual_time,
            f"under the availability {name} the first device comes online at virtual time {first:g}, after "
            f"max_virtual_time={self.max_virtual_time!r}: no update can arrive; raise max_virtual_time (or scale the "
            "trace's time_scale)",
        )

    def _restore(self, checkpoint: dict[str, Any], path: str) -> None:
        assert self.simulator is not None and self.global_model is not None and self._flat is not None
        run = ckpt.run_entries(checkpoint, path, self._fingerprint, self._flat.flat)
        dropped = int(run["simulation"].get("dropped", {}).get("client_error", 0))
        check(
            self.on_client_error == "drop" or dropped == 0,
            f"checkpoint {path} was written with on_client_error='drop' after {dropped} failing job(s) were dropped: "
            "a run with on_client_error='raise' would have stopped at the first; resume with on_client_error='drop'",
        )
        simulation = run["simulation"]
        if "client_state" in simulation:
            base = os.path.dirname(os.path.abspath(path))
            simulation = {**simulation, "client_state": resolved_manifest(simulation["client_state"], base)}
        self.simulator.load_state_dict(simulation)
        ckpt.restore_lightning_state(self.global_model, self._user_datamodule, checkpoint)
        self.evaluation.restore(run["history"], run["monitor"])
        self._wall_offset = float(run["wall_seconds"])
        states = run["callbacks"]
        for cb in self.callbacks:
            if cb.state_key in states:
                cb.load_state_dict(states[cb.state_key])
        self._hooks.call("on_load_checkpoint", checkpoint)

    # -- the loop ---------------------------------------------------------------------------------------------
    def _wall_seconds(self) -> float:
        return self._wall_offset + (time.perf_counter() - self._wall_start)

    def _resumable_history_and_callbacks(self) -> dict[str, Any]:
        """The history and callback states to checkpoint (copied: callbacks may keep mutating theirs)."""
        if self._final_state is not None:
            return self._final_state
        states = {cb.state_key: copy.deepcopy(cb.state_dict()) for cb in self.callbacks}
        return {"history": [dict(row) for row in self.history], "callbacks": states}

    def _finish(self, sim: Simulator, loop_reason: str) -> None:
        if loop_reason == "stalled":
            warnings.warn(
                f"stopped: the last {sim.stalled_arrivals} updates produced no new global version "
                f"(rejection reasons so far: {sim.server.stats.reasons or 'none'}; jobs dropped: "
                f"{dict(sim.dropped) or 'none'})",
                RuntimeWarning,
                stacklevel=3,
            )
        if loop_reason == "queue_empty" and not self.availability.always_online:
            back = self.availability.next_online(np.arange(self.num_clients), sim.now)
            warnings.warn(
                f"stopped at virtual time {sim.now:g} (version {sim.server.version}) with nothing left to happen: "
                f"{'no device is online again' if math.isinf(back) else f'no job in flight until {back:g}'} under "
                f"the availability {type(self.availability).__name__}; jobs dropped: {dict(sim.dropped) or 'none'}",
                RuntimeWarning,
                stacklevel=3,
            )
        reason = (self.stop_reason or "callback") if loop_reason == "stopped" else loop_reason
        # What an uninterrupted run has too: the end-of-run checkpoint keeps these, so the off-schedule evaluation
        # that ends this run is neither in the history nor in the callbacks' states of the run it resumes.
        self._final_state = self._resumable_history_and_callbacks()
        if not self.evaluation.has(sim.server.version):
            self.final_evaluation = True
            try:
                self._hooks.evaluate(sim)
            finally:
                self.final_evaluation = False
        self._summarize(sim, reason)

    def _summarize(self, sim: Simulator, reason: str) -> None:
        """End the run's record: the global model holds the final weights, :attr:`summary` says how it went."""
        self.stop_reason = reason
        assert self._flat is not None
        self._flat.load(sim.server.weights)
        self.summary = run_summary(
            self.history,
            sim,
            algorithm=self.algorithm.name,
            num_clients=self.num_clients,
            monitor=self.evaluation.monitor_name,
            mode=self.evaluation.mode,
            target=self.target_accuracy,
            stop_reason=reason,
            wall_seconds=self._wall_seconds(),
        )

    def _summarize_failure(self, sim: Simulator, exc: BaseException) -> None:
        """The summary of a run an exception ended, for the outputs the callbacks then write (never raises: the
        original exception is what the user must see)."""
        try:
            self._summarize(sim, f"error: {type(exc).__name__}")
        except Exception as error:  # pragma: no cover (a secondary failure must not hide the first)
            log.warning("lit_asyncfl: could not summarize the failed run: %r", error)

    # -- validate and test ------------------------------------------------------------------------------------
    def _evaluate_stage(
        self,
        stage: str,
        model: L.LightningModule | None,
        datamodule: L.LightningDataModule | None,
        ckpt_path: str | None,
        verbose: bool,
    ) -> list[dict[str, float]]:
        model = model if model is not None else self.global_model
        dm = datamodule if datamodule is not None else self.datamodule
        if model is None or dm is None:
            raise RuntimeError(f"{stage}: pass a model and a datamodule, or call fit() first")
        if ckpt_path is not None:
            path = self._resolve_ckpt_path(ckpt_path)
            ckpt.load_model_weights(model, ckpt.load(path, self.device))
        elif self.global_model is None:
            warnings.warn(
                f"{stage}() without ckpt_path and without a preceding fit(): evaluating the model's INITIAL weights. "
                "Pass ckpt_path=<a checkpoint, e.g. a run's checkpoints/last.ckpt> to evaluate a trained model",
                UserWarning,
                stacklevel=3,
            )
        return evaluate_stage(model.to(self.device), dm, stage, verbose)

    def _resolve_ckpt_path(self, ckpt_path: str) -> str:
        if ckpt_path == "last":
            path = os.path.join(self.log_dir, RunCheckpoint.FILENAME)
            if self.simulator is None or not os.path.isfile(path):
                raise ValueError('ckpt_path="last" needs a preceding fit() of this trainer')
            return path
        if ckpt_path == "best":
            best = [cb.best_model_path for cb in self.callbacks if isinstance(cb, ModelCheckpoint) and cb.monitor]
            if not best or not best[0]:
                raise ValueError(
                    'ckpt_path="best" needs a ModelCheckpoint(monitor=...) in callbacks that has saved a model; '
                    "pass a checkpoint path instead"
                )
            return best[0]
        return ckpt_path


def _add_note(exc: BaseException, note: str) -> None:
    """Attach ``note`` to ``exc`` where Python can (3.11+); on 3.10 the note is only in the log, which already has it,
    so that handling a failure never replaces the run's own exception with an ``AttributeError``."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
