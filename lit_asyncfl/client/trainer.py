"""The fast local trainer: a minimal loop over the user's ``LightningModule``."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.optim import Optimizer
from torchmetrics import Metric

from lit_asyncfl.client.callbacks import ClientCallback
from lit_asyncfl.client.kernels import OneDNN
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data.shards import ClientShards, DatasetShards


def parse_optimizers(config: Any) -> tuple[Optimizer, list[tuple[Any, str]]]:
    """Read what ``configure_optimizers`` returned: one optimizer and its schedulers with their interval.

    Accepts an optimizer, a one-element list/tuple, ``([optimizer], [schedulers])`` and the dict form
    ``{"optimizer": ..., "lr_scheduler": ...}``.
    """
    schedulers: list[Any] = []
    if isinstance(config, dict):
        optimizers, schedulers = [config["optimizer"]], config.get("lr_scheduler", [])
        schedulers = schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]
    elif isinstance(config, Optimizer):
        optimizers = [config]
    elif isinstance(config, (list, tuple)) and len(config) == 2 and isinstance(config[0], (list, tuple)):
        optimizers, schedulers = list(config[0]), list(config[1])
    elif isinstance(config, (list, tuple)):
        optimizers = list(config)
    else:
        raise TypeError(f"configure_optimizers returned {type(config).__name__}; expected an optimizer")
    if len(optimizers) != 1 or not isinstance(optimizers[0], Optimizer):
        raise ValueError(f"the fast local trainer supports exactly one optimizer, got {len(optimizers)}")
    parsed = []
    for sched in schedulers:
        if isinstance(sched, dict):
            parsed.append((sched["scheduler"], sched.get("interval", "epoch")))
        else:
            parsed.append((sched, "epoch"))
    return optimizers[0], parsed


class LocalEngine:
    """State every local-training engine holds: a private copy of the user's module bound to one flat weight vector,
    the clients' data, the batch size, the client callbacks, the device and the kernel choice.

    Args:
        module: The user's module; a private deep copy is trained.
        shards: The clients' data.
        batch_size: Local mini-batch size.
        callbacks: Client callbacks.
        device: Training device.
        onednn: ``torch.backends.mkldnn.enabled`` while a job trains (restored afterwards); ``None``: leave it.
        silence_log: Make the copy's ``self.log`` a no-op (engines without a ``lightning.Trainer``).
    """

    def __init__(
        self,
        module: L.LightningModule,
        shards: ClientShards | DatasetShards,
        batch_size: int,
        callbacks: Sequence[ClientCallback] = (),
        device: torch.device | str = "cpu",
        onednn: bool | None = None,
        silence_log: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        if silence_log:
            workspace = ModelWorkspace(module, self.device)
            self.module, self.flat = workspace.module, workspace.flat
        else:
            self.module = copy.deepcopy(module).to(self.device)
            self.flat = FlatParameters(self.module)
        self.shards = shards
        self.batch_size = batch_size
        self.callbacks = list(callbacks)
        self.onednn = onednn
        #: The module's torchmetrics objects, reset at the start of every job (as each Lightning fit starts anew).
        self.metrics = [m for m in self.module.modules() if isinstance(m, Metric)]

    def reset_metrics(self) -> None:
        """Reset the module's metric objects: a job never sees (or keeps in memory) another job's updates."""
        for metric in self.metrics:
            metric.reset()


class LocalTrainer(LocalEngine):
    """Runs a client's local epochs on one reused copy of the user's module ("fast" engine).

    Per job: load the start weights with one copy, seed the job's randomness, build a fresh optimizer with the
    module's ``configure_optimizers``, and for each batch call the module's ``training_step``, ``backward``, the
    client callbacks' ``on_after_backward`` and ``optimizer.step``. Schedulers step per epoch or per step as
    configured. ``self.log`` calls in ``training_step`` are ignored; ``self.trainer`` is not available (modules that
    need a full ``lightning.Trainer`` are out of scope of this engine).

    Args:
        module: The user's module; a private deep copy is trained.
        shards: The clients' data.
        batch_size: Local mini-batch size.
        callbacks: Client callbacks.
        device: Training device.
        onednn: ``torch.backends.mkldnn.enabled`` while a job trains (restored afterwards); ``None``: leave it.
    """

    def __init__(
        self,
        module: L.LightningModule,
        shards: ClientShards | DatasetShards,
        batch_size: int,
        callbacks: Sequence[ClientCallback] = (),
        device: torch.device | str = "cpu",
        onednn: bool | None = None,
    ) -> None:
        if not module.automatic_optimization:
            raise ValueError(
                f"{type(module).__name__} uses manual optimization, which the fast local trainer does not run; "
                "use automatic optimization (training_step returns the loss)"
            )
        super().__init__(module, shards, batch_size, callbacks, device, onednn)

    def train(self, job: ClientJob, start_weights: Tensor, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Run ``job.local_epochs`` epochs from ``start_weights`` and return the update.

        ``fresh`` is the server's answer to the job's request (weights and version of the global model current at
        the request), handed to the callbacks' ``on_fresh_model`` after ``job.request_step`` steps.
        """
        with OneDNN(self.onednn):
            return self._train(job, start_weights, fresh)

    def _train(self, job: ClientJob, start_weights: Tensor, fresh: tuple[Tensor, int] | None) -> ClientUpdate:
        module = self.module
        self.flat.load(start_weights)
        self.reset_metrics()
        module.train()
        # Seed every generator user code may draw from, from the job's own seed, so a job's result does not
        # depend on what ran before it. (torch.manual_seed would also walk every lazy accelerator backend:
        # milliseconds per call, more than a small local training.)
        torch.default_generator.manual_seed(job.seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(job.seed)
        random.seed(job.seed)
        np.random.seed(job.seed % 2**32)
        generator = torch.Generator().manual_seed(job.seed)
        optimizer, schedulers = parse_optimizers(module.configure_optimizers())
        self.optimizer = optimizer
        #: Extras of the job in progress, copied into ``update.info`` (callbacks add to it).
        self.job_info: dict[str, Any] = {"lr": float(optimizer.param_groups[0]["lr"])}
        for cb in self.callbacks:
            cb.on_train_start(self, job, start_weights)
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        interact_at = job.request_step if fresh is not None else None
        last_batch = None
        for _ in range(job.local_epochs):
            for batch_idx, batch in enumerate(self.shards.batches(job.client, self.batch_size, generator)):
                if steps == interact_at:
                    self._fresh_model(job, fresh, last_batch)
                    interact_at = None
                out = module.training_step(batch, batch_idx)
                loss = out["loss"] if isinstance(out, dict) else out
                if loss is None:  # Lightning semantics: skip this batch
                    continue
                last_batch = batch
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for cb in self.callbacks:
                    cb.on_after_backward(self, job)
                optimizer.step()
                loss_sum += loss.detach()
                steps += 1
                for sched, interval in schedulers:
                    if interval == "step":
                        sched.step()
            for sched, interval in schedulers:
                if interval == "epoch":
                    sched.step()
        if interact_at is not None:  # the request comes after the last step
            self._fresh_model(job, fresh, last_batch)
        update = ClientUpdate(
            job=job,
            weights=self.flat.read(),
            base_weights=start_weights,
            num_samples=self.shards.num_samples(job.client),
            num_steps=steps,
            train_loss=float(loss_sum) / steps if steps else float("nan"),
            info=self.job_info,
        )
        for cb in self.callbacks:
            cb.on_train_end(self, job, update)
        return update

    def _fresh_model(self, job: ClientJob, fresh: tuple[Tensor, int] | None, batch: Any) -> None:
        assert fresh is not None
        for cb in self.callbacks:
            cb.on_fresh_model(self, job, fresh[0], fresh[1], batch)


class SequentialExecutor:
    """Computes each job when its update is needed, one after the other, with a :class:`LocalTrainer`.

    Executors decouple *when* an update is computed from *when* it is consumed: the simulator submits a job at
    dispatch and asks for its update at the arrival event, in virtual-time order.

    Args:
        trainer: The local trainer.
    """

    def __init__(self, trainer: LocalTrainer) -> None:
        self.trainer = trainer
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}

    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job."""
        self._pending[job.job_id] = (job, start_weights)

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed."""
        self._pending.pop(job_id, None)

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Compute and return the update of a job (``fresh``: the answer to its server request, if any)."""
        job, start = self._pending.pop(job_id)
        return self.trainer.train(job, start, fresh)
