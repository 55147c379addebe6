"""The ``fast`` engine: a minimal loop over the user's ``LightningModule``."""

from __future__ import annotations

from collections.abc import Sequence

import lightning as L
import torch
from torch import Tensor

from lit_asyncfl.client.callbacks import ClientCallback
from lit_asyncfl.client.engine_base import LocalEngine, parse_optimizers

__all__ = ["LocalTrainer", "parse_optimizers"]
from lit_asyncfl.client.kernels import OneDNN
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.data.shards import ClientShards, DatasetShards


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
        generator = self.start_job(job, start_weights)
        optimizer, schedulers = parse_optimizers(module.configure_optimizers())
        self.optimizer = optimizer
        self.job_info = {"lr": float(optimizer.param_groups[0]["lr"])}
        for cb in self.callbacks:
            cb.on_train_start(self, job, start_weights)
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        interact_at = job.request_step if fresh is not None else None
        last_batch = None
        for _ in range(job.local_epochs):
            for batch_idx, batch in enumerate(self.shards.batches(job.client, self.batch_size, generator)):
                if steps == interact_at:
                    self.fresh_model(job, fresh, last_batch)
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
            self.fresh_model(job, fresh, last_batch)
        return self.finish_job(job, start_weights, steps, loss_sum)
