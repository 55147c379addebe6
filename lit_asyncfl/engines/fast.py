"""The ``fast`` engine: a minimal loop over the user's ``LightningModule``."""

from __future__ import annotations

from collections.abc import Generator

import lightning as L
import torch
from torch import Tensor

from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.engines.base import LocalEngine, parse_optimizers

__all__ = ["FastEngine", "LocalTrainer", "first_part", "next_part", "parse_optimizers"]
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.core.workspace import _no_log
from lit_asyncfl.data.shards import steps_per_epoch
from lit_asyncfl.engines.base import OneDNN
from lit_asyncfl.loops.stand_in import JobLog, JobTrainer


class FastEngine(LocalEngine):
    """Runs a client's local epochs on one reused copy of the user's module ("fast" engine).

    Per job: load the start weights with one copy, seed the job's randomness, build a fresh optimizer with the
    module's ``configure_optimizers``, and for each batch call the module's ``training_step``, ``backward``, the
    client callbacks' ``on_after_backward`` and ``optimizer.step``. Schedulers step per epoch or per step as
    configured. What ``training_step`` logs with ``self.log`` becomes the update's ``metrics`` (the job's means);
    ``self.trainer`` is a
    :class:`~lit_asyncfl.loops.JobTrainer` (epoch, step, the job's step counts; anything else is
    refused naming ``engine="lightning"``, for modules that need a full ``lightning.Trainer``). Takes the arguments
    of :class:`~lit_asyncfl.engines.LocalEngine`.
    """

    def check_module(self, module: L.LightningModule) -> None:
        """Refuse manual optimization (only ``engine="lightning"`` runs it)."""
        if not module.automatic_optimization:
            raise ValueError(
                f"{type(module).__name__} uses manual optimization, which the fast local trainer does not run; "
                "use automatic optimization (training_step returns the loss)"
            )

    def train(self, job: ClientJob, start_weights: Tensor, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """Run ``job.local_epochs`` epochs (or ``job.local_steps`` steps) from ``start_weights``; return the update.

        ``fresh`` is the server's answer to the job's request (weights and version of the global model current at
        the request), handed to the callbacks' ``on_fresh_model`` after ``job.request_step`` steps.
        """
        parts = self.train_parts(job, start_weights, fresh is not None)
        with OneDNN(self.onednn):
            update = first_part(parts)
            return next_part(parts, fresh) if update is None else update

    def train_parts(
        self, job: ClientJob, start_weights: Tensor, request: bool = True
    ) -> Generator[None, tuple[Tensor, int] | None, ClientUpdate]:
        """The job as a generator: with ``request``, it stops after ``job.request_step`` steps (the job's request
        to the server) and is resumed with the server's answer (``send``: the fresh weights and version, or
        ``None`` when the server had nothing newer), which the callbacks' ``on_fresh_model`` get; it returns the
        update. A Ray worker trains the part before the request ahead of the request's event (see
        :func:`first_part`, :func:`next_part`); run each part inside ``OneDNN(self.onednn)``."""
        module = self.module
        generator = self.start_job(job, start_weights)
        per_epoch = steps_per_epoch(self.shards.num_samples(job.client), self.batch_size, self.shards.drop_last)
        stand_in = JobTrainer("fast", job.local_epochs, per_epoch, max_steps=job.local_steps)
        self.job_log = job_log = JobLog()
        # Plain instance attributes (never parameters, buffers or submodules): set in the instance's __dict__, as
        # nn.Module.__setattr__ would after its checks (1 us each, six a job).
        own = module.__dict__
        own["_trainer"], own["log"], own["log_dict"] = stand_in, job_log.log, job_log.log_dict
        try:
            return (yield from self._run(job, start_weights, request, generator, stand_in))
        finally:
            own["_trainer"], own["log"], own["log_dict"] = None, _no_log, _no_log

    def _run(
        self,
        job: ClientJob,
        start_weights: Tensor,
        request: bool,
        generator: torch.Generator,
        stand_in: JobTrainer,
    ) -> Generator[None, tuple[Tensor, int] | None, ClientUpdate]:
        module = self.module
        optimizer, schedulers = parse_optimizers(module.configure_optimizers())
        self.optimizer = optimizer
        self.job_info = {"lr": float(optimizer.param_groups[0]["lr"])}
        for cb in self.callbacks:
            cb.on_train_start(self, job, start_weights)
        loss_terms = [cb for cb in self.callbacks if type(cb).loss_term is not ClientCallback.loss_term]
        loss_sum = torch.zeros((), device=self.device)
        steps = 0
        interact_at = job.request_step if request else None
        last_batch = None
        limit = job.local_steps  # the job's own number of steps (None: whole epochs)
        for epoch in range(job.local_epochs):
            stand_in.current_epoch = epoch
            cut = False  # the epoch ended at the job's step limit, before its last batch
            for batch_idx, batch in enumerate(self.shards.batches(job.client, self.batch_size, generator)):
                if steps == limit:
                    cut = True
                    break
                if steps == interact_at:
                    fresh = yield
                    if fresh is not None:
                        self.fresh_model(job, fresh, last_batch)
                    interact_at = None
                self.job_log.batch = batch
                out = module.training_step(batch, batch_idx)
                loss = out["loss"] if isinstance(out, dict) else out
                if loss is None:  # Lightning semantics: skip this batch
                    continue
                for cb in loss_terms:
                    term = cb.loss_term(self, job, batch)
                    loss = loss if term is None else loss + term
                last_batch = batch
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                for cb in self.callbacks:
                    cb.on_after_backward(self, job)
                optimizer.step()
                loss_sum += loss.detach()
                steps += 1
                stand_in.global_step = steps
                for sched, interval in schedulers:
                    if interval == "step":
                        sched.step()
            for sched, interval in schedulers:
                if interval == "epoch" and not cut:  # as Lightning: an epoch cut by max_steps steps no scheduler
                    sched.step()
            self.job_log.epoch_end()
        if interact_at is not None:  # the request comes after the last step
            fresh = yield
            if fresh is not None:
                self.fresh_model(job, fresh, last_batch)
        return self.finish_job(job, start_weights, steps, loss_sum)


def first_part(parts: Generator[None, tuple[Tensor, int] | None, ClientUpdate]) -> ClientUpdate | None:
    """Run a job of :meth:`FastEngine.train_parts` up to its request (``None``: it waits for :func:`next_part`),
    or whole when it makes none (its update)."""
    try:
        next(parts)
    except StopIteration as done:
        return done.value
    return None


def next_part(
    parts: Generator[None, tuple[Tensor, int] | None, ClientUpdate], fresh: tuple[Tensor, int] | None
) -> ClientUpdate:
    """Resume a job stopped at its request with the server's answer and run it to its end: its update."""
    try:
        parts.send(fresh)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a job asked the server twice")  # pragma: no cover


#: The former name of :class:`FastEngine` (an alias, kept so that existing imports work).
LocalTrainer = FastEngine
