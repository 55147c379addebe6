"""``FederatedTrainer``: the user-facing entry point of a federated simulation."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.seed import seed_everything
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_asyncfl.algorithms import Algorithm, get_algorithm
from lit_asyncfl.client.engines import DEFAULT_NUM_THREADS, build_executor, check_engine
from lit_asyncfl.client.trainer import SequentialExecutor
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import Simulator, sample_profiles
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data.base import FederatedDataModule, PartitionedDataModule
from lit_asyncfl.devices import DeviceModel, DeviceProfiles, UniformRatio
from lit_asyncfl.evaluation import evaluate, find_metric
from lit_asyncfl.reporting import (
    first_reaching,
    format_summary,
    plot_history,
    plot_partition,
    write_history_csv,
    write_partition_csv,
)
from lit_asyncfl.tracking import WandbRun, is_wandb

CHECKPOINT_FORMAT = "lit_asyncfl.checkpoint.v1"
ACCELERATORS = ("cpu", "cuda", "gpu", "auto")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    _check(value >= minimum, f"{name} must be >= {minimum}, got {value}")


def describe(obj: Any, depth: int = 0) -> Any:
    """A plain, comparable description of a configuration object: its class and public simple attributes.

    Nested components (schedulers, aggregators, callbacks, partitioners, ...) are described recursively; tensors,
    datasets and other heavy or mutable state are left out.

    Example:
        >>> from lit_asyncfl.algorithms import FedAsync
        >>> describe(FedAsync(alpha=0.3))["aggregator"]["alpha"]
        0.3
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        if len(obj) > 64:  # data, not configuration
            return _SKIP
        items = [describe(v, depth + 1) for v in obj]
        return [v for v in items if v is not _SKIP]
    if isinstance(obj, dict):
        if len(obj) > 64 or not all(isinstance(k, str) for k in obj):
            return _SKIP
        items = {k: describe(v, depth + 1) for k, v in obj.items()}
        return {k: v for k, v in items.items() if v is not _SKIP}
    if depth > 4 or not hasattr(obj, "__dict__") or isinstance(obj, (torch.Tensor, torch.nn.Module)):
        return _SKIP
    out: dict[str, Any] = {"class": type(obj).__qualname__}
    for key, value in vars(obj).items():
        if key.startswith("_") or isinstance(value, set):
            continue
        described = describe(value, depth + 1)
        if described is not _SKIP:
            out[key] = described
    return out


_SKIP = object()


def _eval_loader(dm: L.LightningDataModule) -> Any:
    """The validation loader, else the test loader, else ``None`` (evaluation is then skipped)."""
    for name in ("val_dataloader", "test_dataloader"):
        try:
            return getattr(dm, name)()
        except (MisconfigurationException, NotImplementedError):
            continue
    warnings.warn(
        f"{type(dm).__name__} has no val_dataloader or test_dataloader: the global model is not evaluated",
        UserWarning,
        stacklevel=3,
    )
    return None


class FederatedTrainer:
    """Simulates federated training of a ``LightningModule`` on a virtual clock.

    The training set of the data module is split into ``num_clients`` clients; the algorithm's scheduler dispatches
    clients, each trains ``local_epochs`` epochs on its shard with the module's own ``training_step`` and
    ``configure_optimizers``, and its update reaches the server after a simulated duration drawn from the device
    model. The global model is evaluated every ``eval_every`` versions with the module's ``validation_step``.

    After :meth:`fit`: :attr:`global_model` (the module, holding the final global weights), :attr:`history` (one
    dict per evaluation), :attr:`summary`, and in :attr:`log_dir` ``history.csv``, ``summary.json`` and
    ``accuracy.png``.

    Results depend only on the configuration and ``seed``: never on wall-clock time. The global RNGs are seeded
    at construction, so a model built after the trainer starts from the same initial weights each run.

    Args:
        algorithm: An :class:`~lit_asyncfl.algorithms.Algorithm` (e.g. ``FedAsync()``) or a preset name
            (``"fedavg"``, ``"fedprox"``, ``"fedasync"``, ``"fedbuff"``).
        num_clients: Number of simulated clients.
        local_epochs: Local epochs ``E`` per client job.
        max_virtual_time: Stop after the last event at or before this virtual time (seconds).
        max_versions: Stop when the global model reaches this version (number of aggregations).
        device_model: Simulated device heterogeneity (default: :class:`~lit_asyncfl.devices.UniformRatio` with a
            5x slowest/fastest ratio).
        eval_every: Evaluate the global model every this many versions (and at the start and end).
        target_accuracy: Accuracy whose first attainment is reported as ``time_to_target``.
        seed: Seed of everything random in the run (partition, devices, client choice, local batches, init).
        accelerator: ``"cpu"``, ``"cuda"`` (alias ``"gpu"``) or ``"auto"``.
        logger: A Lightning logger (or several), ``True`` for a ``CSVLogger`` under ``default_root_dir``, or
            ``False``/``None`` for none. Metrics are logged against the version as step, with ``virtual_time``.
        default_root_dir: Where the default logger and the outputs go.
        enable_progress_bar: Show a progress bar over virtual time (or versions).
        print_summary: Print the summary table at the end of :meth:`fit`.
        checkpoint_every: Save ``checkpoints/last.ckpt`` in the log dir every this many events (``None``: only at
            the end of the run).
        num_threads: Intra-op threads (``torch.set_num_threads``) for the run; ``None``: the engine's default, one
            thread for ``fast`` and ``lightning`` (a client update is too small to split over threads, and extra
            threads slow it down as soon as another process competes for the cores), also for ``cohort``, which
            gains from more threads only on an otherwise idle machine.
        engine: How client updates are computed: ``"fast"`` (a minimal loop over the module's ``training_step``
            and ``configure_optimizers``), ``"lightning"`` (a real ``lightning.Trainer`` per update, for modules
            that need one: their own callbacks, ``self.log``, ``self.trainer``; bit-identical to ``fast``) or
            ``"cohort"`` (every in-flight job at once with ``torch.func.vmap``; plain SGD, no BatchNorm; equal to
            ``fast`` up to float32 rounding). See :mod:`lit_asyncfl.client.engines`.
        onednn: Use oneDNN (``torch.backends.mkldnn``) kernels during local training; ``None``: automatic, off on
            the CPU for small convolutions (where the plain kernels are faster), else unchanged. Switching it
            changes float results in the last bits (about 1e-8 in LeNet-5 weights), never their determinism.
        compile_cohort: ``torch.compile`` the ``cohort`` engine's batched step (about a minute of compilation first,
            then ~25% faster steps; needs a C++ compiler); an error with the other engines.

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
        default_root_dir: str = "runs",
        enable_progress_bar: bool = True,
        print_summary: bool = True,
        checkpoint_every: int | None = None,
        num_threads: int | None = None,
        engine: str = "fast",
        onednn: bool | None = None,
        compile_cohort: bool = False,
    ) -> None:
        self.algorithm = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
        _check(
            isinstance(self.algorithm, Algorithm), f"algorithm must be an Algorithm or a preset name, got {algorithm!r}"
        )
        _check_int("num_clients", num_clients, 1)
        _check_int("local_epochs", local_epochs, 1)
        _check(
            max_virtual_time is not None or max_versions is not None,
            "set a budget: max_virtual_time (virtual seconds) and/or max_versions (aggregations)",
        )
        _check(
            max_virtual_time is None or max_virtual_time > 0, f"max_virtual_time must be > 0, got {max_virtual_time}"
        )
        _check_int("max_versions", max_versions, 1, optional=True)
        _check_int("eval_every", eval_every, 1)
        _check(0 < target_accuracy <= 1, f"target_accuracy must be in (0, 1], got {target_accuracy}")
        _check(
            isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32,
            f"seed must be an integer in [0, 2**32), got {seed!r}",
        )
        _check(accelerator in ACCELERATORS, f"unknown accelerator {accelerator!r}; allowed: {list(ACCELERATORS)}")
        _check_int("checkpoint_every", checkpoint_every, 1, optional=True)
        _check_int("num_threads", num_threads, 1, optional=True)
        check_engine(engine)
        _check(onednn is None or isinstance(onednn, bool), f"onednn must be True, False or None, got {onednn!r}")
        _check(
            not compile_cohort or engine == "cohort",
            f"compile_cohort=True needs engine='cohort', got engine={engine!r}",
        )
        self.algorithm.scheduler.setup(num_clients)  # e.g. concurrency larger than num_clients fails here

        self.num_clients = num_clients
        self.local_epochs = local_epochs
        self.max_virtual_time = max_virtual_time
        self.max_versions = max_versions
        self.device_model = device_model if device_model is not None else UniformRatio(ratio=5.0)
        self.eval_every = eval_every
        self.target_accuracy = target_accuracy
        self.seed = seed
        self.device = self._resolve_device(accelerator)
        self.default_root_dir = default_root_dir
        self.loggers = self._resolve_loggers(logger)
        self.enable_progress_bar = enable_progress_bar
        self.print_summary = print_summary
        self.checkpoint_every = checkpoint_every
        self.num_threads = num_threads
        self.engine = engine
        self.onednn = onednn
        self.compile_cohort = compile_cohort
        #: Configuration recorded with the run (the CLI stores the full parsed config here).
        self.run_config: dict[str, Any] | None = None

        self.global_model: L.LightningModule | None = None
        self.datamodule: L.LightningDataModule | None = None
        self.history: list[dict[str, Any]] = []
        self.summary: dict[str, Any] = {}
        self.simulator: Simulator | None = None
        self._flat: FlatParameters | None = None
        self._profiles: DeviceProfiles | None = None
        self._eval_batches: list[Any] | None = None
        self._wall_offset = 0.0
        self._wall_start = 0.0
        self._stop_requested = False
        self._stop_reason = ""
        self._wandb_runs: dict[int, WandbRun] = {}
        self._log_dir: str | None = None
        self._fingerprint_value: dict[str, Any] = {}
        seed_everything(seed, verbose=False)

    # -- construction helpers ---------------------------------------------------------------------------------
    @staticmethod
    def _resolve_device(accelerator: str) -> torch.device:
        if accelerator == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if accelerator in ("cuda", "gpu"):
            _check(torch.cuda.is_available(), f"accelerator={accelerator!r} but no CUDA device is available; use 'cpu'")
            return torch.device("cuda")
        return torch.device("cpu")

    def _resolve_loggers(self, logger: Logger | Iterable[Logger] | bool | None) -> list[Logger]:
        if logger is True:
            return [CSVLogger(self.default_root_dir, name=self.algorithm.name)]
        if logger is False or logger is None:
            return []
        if isinstance(logger, Logger):
            return [logger]
        return list(logger)

    @property
    def logger(self) -> Logger | None:
        """The first logger, or ``None``."""
        return self.loggers[0] if self.loggers else None

    @property
    def log_dir(self) -> str:
        """Directory of the run's outputs.

        The first logger's ``log_dir`` (CSV, TensorBoard), else a new ``default_root_dir/<algorithm>/version_N``
        (loggers without a local log dir, such as W&B, or no logger), fixed for the duration of a ``fit``.
        """
        if self._log_dir is None:
            for lg in self.loggers:
                path = getattr(lg, "log_dir", None)
                if path:
                    return str(path)
            root = Path(self.default_root_dir) / self.algorithm.name
            existing = [int(p.name.split("_")[1]) for p in root.glob("version_*") if p.name.split("_")[1].isdigit()]
            self._log_dir = str(root / f"version_{max(existing, default=-1) + 1}")
        return self._log_dir

    # -- public API -------------------------------------------------------------------------------------------
    def fit(
        self,
        model: L.LightningModule,
        datamodule: L.LightningDataModule,
        ckpt_path: str | None = None,
    ) -> None:
        """Run the federated simulation.

        Args:
            model: The model; its initial weights are the initial global model, and it holds the final global
                weights afterwards (also as :attr:`global_model`).
            datamodule: A :class:`~lit_asyncfl.data.FederatedDataModule`, or any ``LightningDataModule`` (split IID
                unless wrapped in :class:`~lit_asyncfl.data.PartitionedDataModule`).
            ckpt_path: Resume from a checkpoint written by this trainer (same configuration; budgets may differ).
        """
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        self._wall_start = time.perf_counter()
        self._log_dir = None
        self._wandb_runs = {}  # a logger may have started a new W&B run since the last fit
        sim = self._build(model, datamodule)
        if ckpt_path is not None:
            self._load_checkpoint(ckpt_path)
        else:
            self.history = []
            self._wall_offset = 0.0
            sim.start()
            if not self.history:  # the scheduler may have evaluated the initial model already
                self._evaluate_and_log()
        self._log_hyperparams()
        self._run(sim)
        self._finish(sim)

    def validate(self, model: L.LightningModule | None = None, datamodule: L.LightningDataModule | None = None):
        """Evaluate a model (default: the global model after :meth:`fit`) on the validation data.

        Returns:
            A list with one dict of the logged metrics, as ``lightning.Trainer.validate`` does.
        """
        return [self._evaluate_stage(model, datamodule, "val")]

    def test(self, model: L.LightningModule | None = None, datamodule: L.LightningDataModule | None = None):
        """Evaluate a model (default: the global model after :meth:`fit`) on the test data.

        Returns:
            A list with one dict of the logged metrics, as ``lightning.Trainer.test`` does.
        """
        return [self._evaluate_stage(model, datamodule, "test")]

    def save_checkpoint(self, path: str | os.PathLike) -> None:
        """Write the full simulation state at the current event boundary (atomically)."""
        if self.simulator is None:
            raise RuntimeError("nothing to checkpoint: call fit() first")
        state = {
            "format": CHECKPOINT_FORMAT,
            "fingerprint": self._fingerprint_value,
            "eval_every": self.eval_every,
            "simulation": self.simulator.state_dict(),
            "history": self.history,
            "wall_seconds": self._wall_seconds(),
        }
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    # -- internals --------------------------------------------------------------------------------------------
    def _build(self, model: L.LightningModule, datamodule: L.LightningDataModule) -> Simulator:
        if not isinstance(model, L.LightningModule):
            raise TypeError(f"model must be a LightningModule, got {type(model).__name__}")
        if not isinstance(datamodule, L.LightningDataModule):
            raise TypeError(f"datamodule must be a LightningDataModule, got {type(datamodule).__name__}")
        dm = datamodule if isinstance(datamodule, FederatedDataModule) else PartitionedDataModule(datamodule)
        dm.prepare_data()
        dm.setup("fit")
        self.datamodule = dm
        dm.check_model(model)
        algo = self.algorithm
        fraction = max((cb.server_data_fraction for cb in algo.server_callbacks), default=0.0)
        server_set = dm.split_server_data(fraction, self.seed)  # before the clients' partition
        profiles = sample_profiles(self.device_model, self.num_clients, self.seed)
        self._profiles = profiles
        shards = dm.client_shards(self.num_clients, self.seed, self.device, slowness=profiles.time_per_sample)
        model.to(self.device)
        self.global_model = model
        self._flat = FlatParameters(model)
        if self.num_threads is None:
            torch.set_num_threads(DEFAULT_NUM_THREADS[self.engine])
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
        )
        server = Server(self._flat.read(), algo.aggregator, algo.server_callbacks, self.num_clients)
        if server_set is not None:
            server.data = (server_set.tensors[0].to(self.device), server_set.tensors[1].to(self.device))
        server._workspace_factory = lambda: ModelWorkspace(model, self.device)
        sim = Simulator(
            server=server,
            scheduler=algo.scheduler,
            executor=executor,
            device_model=self.device_model,
            num_samples=[shards.num_samples(c) for c in range(self.num_clients)],
            local_epochs=self.local_epochs,
            batch_size=dm.batch_size,
            seed=self.seed,
            model_bytes=self._flat.nbytes,
            client_callbacks=algo.client_callbacks,
            profiles=profiles,
        )
        sim.on_new_version = self._on_new_version
        sim.evaluator = self._current_metrics
        sim.metrics_logger = self._log_scheduler_metrics
        self.simulator = sim
        self._fingerprint_value = self._fingerprint(model, dm)
        loader = _eval_loader(dm)
        self._eval_batches = list(loader) if loader is not None else None
        return sim

    def _fingerprint(self, model: L.LightningModule, dm: L.LightningDataModule) -> dict[str, Any]:
        """What must not change between a checkpoint and its resumption (budgets, logging may)."""
        assert self._flat is not None
        return {
            "algorithm": describe(self.algorithm),
            "num_clients": self.num_clients,
            "local_epochs": self.local_epochs,
            "seed": self.seed,
            "device_model": describe(self.device_model),
            "model": {"class": type(model).__qualname__, "numel": self._flat.numel},
            "data": describe(dm),
        }

    def _load_checkpoint(self, ckpt_path: str) -> None:
        state = torch.load(ckpt_path, map_location=self.device, weights_only=True)
        if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{ckpt_path} is not a lit_asyncfl checkpoint (expected format {CHECKPOINT_FORMAT})")
        mine, theirs = self._fingerprint_value, state["fingerprint"]
        diff = {k: (theirs.get(k), v) for k, v in mine.items() if theirs.get(k) != v}
        if diff:
            details = "; ".join(f"{k}: checkpoint {a!r} vs trainer {b!r}" for k, (a, b) in diff.items())
            raise ValueError(f"checkpoint {ckpt_path} was written by a different configuration: {details}")
        assert self.simulator is not None
        self.simulator.load_state_dict(state["simulation"])
        # Drop the evaluation that ended the earlier run off schedule: the resumed history is then the one an
        # uninterrupted run would have.
        every = int(state["eval_every"])
        self.history = [row for row in state["history"] if row["version"] % every == 0]
        self._wall_offset = float(state["wall_seconds"])

    def _wall_seconds(self) -> float:
        return self._wall_offset + (time.perf_counter() - self._wall_start)

    def _on_new_version(self) -> None:
        assert self.simulator is not None
        if self.simulator.server.version % self.eval_every == 0:
            self._evaluate_and_log()

    def _current_metrics(self) -> dict[str, Any]:
        """The evaluation row of the current global version (evaluated and logged now if not yet)."""
        sim = self.simulator
        assert sim is not None
        if not self.history or self.history[-1]["version"] != sim.server.version:
            self._evaluate_and_log()
        if not self.history or self.history[-1]["version"] != sim.server.version:
            raise RuntimeError("the algorithm needs evaluations, but the data module has no validation or test data")
        return self.history[-1]

    def _log_scheduler_metrics(self, metrics: dict[str, Any]) -> None:
        """Log a scheduler's metrics at the current version; they join that version's evaluation row, if any."""
        sim = self.simulator
        assert sim is not None
        if self.history and self.history[-1]["version"] == sim.server.version:
            self.history[-1].update(metrics)
        row = {"virtual_time": sim.now, **metrics}
        for lg in self.loggers:
            if is_wandb(lg):
                self._wandb_run(lg).log(row, step=sim.server.version)
            else:
                numeric = {k: float(v) for k, v in row.items() if isinstance(v, (int, float))}
                lg.log_metrics(numeric, step=sim.server.version)

    def _evaluate_and_log(self) -> None:
        sim, flat, model = self.simulator, self._flat, self.global_model
        assert sim is not None and flat is not None and model is not None
        if not self._eval_batches:
            return
        flat.load(sim.server.weights)
        metrics = evaluate(model, self._eval_batches, "val")
        stats = sim.server.stats
        row: dict[str, Any] = {
            "version": sim.server.version,
            "virtual_time": sim.now,
            "accuracy": find_metric(metrics, "accuracy"),
            "loss": find_metric(metrics, "loss"),
            "updates_received": stats.received,
            "updates_aggregated": stats.aggregated,
            "wall_time": round(self._wall_seconds(), 3),
            **metrics,
        }
        self.history.append(row)
        numeric = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and k != "version"}
        for lg in self.loggers:
            if is_wandb(lg):
                self._wandb_run(lg).log(row, step=sim.server.version)
            else:
                lg.log_metrics(numeric, step=sim.server.version)

    def _wandb_run(self, logger: Logger) -> WandbRun:
        if id(logger) not in self._wandb_runs:
            self._wandb_runs[id(logger)] = WandbRun(logger)
        return self._wandb_runs[id(logger)]

    def _log_hyperparams(self) -> None:
        params = self.run_config or self._fingerprint_value
        for lg in self.loggers:
            lg.log_hyperparams(params)

    def _run(self, sim: Simulator) -> None:
        self._stop_requested = False
        bar = self._progress_bar(sim)
        last_refresh = 0.0

        def after_event() -> bool:
            nonlocal last_refresh
            if self.checkpoint_every is not None and sim.events_processed % self.checkpoint_every == 0:
                self.save_checkpoint(self._checkpoint_path())
            if bar is not None:
                now = time.perf_counter()
                if now - last_refresh > 0.2:
                    last_refresh = now
                    self._refresh_bar(bar, sim)
            return self._stop_requested

        previous = self._install_sigint()
        try:
            self._stop_reason = sim.run(
                self.max_virtual_time, self.max_versions, after_event, max_stalled_arrivals=self._stall_limit()
            )
        finally:
            self._restore_sigint(previous)
            if bar is not None:
                self._refresh_bar(bar, sim)
                bar.close()

    def _stall_limit(self) -> int:
        """Consecutive arrivals without a new version after which the run cannot be making progress."""
        return max(100, 10 * self.num_clients)

    def _checkpoint_path(self) -> str:
        return os.path.join(self.log_dir, "checkpoints", "last.ckpt")

    def _install_sigint(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested:  # second Ctrl-C: stop now
                raise KeyboardInterrupt
            self._stop_requested = True
            print("\nStopping at the next event boundary (Ctrl-C again to abort)...", flush=True)

        return signal.signal(signal.SIGINT, handler)

    @staticmethod
    def _restore_sigint(previous: Any) -> None:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)

    def _progress_bar(self, sim: Simulator) -> Any:
        if not self.enable_progress_bar:
            return None
        from tqdm.auto import tqdm

        by_time = self.max_virtual_time is not None
        total = self.max_virtual_time if by_time else self.max_versions
        unit = "virtual s" if by_time else "versions"
        return tqdm(
            total=total,
            desc=self.algorithm.name,
            unit=unit,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:,.0f}/{total:,.0f} "
            + unit
            + " [{elapsed}<{remaining}{postfix}]",
        )

    def _refresh_bar(self, bar: Any, sim: Simulator) -> None:
        done = sim.now if self.max_virtual_time is not None else sim.server.version
        bar.n = min(done, bar.total) if bar.total else done
        acc = self.history[-1]["accuracy"] if self.history else None
        bar.set_postfix(version=sim.server.version, acc=f"{acc:.3f}" if acc is not None else "-", refresh=False)
        bar.refresh()

    def _finish(self, sim: Simulator) -> None:
        if self._stop_reason == "stalled":
            warnings.warn(
                f"stopped: the last {sim.stalled_arrivals} updates produced no new global version "
                f"(rejection reasons so far: {sim.server.stats.reasons or 'none'})",
                RuntimeWarning,
                stacklevel=3,
            )
        if not self.history or self.history[-1]["version"] != sim.server.version:
            self._evaluate_and_log()
        assert self._flat is not None
        self._flat.load(sim.server.weights)
        self.summary = self._summarize(sim)
        out = Path(self.log_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_history_csv(self.history, out / "history.csv")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2))
        if self.run_config is not None:
            import yaml

            (out / "config.yaml").write_text(yaml.safe_dump(self.run_config, sort_keys=False))
        if any(r.get("accuracy") is not None for r in self.history):
            plot_history(self.history, out / "accuracy.png", self.algorithm.name, self.target_accuracy)
        counts = getattr(self.datamodule, "partition_counts", None)
        if counts is not None:
            slowness = self._profiles.time_per_sample if self._profiles is not None else None
            write_partition_csv(counts, out / "partition.csv", slowness)
            title = f"{type(self.datamodule).__name__}: {self.datamodule.partitioner!r}"
            plot_partition(counts, out / "partition.png", title)
        self.save_checkpoint(self._checkpoint_path())
        for lg in self.loggers:
            if is_wandb(lg):  # the run summary, not one more point of every chart
                self._wandb_run(lg).finish(self.summary, [out / "accuracy.png", out / "partition.png"])
            else:
                lg.log_metrics(
                    {
                        f"summary/{k}": float(v)
                        for k, v in self.summary.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)
                    },
                    step=sim.server.version,
                )
            lg.save()
            lg.finalize("success")
        if self.print_summary:
            print(format_summary(self.summary))
            print(f"outputs in {out}/ (history.csv, summary.json, accuracy.png, partition.csv, checkpoints/last.ckpt)")

    def _summarize(self, sim: Simulator) -> dict[str, Any]:
        stats = sim.server.stats
        accs = [r["accuracy"] for r in self.history if r.get("accuracy") is not None]
        reached = first_reaching(self.history, self.target_accuracy)
        return {
            "algorithm": self.algorithm.name,
            "num_clients": self.num_clients,
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "target_accuracy": self.target_accuracy,
            "time_to_target": None if reached is None else float(reached["virtual_time"]),
            "versions_to_target": None if reached is None else reached["version"],
            "versions": sim.server.version,
            "virtual_time": sim.now,
            "updates_received": stats.received,
            "updates_aggregated": stats.aggregated,
            "updates_discarded": stats.discarded,
            "updates_rejected": stats.rejected,
            "reject_reasons": dict(stats.reasons),
            "mean_staleness": stats.staleness_mean,
            "max_staleness": stats.staleness_max,
            "bytes_up": stats.bytes_up,
            "bytes_down": stats.bytes_down,
            "events": sim.events_processed,
            "stop_reason": "interrupted" if self._stop_reason == "stopped" else self._stop_reason,
            "wall_seconds": round(self._wall_seconds(), 2),
            **sim.scheduler.summary(),
        }

    def _evaluate_stage(
        self, model: L.LightningModule | None, datamodule: L.LightningDataModule | None, stage: str
    ) -> dict[str, float]:
        model = model if model is not None else self.global_model
        dm = datamodule if datamodule is not None else self.datamodule
        if model is None or dm is None:
            raise RuntimeError(f"{stage}: pass a model and a datamodule, or call fit() first")
        dm.setup("validate" if stage == "val" else "test")
        loader = dm.val_dataloader() if stage == "val" else dm.test_dataloader()
        return evaluate(model.to(self.device), loader, stage)
