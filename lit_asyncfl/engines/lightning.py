"""The ``lightning`` engine: a real ``lightning.Trainer`` per client update."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset

from lit_asyncfl import namespaces
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.data.shards import ClientShards, DatasetShards, steps_per_epoch
from lit_asyncfl.engines.base import LocalEngine, OneDNN
from lit_asyncfl.loops.stand_in import JobLog

#: Flags of every per-update ``lightning.Trainer``: nothing but the training loop.
TRAINER_FLAGS: dict[str, Any] = {
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
    "limit_val_batches": 0,
    "use_distributed_sampler": False,
}


class _JobBatches(IterableDataset):
    """One epoch of a job's batches per iteration: exactly the batches the ``fast`` engine draws."""

    def __init__(self, shards: ClientShards | DatasetShards, client: int, batch_size: int, generator: torch.Generator):
        self.shards, self.client, self.batch_size, self.generator = shards, client, batch_size, generator

    def __iter__(self) -> Iterator[Any]:
        return iter(self.shards.batches(self.client, self.batch_size, self.generator))

    def __len__(self) -> int:
        """Steps per epoch, so that ``num_training_batches`` and ``estimated_stepping_batches`` are the job's."""
        return steps_per_epoch(self.shards.num_samples(self.client), self.batch_size, self.shards.drop_last)


def _as_drawn(batch: Any) -> Any:
    """The loader's ``collate_fn``: each batch exactly as the client's shard drew it (structure included)."""
    return batch


class _StayOnDevice:
    """The single-device strategy without the teardown's move of the module to the CPU (a mixin over the
    ``SingleDeviceStrategy`` of the module's Lightning package, see :func:`_job_classes`).

    The engine reuses one module whose weights are views of one flat vector; moving it would break that binding.
    """

    def teardown(self) -> None:
        self.precision_plugin.teardown()  # type: ignore[attr-defined]
        assert self.accelerator is not None  # type: ignore[attr-defined]
        self.accelerator.teardown()  # type: ignore[attr-defined]
        self.checkpoint_io.teardown()  # type: ignore[attr-defined]


class _ClientHooks:
    """Runs the client callbacks at the matching points of the Trainer's loop and collects the loss statistics (a
    mixin over the ``Callback`` of the module's Lightning package, see :func:`_job_classes`)."""

    def __init__(self, engine: LightningEngine, job: ClientJob, start: Tensor, fresh: Any) -> None:
        self.engine, self.job, self.start, self.fresh = engine, job, start, fresh
        self.interact_at = job.request_step if fresh is not None else None
        self.loss_sum: Tensor | None = None
        self.steps = 0
        self.last_batch: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        engine = self.engine
        engine.optimizer = trainer.optimizers[0]
        engine.job_info = {"lr": float(engine.optimizer.param_groups[0]["lr"])}
        for cb in engine.callbacks:
            cb.on_train_start(engine, self.job, self.start)  # type: ignore[arg-type]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if self.engine.job_log is not None:
            self.engine.job_log.batch = batch
        if self.steps == self.interact_at:
            self.interact_at = None
            self.engine.fresh_model(self.job, self.fresh, self.last_batch)

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for cb in self.engine.callbacks:
            cb.on_after_backward(self.engine, self.job)  # type: ignore[arg-type]

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None and pl_module.automatic_optimization:  # the module skipped this batch
            return
        if isinstance(loss, Tensor):  # (under manual optimization training_step may return nothing)
            loss = loss.detach()
            self.loss_sum = loss.clone() if self.loss_sum is None else self.loss_sum + loss
        self.steps += 1  # a batch the module trained on (manual optimization: however many optimizers it stepped)
        self.last_batch = batch


_JOB_CLASSES: dict[str, tuple[type, type]] = {}


def _job_classes(package: Any) -> tuple[type, type]:
    """``(_ClientHooks, _StayOnDevice)`` as a ``Callback`` and a ``SingleDeviceStrategy`` of ``package``
    (``lightning.pytorch`` or ``pytorch_lightning``): a module is trained by the Trainer of its own package, which
    accepts only that package's callbacks and strategies."""
    if package.__name__ not in _JOB_CLASSES:
        _JOB_CLASSES[package.__name__] = (
            type("_ClientHooks", (_ClientHooks, package.Callback), {}),
            type("_StayOnDevice", (_StayOnDevice, package.strategies.SingleDeviceStrategy), {}),
        )
    return _JOB_CLASSES[package.__name__]


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence the Trainer's per-run info lines ("GPU available: ...", "`max_epochs` reached") and the
    data-loader hints that do not apply to resident client shards."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "pytorch_lightning")]  # both namespaces
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=r".*IterableDataset.*")
            warnings.filterwarnings("ignore", message=r".*GPU available but not used.*")
            warnings.filterwarnings("ignore", message=r".*`validation_step` but have no `val_dataloader`.*")
            warnings.filterwarnings("ignore", message=r".*LeafSpec.*")  # Lightning 2.6's pytree use on torch 2.14
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


class LightningEngine(LocalEngine):
    """Runs each client update with a fresh ``lightning.Trainer`` (the ``lightning`` engine).

    For modules that need the full Trainer: ``self.log``,
    ``self.trainer``, hooks such as ``on_train_epoch_end``, manual optimization (tested against a raw loop). The
    job is the same as in the ``fast`` engine (:class:`~lit_asyncfl.engines.FastEngine`): one reused
    module whose weights are loaded with one flat copy, the job's seeds set the same way, and the Trainer is fed
    exactly the ``fast`` engine's batches (a ``DataLoader`` over the client's shard with the job's generator), so
    for the same job both engines give bit-identical weights (tested). Client callbacks (proximal term,
    learning-rate decay, FedASMU's fresh-model merge) run at the matching points of the Trainer's loop.

    Each Trainer has no logger, no checkpointing, no progress bar, no model summary and no validation; it trains
    ``job.local_epochs`` epochs. Most of a Trainer's construction time is Lightning's scan of the installed
    packages' entry points for external callbacks; the engine scans once and reuses the list (the factories are
    still called for every Trainer), since the installed packages do not change during a run. Takes the arguments
    of :class:`~lit_asyncfl.engines.LocalEngine`.
    """

    silence_log = False  # the job's Trainer handles self.log

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._entry_points: dict[Any, tuple[Any, ...]] = {}
        self.optimizer: torch.optim.Optimizer | None = None
        self.package = namespaces.package_of(self.module)  # lightning.pytorch or pytorch_lightning

    def _trainer(self, epochs: int, hooks: Any, max_steps: int | None = None) -> L.Trainer:
        accelerator = "gpu" if self.device.type == "cuda" else "cpu"
        device = self.device
        if device.type == "cuda" and device.index is None:  # (Lightning's CUDA accelerator needs the index)
            device = torch.device("cuda", torch.cuda.current_device())
        strategy = _job_classes(self.package)[1](device=device)
        steps = -1 if max_steps is None else max_steps  # a job's own number of steps (FedCompass)
        with self._cached_entry_points():
            return self.package.Trainer(
                accelerator=accelerator, strategy=strategy, max_epochs=epochs, max_steps=steps, callbacks=[hooks],
                **TRAINER_FLAGS,
            )  # fmt: skip

    @contextmanager
    def _cached_entry_points(self) -> Iterator[None]:
        """Serve Lightning's entry-point lookups (external callback factories) from this engine's cache."""
        fabric = "lightning.fabric" if self.package.__name__ == "lightning.pytorch" else "lightning_fabric"
        registry = importlib.import_module(f"{fabric}.utilities.registry")
        original = getattr(registry, "entry_points", None)
        if original is None:  # another Lightning version: no cache, nothing to patch
            yield
            return

        def cached(*args: Any, **kwargs: Any) -> Any:
            key = (args, tuple(sorted(kwargs.items())))
            if key not in self._entry_points:
                self._entry_points[key] = tuple(importlib.metadata.entry_points(*args, **kwargs))
            return self._entry_points[key]

        registry.entry_points = cached
        try:
            yield
        finally:
            registry.entry_points = original

    def train(self, job: ClientJob, start_weights: Tensor, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Run ``job.local_epochs`` epochs from ``start_weights`` with a new Trainer and return the update.

        ``fresh`` is the server's answer to the job's request, handed to the callbacks' ``on_fresh_model`` after
        ``job.request_step`` steps (as in the ``fast`` engine).
        """
        generator = self.start_job(job, start_weights)
        # The loader's own generator: creating its iterator must not draw from the default generator (the
        # module's dropout draws from that one, as in the fast engine).
        loader = DataLoader(
            _JobBatches(self.shards, job.client, self.batch_size, generator),
            batch_size=None,
            collate_fn=_as_drawn,  # not default_convert, which would turn a tuple batch into a list
            generator=torch.Generator(),
        )
        hooks = _job_classes(self.package)[0](self, job, start_weights, fresh)
        self.job_log = job_log = JobLog()
        module = self.module

        def log(name: str, value: Any, *args: Any, **kwargs: Any) -> None:  # the job's means, and Lightning's log
            if module._trainer is not None and module.trainer.training:
                job_log.log(name, value, *args, **kwargs)
            self.package.LightningModule.log(module, name, value, *args, **kwargs)

        def log_dict(dictionary: Any, *args: Any, **kwargs: Any) -> None:
            for name, value in dict(dictionary).items():
                log(name, value, *args, **kwargs)

        module.log, module.log_dict = log, log_dict  # type: ignore[method-assign]
        loss_terms = [cb for cb in self.callbacks if type(cb).loss_term is not ClientCallback.loss_term]
        if loss_terms:  # the callbacks' loss terms join the loss the Trainer backpropagates (as in the fast engine)
            training_step = module.training_step

            def with_terms(batch: Any, *args: Any, **kwargs: Any) -> Any:
                out = training_step(batch, *args, **kwargs)
                loss = out["loss"] if isinstance(out, dict) else out
                if loss is None:
                    return out
                for cb in loss_terms:
                    term = cb.loss_term(self, job, batch)  # type: ignore[arg-type]
                    loss = loss if term is None else loss + term
                return {**out, "loss": loss} if isinstance(out, dict) else loss

            module.training_step = with_terms  # type: ignore[method-assign]
        try:
            with _quiet_lightning(), OneDNN(self.onednn):
                trainer = self._trainer(job.local_epochs, hooks, job.local_steps)
                trainer.fit(module, train_dataloaders=loader)
        finally:
            del module.log, module.log_dict
            module.__dict__.pop("training_step", None)
        if self.flat.params and self.flat.params[0].data_ptr() != self.flat.flat.data_ptr():
            raise RuntimeError(
                "the Trainer replaced the module's parameters (e.g. a '-true' precision converted them); the "
                "lightning engine trains the parameters in place and does not support that"
            )
        if hooks.interact_at is not None:  # the request comes after the last step
            self.fresh_model(job, fresh, hooks.last_batch)
        return self.finish_job(job, start_weights, hooks.steps, hooks.loss_sum)


#: The former name of :class:`LightningEngine` (an alias, kept so that existing imports work).
LightningLocalTrainer = LightningEngine
