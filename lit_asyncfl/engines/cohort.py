"""The ``cohort`` engine: all pending client jobs trained at once with ``torch.func`` over stacked weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import lightning as L
import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torchmetrics import Metric

from lit_asyncfl.client_callbacks.base import ClientCallback, LearningRateDecay, ProximalTerm
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.data.shards import ClientShards, DatasetShards
from lit_asyncfl.engines.base import LocalEngine, generators_kept, parse_optimizers
from lit_asyncfl.engines.kernels import OneDNN
from lit_asyncfl.loops.job_trainer import JobTrainer
from lit_asyncfl.loops.validation_loop import JobLog

#: Client callbacks the cohort engine applies itself (as gradient or learning-rate terms).
SUPPORTED_CALLBACKS = (ProximalTerm, LearningRateDecay)

#: Default largest cohort: bounds the stacked weights (a few copies per job) when thousands of clients are in
#: flight; on LeNet-5 the time per update hardly improves beyond a few dozen jobs per cohort.
DEFAULT_MAX_COHORT = 128

#: Steps shared by fewer jobs than this run one job at a time with plain autograd: an eager ``vmap`` call of the
#: batched step costs about 2.2 ms plus 0.3 ms per job on LeNet-5 (digits, batch 10, 1 thread), one job's plain step
#: about 1 ms, so batching pays from about 4 jobs. Such steps are the last ones of the largest shards of a cohort.
MIN_BATCHED = 4


class _SGDSettings(NamedTuple):
    """The settings of the SGD optimizer the cohort engine applies to its stacked weights (as ``torch.optim.SGD``,
    one momentum buffer per job)."""

    lr: float
    weight_decay: float
    momentum: float
    dampening: float
    nesterov: bool


class _AdamSettings(NamedTuple):
    """The settings of an Adam or AdamW optimizer the cohort engine applies to its stacked weights (as
    ``torch.optim.Adam``/``AdamW``, one pair of moment estimates per job)."""

    lr: float
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    decoupled: bool


def _refuse_metric(*args: Any, **kwargs: Any) -> None:
    raise ValueError(
        "engine='cohort' cannot update a torchmetrics object in training_step (its state is one per job, the cohort "
        "trains many jobs in one batched call); use engine='fast', or log the tensor itself (self.log('name', value))"
    )


class _CohortLog:
    """``self.log`` inside the batched ``training_step``: collects the logged values (batched over the cohort's jobs)
    and their arguments, handed to each job's :class:`~lit_asyncfl.loops.JobLog` after the step."""

    def __init__(self) -> None:
        self.values: dict[str, Tensor] | None = None
        self.kwargs: dict[str, dict[str, Any]] = {}

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError("pass self.log's options by keyword under engine='cohort'")
        if isinstance(value, Metric):
            _refuse_metric()
        assert self.values is not None, "self.log outside training_step under engine='cohort'"
        self.values[name] = value if isinstance(value, Tensor) else torch.tensor(float(value))
        self.kwargs[name] = kwargs

    def log_dict(self, dictionary: Any, **kwargs: Any) -> None:
        for name, value in dict(dictionary).items():
            self.log(name, value, **kwargs)


class _TrainingStep(nn.Module):
    """The module's ``training_step`` as a ``forward`` returning the loss and what it logged (what
    ``functional_call`` runs)."""

    def __init__(self, module: L.LightningModule) -> None:
        super().__init__()
        self.m = module
        self.log = _CohortLog()

    def forward(self, batch: Any, batch_idx: int) -> tuple[Tensor, dict[str, Tensor]]:
        self.log.values = logged = {}  # a dict of this call's: no traced tensor outlives it (torch.compile)
        out = self.m.training_step(batch, batch_idx)  # self.m.log is self.log.log while a cohort trains
        self.log.values = None
        loss = out["loss"] if isinstance(out, dict) else out
        if loss is None:
            raise ValueError("the cohort engine cannot skip batches: training_step returned None")
        return loss, logged


class CohortJobTrainer(JobTrainer):
    """``self.trainer`` for the jobs one batched cohort step trains: ``current_epoch``, ``global_step`` and
    ``max_epochs`` are shared by the jobs stepped together (the engine groups jobs by them); the counts that differ
    between clients of unequal shards (``num_training_batches``, ``estimated_stepping_batches``) are refused,
    naming ``engine='fast'``."""

    PER_JOB = ("num_training_batches", "estimated_stepping_batches")

    def __init__(self, max_epochs: int = 1) -> None:
        super().__init__("cohort", max_epochs)
        for name in self.PER_JOB:
            del self.__dict__[name]

    def __getattr__(self, name: str) -> Any:
        if name in self.PER_JOB:
            raise AttributeError(
                f"self.trainer.{name} differs between the clients one cohort step trains together, so "
                "engine='cohort' does not offer it; use engine='fast' (or 'lightning')"
            )
        return super().__getattr__(name)


def check_cohort_support(module: nn.Module, callbacks: Sequence[ClientCallback] = ()) -> tuple[float, float]:
    """Raise a ``ValueError`` saying why ``module`` or ``callbacks`` cannot run under the cohort engine.

    Supported: one SGD optimizer (``lr``, ``weight_decay``, ``momentum``, ``dampening``, ``nesterov``) or Adam/AdamW
    (``lr``, ``betas``, ``eps``, ``weight_decay``; not ``amsgrad``), not ``maximize``, no scheduler, trainable
    floating-point parameters and no floating-point buffers (so no BatchNorm running statistics), client callbacks
    :class:`~lit_asyncfl.client_callbacks.ProximalTerm` and :class:`~lit_asyncfl.client_callbacks.LearningRateDecay`.

    Returns:
        The optimizer's settings (a named tuple): ``lr``, ``weight_decay`` and ``momentum``, ``dampening``,
        ``nesterov`` for SGD, ``beta1``, ``beta2``, ``eps``, ``decoupled`` (AdamW's weight decay) for Adam.
    """
    batch_norms = [name for name, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if batch_norms:
        raise ValueError(
            f"{type(module).__name__} has BatchNorm layers ({', '.join(batch_norms[:3])}"
            f"{', ...' if len(batch_norms) > 3 else ''}), whose running statistics the cohort engine does not batch: "
            "use a GroupNorm variant (e.g. ResNet20(norm='group'), VGG11(norm='group')) or engine='fast'"
        )
    buffers = [name for name, b in module.named_buffers() if b.is_floating_point()]
    if buffers:
        raise ValueError(
            f"the cohort engine does not batch floating-point buffers ({', '.join(buffers[:3])}); use engine='fast'"
        )
    frozen = [name for name, p in module.named_parameters() if not p.requires_grad]
    if frozen:
        raise ValueError(
            f"the cohort engine trains every parameter; frozen: {', '.join(frozen[:3])}; use engine='fast'"
        )
    for cb in callbacks:
        if not isinstance(cb, SUPPORTED_CALLBACKS):
            raise ValueError(
                f"the cohort engine cannot run the client callback {type(cb).__name__} (it supports "
                f"{', '.join(c.__name__ for c in SUPPORTED_CALLBACKS)}; callbacks that interact with the server "
                "mid-training or keep state ordered by virtual time need engine='fast')"
            )
    module._trainer = CohortJobTrainer()  # as at fit start: what self.trainer offers a job
    try:
        optimizer, schedulers = parse_optimizers(module.configure_optimizers())  # type: ignore[operator]
    except AttributeError as error:  # what CohortJobTrainer cannot offer: refused at fit start
        if "self.trainer." not in str(error):
            raise
        raise ValueError(f"configure_optimizers: {error}") from error
    finally:
        module._trainer = None
    groups = optimizer.param_groups
    if type(optimizer) not in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW) or len(groups) != 1 or schedulers:
        raise ValueError(
            "the cohort engine runs SGD, Adam or AdamW with one parameter group and no learning-rate scheduler; "
            f"configure_optimizers returned {type(optimizer).__name__} with {len(groups)} group(s) and "
            f"{len(schedulers)} scheduler(s); use engine='fast'"
        )
    group = groups[0]
    if group["maximize"]:
        raise ValueError("the cohort engine runs optimizers that minimize, got maximize=True; use engine='fast'")
    if type(optimizer) is not torch.optim.SGD:
        if group["amsgrad"] or group["differentiable"] or group["capturable"] or isinstance(group["lr"], Tensor):
            raise ValueError(
                f"the cohort engine runs {type(optimizer).__name__} without amsgrad, differentiable, capturable or a "
                "tensor learning rate; use engine='fast'"
            )
        decoupled = type(optimizer) is torch.optim.AdamW or bool(group.get("decoupled_weight_decay", False))
        beta1, beta2 = (float(b) for b in group["betas"])
        return _AdamSettings(
            float(group["lr"]), float(group["weight_decay"]), beta1, beta2, float(group["eps"]), decoupled
        )
    return _SGDSettings(*(float(group[k]) for k in _SGDSettings._fields[:-1]), bool(group["nesterov"]))


class CohortEngine(LocalEngine):
    """Trains many client jobs at once (the ``cohort`` engine).

    The jobs' weights are stacked into one ``[jobs, parameters]`` tensor, in rows ordered by decreasing number of
    local steps; at local step ``t`` every job that still trains (the first rows) is trained in one call of
    ``vmap(grad_and_value(functional_call(training_step)))``, each on exactly the batch the ``fast`` engine would
    give it (same generator, same order), whatever the shard sizes:

    - A smaller batch (a client's last one) is **padded** to the largest batch of the step with copies of its first
      sample whose loss weight is 0: the loss is then ``training_step`` on each sample alone (an inner ``vmap``),
      weighted ``1/n`` for the ``n`` real samples, i.e. the mean the module computes on the unpadded batch, with the
      same gradient. This holds for losses that are means over per-sample terms (the usual mean-reduced losses, what
      ``training_step`` logs likewise), which is checked once at construction (:meth:`padding_refusal`); for any
      other module (a sum-reduced loss, a loss coupling the samples of a batch, random operations)
      :attr:`no_padding_because` says why and the jobs of a step are grouped by batch shape instead, as exact and
      slower. A step where every batch is full needs no padding and runs ``training_step`` on the whole batches.
    - A job that has finished its steps **sits out** the remaining steps of its cohort: its row is past the rows
      that step, so no update, weight decay or momentum touches it.
    - Jobs of more than one local epoch whose shards differ are at different epochs and batch indices at the same
      step (what ``training_step`` may read): they are grouped by them.

    A step shared by fewer than ``min_batched`` jobs (default :data:`MIN_BATCHED`, e.g. the last steps of the
    largest shards) runs one job at a time with plain autograd on the module, where ``vmap``'s fixed cost per call
    would outweigh the batching. The optimizer step (SGD with weight decay and momentum, or Adam/AdamW, one state row
    per job; FedProx's proximal term and FedADT's learning-rate decay) is applied to the stacked weights, on
    ``device``.

    Results equal the ``fast`` engine's up to float32 rounding of the batched kernels (for LeNet-5 on digits below
    1e-7 after 100 steps, tested at 1e-6 for jobs of up to 3 epochs; 1e-12 in float64). Over a full run the
    differences can grow once rounding flips a ReLU or max-pool tie (2e-4 after 100 FedBuff updates). Random
    operations in ``training_step`` (dropout) draw different numbers per client from a generator seeded by the
    cohort's first job, not the job's own stream: such modules are deterministic but do not match ``fast``. Adam
    amplifies the float32 rounding of near-zero gradients (1.3e-3 from ``fast`` at lr 0.01 on LeNet-5, as much as
    ``fast`` with and without oneDNN differ; 1e-12 in float64).

    Args:
        module: The user's module; a private copy is used.
        shards: The clients' data.
        batch_size: Local mini-batch size.
        callbacks: Client callbacks (see :func:`check_cohort_support`).
        device: Training device.
        onednn: ``torch.backends.mkldnn.enabled`` while a cohort trains; ``None``: leave it.
        compile: Compile the batched step with ``torch.compile`` (``dynamic=True``, so cohorts of other sizes and
            batch shapes reuse the compiled code). Costs about a minute of compilation on first use (LeNet-5, 2 CPU
            cores) and makes each step about 25% faster; results equal the eager cohort's within float32 rounding.
            Needs a C++ compiler on the CPU (Inductor).
    """

    def __init__(
        self,
        module: L.LightningModule,
        shards: ClientShards | DatasetShards,
        batch_size: int,
        callbacks: Sequence[ClientCallback] = (),
        device: torch.device | str = "cpu",
        onednn: bool | None = None,
        compile: bool = False,
    ) -> None:
        super().__init__(module, shards, batch_size, callbacks, device, onednn)
        self.optimizer_settings = check_cohort_support(self.module, callbacks)
        self.adam = isinstance(self.optimizer_settings, _AdamSettings)
        self.lr = self.optimizer_settings.lr
        #: The weight decay added to the gradient (AdamW's decays the weights instead, see :meth:`_decay`).
        self.weight_decay = (
            0.0 if self.adam and self.optimizer_settings.decoupled else self.optimizer_settings.weight_decay
        )
        #: Optimizer state of the cohort in training (one row per job): SGD's momentum buffer, Adam's two moments.
        self._state: list[Tensor] = []
        self._step_module = _TrainingStep(self.module)
        self._names = [f"m.{name}" for name, _ in self.module.named_parameters()]
        self._shapes = [p.shape for p in self.flat.params]
        for metric in self.metrics:  # one state per job cannot be batched: refused at the first update
            metric.update = metric.forward = _refuse_metric  # type: ignore[method-assign]
        self._step = vmap(grad_and_value(self._loss, has_aux=True), in_dims=(0, 0, None), randomness="different")
        self._padded_step = vmap(
            grad_and_value(self._padded_loss, has_aux=True), in_dims=(0, 0, 0, None), randomness="different"
        )
        self.compiled = compile
        if compile:
            self._step = torch.compile(self._step, dynamic=True)
            self._padded_step = torch.compile(self._padded_step, dynamic=True)
        #: Why smaller batches are not padded (the jobs of a step are then grouped by batch shape), or ``None``.
        self.no_padding_because = self.padding_refusal()
        #: Groups of fewer jobs step one job at a time without ``vmap`` (see :data:`MIN_BATCHED`); a compiled step
        #: batches every group, as before (its cost per call was not measured against plain steps).
        self.min_batched = 1 if compile else MIN_BATCHED

    def _loss(self, params: dict[str, Tensor], batch: Any, batch_idx: int) -> tuple[Tensor, Any]:
        return functional_call(self._step_module, params, (batch, batch_idx), strict=False)

    def _sample_loss(self, params: dict[str, Tensor], sample: Any, batch_idx: int) -> tuple[Tensor, Any]:
        """``training_step`` on one sample (every leaf given its batch dimension back): that sample's loss."""
        batch = pytree.tree_map(lambda leaf: leaf.unsqueeze(0), sample)
        return functional_call(self._step_module, params, (batch, batch_idx), strict=False)

    def _padded_loss(
        self, params: dict[str, Tensor], batch: Any, weights: Tensor, batch_idx: int
    ) -> tuple[Tensor, Any]:
        """A job's loss on its padded batch: ``sum_i weights[i] * loss_i`` over per-sample losses (``1/n`` for its
        ``n`` real samples, 0 for padding), i.e. the mean over its real samples that ``training_step`` computes on
        the unpadded batch (checked at construction, see :meth:`padding_refusal`); what it logs, weighted alike."""
        losses, logged = vmap(self._sample_loss, in_dims=(None, 0, None), randomness="different")(
            params, batch, batch_idx
        )
        return (losses * weights).sum(), {name: (value * weights).sum() for name, value in logged.items()}

    def padding_refusal(self) -> str | None:
        """Why a batch padded with zero-weight samples would not give this module's exact loss, or ``None``.

        Padding is exact when ``training_step``'s loss (and what it logs) is the mean over the batch of per-sample
        terms, as for the usual mean-reduced losses (``F.cross_entropy``, ``F.mse_loss``, ...). Checked once, on
        the largest client's first batch at the start weights: the loss, its gradient and the logged values on
        that batch must equal the mean of ``training_step`` on each of its samples alone, and on a batch padded
        with one zero-weight sample they must equal the unpadded batch's (a sum-reduced loss, a loss that couples
        the samples of a batch, random operations or an exception make the check fail). When it fails the engine
        groups jobs by batch shape instead (exact, slower).
        """
        sizes = [self.shards.num_samples(c) for c in range(self.shards.num_clients)]
        if not sizes or max(sizes) < 2 or self.batch_size < 2:
            return None  # every batch holds one sample: nothing is ever padded
        client = max(range(len(sizes)), key=sizes.__getitem__)
        try:
            with generators_kept(self.device), OneDNN(self.onednn):
                batch = next(iter(self.shards.batches(client, self.batch_size, torch.Generator().manual_seed(0))))
                leaves = pytree.tree_leaves(batch)
                if not leaves or not all(isinstance(leaf, Tensor) and leaf.dim() > 0 for leaf in leaves):
                    return "the batch is not made of tensors with a batch dimension"
                n = leaves[0].shape[0]
                if n < 2 or any(leaf.shape[0] != n for leaf in leaves):
                    return "the batch's tensors differ in their first (batch) dimension"
                return self._probe_padding(batch, n)
        except Exception as error:  # whatever training_step raises on single samples under vmap: no padding
            return f"training_step raised {type(error).__name__} on single samples: {error}"

    def _probe_padding(self, batch: Any, n: int) -> str | None:
        params = {name: p.detach() for name, p in zip(self._names, self.flat.params)}
        shorter = pytree.tree_map(lambda leaf: leaf[: n - 1], batch)
        padded = pytree.tree_map(lambda leaf: torch.cat([leaf[: n - 1], leaf[:1]]), batch)
        full = torch.full((n,), 1.0 / n, dtype=self.flat.params[0].dtype, device=self.device)
        pad = torch.cat([torch.full((n - 1,), 1.0 / (n - 1), dtype=full.dtype, device=self.device), full[:1] * 0])
        self.module._trainer = CohortJobTrainer()
        before = self.module.log, self.module.log_dict
        collector = self._step_module.log
        self.module.log, self.module.log_dict = collector.log, collector.log_dict  # type: ignore[method-assign]
        try:
            with torch.enable_grad():
                cases = []
                for reference, (b, w) in ((batch, (batch, full)), (shorter, (padded, pad))):
                    want_g, (want, want_log) = grad_and_value(self._loss, has_aux=True)(params, reference, 0)
                    got_g, (got, got_log) = grad_and_value(self._padded_loss, has_aux=True)(params, b, w, 0)
                    cases.append(
                        ([want, *want_g.values(), *want_log.values()], [got, *got_g.values(), *got_log.values()])
                    )
        finally:
            self.module._trainer = None
            self.module.log, self.module.log_dict = before  # type: ignore[method-assign]
        for want_all, got_all in cases:
            if len(want_all) != len(got_all):
                return "training_step logs other values on single samples"
            for want, got in zip(want_all, got_all):
                scale = float(want.detach().abs().max()) if want.numel() else 0.0
                if want.shape != got.shape or not torch.allclose(got, want, rtol=1e-3, atol=1e-5 * max(scale, 1e-3)):
                    return (
                        "training_step's loss, gradient or logged values are not the mean of its per-sample values "
                        "(e.g. a sum-reduced loss, a loss coupling a batch's samples, or random operations)"
                    )
        return None

    def _params(self, weights: Tensor) -> dict[str, Tensor]:
        views, offset, rows = {}, 0, weights.shape[0]
        for name, shape in zip(self._names, self._shapes):
            n = shape.numel()
            views[name] = weights[:, offset : offset + n].view(rows, *shape)
            offset += n
        return views

    def _lr(self, job: ClientJob) -> float:
        lr = self.lr
        for cb in self.callbacks:
            if isinstance(cb, LearningRateDecay):
                lr *= cb.factor(job.base_version)
        return lr

    def train_many(self, jobs: Sequence[ClientJob], starts: Sequence[Tensor]) -> list[ClientUpdate]:
        """Train the jobs from their start weights together and return their updates (in the jobs' order)."""
        with OneDNN(self.onednn), torch.no_grad():
            return self._train_many(jobs, starts)

    def _train_many(self, jobs: Sequence[ClientJob], starts: Sequence[Tensor]) -> list[ClientUpdate]:
        if not jobs:
            return []
        self.module.train()
        plans = []  # every job's (epoch, batch_idx, batch) list over all its epochs: the fast engine's batches
        for job in jobs:
            generator = self.seed_job(job)  # a dataset's random transforms draw as in the job's own fast run
            plans.append(
                [
                    (epoch, i, b)
                    for epoch in range(job.local_epochs)
                    for i, b in enumerate(self.shards.batches(job.client, self.batch_size, generator))
                ][: job.local_steps]  # a job's own number of steps (FedCompass) cuts its last epoch
            )
        # Rows in order of decreasing number of steps: the jobs still training at any step are the first rows, so a
        # step works on views of the stacked tensors and a job that has finished sits out (no update, no decay).
        order = sorted(range(len(jobs)), key=lambda j: -len(plans[j]))
        jobs, starts, plans = [jobs[j] for j in order], [starts[j] for j in order], [plans[j] for j in order]
        weights = torch.stack([s.to(self.device) for s in starts])
        prox = [cb.mu for cb in self.callbacks if isinstance(cb, ProximalTerm) and cb.mu != 0]
        anchors = weights.clone() if prox else weights
        if self.adam:
            self._state = [torch.zeros_like(weights), torch.zeros_like(weights)]
        else:  # a momentum buffer is filled at each job's first step
            self._state = [torch.empty_like(weights)] if self.optimizer_settings.momentum else []
        lr_values = [self._lr(j) for j in jobs]
        lrs = torch.tensor(lr_values, dtype=weights.dtype, device=self.device)
        loss_sums = torch.zeros(len(jobs), dtype=weights.dtype, device=self.device)
        logs = [JobLog() for _ in jobs]
        before = self.module.log, self.module.log_dict
        collector = self._step_module.log
        self.module.log, self.module.log_dict = collector.log, collector.log_dict  # type: ignore[method-assign]
        padded = self.no_padding_because is None
        try:
            for t in range(len(plans[0])):
                groups: dict[tuple[Any, ...], list[int]] = {}
                for j, plan in enumerate(plans):
                    if t >= len(plan):
                        break  # rows are ordered by number of steps: every later job has finished too
                    epoch, idx, batch = plan[t]
                    shapes = tuple(getattr(leaf, "shape", None) for leaf in pytree.tree_leaves(batch))
                    if padded:  # one group whatever the batch sizes: smaller batches are padded
                        shapes = tuple(None if s is None else s[1:] for s in shapes)
                    groups.setdefault((epoch, jobs[j].local_epochs, idx, shapes), []).append(j)
                for (epoch, local_epochs, idx, _), members in groups.items():
                    # self.trainer as a Trainer running each of these jobs alone would read it at this step
                    self.module._trainer = stand_in = CohortJobTrainer(local_epochs)
                    stand_in.current_epoch, stand_in.global_step = epoch, t
                    self._step_group(t, idx, members, jobs, plans, weights, anchors, prox, lrs, loss_sums, logs)
        finally:
            self.module._trainer = None
            self.module.log, self.module.log_dict = before  # type: ignore[method-assign]
        updates: list[ClientUpdate] = [None] * len(jobs)  # type: ignore[list-item]
        losses = loss_sums.tolist()  # one copy from the device, not one per job
        for j, job in enumerate(jobs):
            info = {"lr": lr_values[j]}
            update = self.make_update(job, weights[j].clone(), starts[j], len(plans[j]), losses[j], info)
            update.metrics = logs[j].results()[0]
            updates[order[j]] = update
        return updates

    def _stack_batches(self, batches: list[Any]) -> tuple[Any, Tensor | None]:
        """The jobs' batches stacked into one ``[jobs, samples, ...]`` batch, and the per-sample loss weights
        (``None`` when every batch is full: no padding). A smaller batch is padded with copies of its first sample,
        of weight 0; a real sample of a batch of ``n`` weighs ``1/n``."""
        sizes = [pytree.tree_leaves(b)[0].shape[0] for b in batches]
        most = max(sizes)
        if min(sizes) == most:
            return pytree.tree_map(lambda *leaves: torch.stack(leaves), *batches), None
        # Row j of the padded batch reads the samples offset_j .. offset_j + n_j - 1 of the concatenated batches,
        # then the first of them again: one concatenation and one gather per leaf, whatever the number of jobs.
        counts = torch.tensor(sizes, device=self.device)
        offsets = torch.cumsum(counts, 0) - counts
        positions = torch.arange(most, device=self.device)
        real = positions < counts[:, None]
        index = offsets[:, None] + torch.where(real, positions, 0)
        dtype = self.flat.params[0].dtype
        weights = torch.where(real, 1.0 / counts[:, None].to(dtype), 0.0).to(dtype)
        return pytree.tree_map(lambda *leaves: torch.cat(leaves)[index], *batches), weights

    def _penalize(self, g: Tensor, w: Tensor, anchor: Tensor | None, prox: list[float]) -> None:
        """Add to the gradients ``g`` (in place) FedProx's term, as ``ProximalTerm.on_after_backward``
        (``mu (w - w_start)`` for each ``mu`` in ``prox``), then weight decay, as ``torch.optim.SGD``
        (``weight_decay * w``); one job's rows or many stacked."""
        for mu in prox:
            g.add_(w - anchor, alpha=mu)  # type: ignore[operator]
        if self.weight_decay:
            g.add_(w, alpha=self.weight_decay)

    def _direction(self, t: int, g: Tensor, lr: Tensor, state: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The optimizer's step for the jobs' gradients ``g`` (weight decay included) at their step ``t`` (the first
        for every job when ``t == 0``), updating their ``state`` rows in place: ``(direction, step size)`` such that
        the weights move by ``-step size * direction``, as ``torch.optim.SGD`` (momentum) or ``Adam`` would."""
        settings = self.optimizer_settings
        if self.adam:
            exp_avg, exp_avg_sq = state
            exp_avg.lerp_(g, 1 - settings.beta1)
            exp_avg_sq.mul_(settings.beta2).addcmul_(g, g, value=1 - settings.beta2)
            step = float(t + 1)
            correction2 = (1 - settings.beta2**step) ** 0.5
            denom = (exp_avg_sq.sqrt() / correction2).add_(settings.eps)
            return exp_avg / denom, lr / (1 - settings.beta1**step)
        if not state:
            return g, lr
        (buffers,) = state
        if t == 0:
            buffers.copy_(g)
        else:
            buffers.mul_(settings.momentum).add_(g, alpha=1 - settings.dampening)
        return (g.add(buffers, alpha=settings.momentum) if settings.nesterov else buffers), lr

    def _decay(self, w: Tensor, lr: Tensor) -> None:
        """AdamW's decoupled weight decay of the jobs' weights ``w`` (``w * (1 - lr * weight_decay)``), before the
        step."""
        if self.adam and self.optimizer_settings.decoupled and self.optimizer_settings.weight_decay:
            w.mul_(1 - lr * self.optimizer_settings.weight_decay)

    def _step_group(
        self,
        t: int,
        idx: int,
        members: list[int],
        jobs: Sequence[ClientJob],
        plans: list[list[tuple[int, int, Any]]],
        weights: Tensor,
        anchors: Tensor,
        prox: list[float],
        lrs: Tensor,
        loss_sums: Tensor,
        logs: list[JobLog],
    ) -> None:
        """One SGD step of the jobs ``members`` (their step ``t``, batch ``idx``) on the stacked ``weights``."""
        if len(members) < self.min_batched:
            for j in members:
                self._step_one(t, idx, j, plans, weights, anchors, prox, lrs, loss_sums, logs)
            return
        # The common case, the first rows (the jobs still training, all in one group when batches are padded), works
        # on views of the stacked tensors, updated in place without copies.
        k = len(members)
        prefix = members[-1] == k - 1
        batch, sample_weights = self._stack_batches([plans[j][t][2] for j in members])
        if prefix:
            w, anchor, lr, loss_rows = weights[:k], anchors[:k] if prox else None, lrs[:k, None], loss_sums[:k]
        else:
            rows = torch.tensor(members, device=self.device)
            w, lr = weights.index_select(0, rows), lrs.index_select(0, rows)[:, None]
            anchor = anchors.index_select(0, rows) if prox else None
        with torch.enable_grad():
            if sample_weights is None:
                grads, (loss, logged) = self._step(self._params(w), batch, idx)
            else:
                grads, (loss, logged) = self._padded_step(self._params(w), batch, sample_weights, idx)
        g = torch.cat([grads[name].reshape(k, -1) for name in self._names], dim=1)
        self._penalize(g, w, anchor, prox)
        self._decay(w, lr)
        if prefix:
            g, lr = self._direction(t, g, lr, [s[:k] for s in self._state])
        else:
            state = [s.index_select(0, rows) for s in self._state]
            g, lr = self._direction(t, g, lr, state)
            for s, rows_state in zip(self._state, state):
                s.index_copy_(0, rows, rows_state)
        if prefix:
            w.addcmul_(lr, g, value=-1)
            loss_rows.add_(loss.detach())
        else:
            weights.index_copy_(0, rows, torch.addcmul(w, lr, g, value=-1))
            loss_sums.index_add_(0, rows, loss.detach())
        rows_logged = {name: value.detach().tolist() for name, value in logged.items()}  # one copy, not one per job
        for row, j in enumerate(members):  # each job's JobLog reduces its own values, as under engine='fast'
            logs[j].batch = plans[j][t][2]
            for name, values in rows_logged.items():
                logs[j].log(name, values[row], **self._step_module.log.kwargs[name])

    def _step_one(
        self,
        t: int,
        idx: int,
        j: int,
        plans: list[list[tuple[int, int, Any]]],
        weights: Tensor,
        anchors: Tensor,
        prox: list[float],
        lrs: Tensor,
        loss_sums: Tensor,
        logs: list[JobLog],
    ) -> None:
        """The step of :meth:`_step_group` for the one job ``j``, on the module itself with plain autograd."""
        batch = plans[j][t][2]
        w = weights[j]  # a view: updated in place
        self.flat.load(w)  # the module's parameters are views of self.flat (no floating buffers under this engine)
        with torch.enable_grad():
            loss, logged = self._step_module(batch, idx)
            grads = torch.autograd.grad(loss, self.flat.params, allow_unused=True, materialize_grads=True)
        g = torch.cat([grad.reshape(-1) for grad in grads])
        self._penalize(g, w, anchors[j] if prox else None, prox)
        lr = lrs[j : j + 1]
        self._decay(w, lr)
        g, lr = self._direction(t, g, lr, [s[j] for s in self._state])
        w.addcmul_(lr, g, value=-1)
        loss_sums[j] += loss.detach()
        logs[j].batch = batch
        for name, value in logged.items():
            logs[j].log(name, value, **self._step_module.log.kwargs[name])


class CohortExecutor:
    """Computes, whenever an update is asked for, every pending job at once with a :class:`CohortEngine`.

    Every dispatched job's start model is known at dispatch, so all pending jobs are independent until their
    arrival; the updates are stashed and handed out at the arrival events, in virtual-time order.

    Args:
        trainer: The cohort trainer.
        max_cohort: At most this many jobs per cohort (the asked-for job and the earliest dispatched others);
            ``None``: every pending job.
    """

    def __init__(self, trainer: CohortEngine, max_cohort: int | None = DEFAULT_MAX_COHORT) -> None:
        if max_cohort is not None and max_cohort < 1:
            raise ValueError(f"max_cohort must be >= 1, got {max_cohort}")
        self.trainer = trainer
        self.max_cohort = max_cohort
        self._pending: dict[int, tuple[ClientJob, Tensor]] = {}
        self._done: dict[int, ClientUpdate] = {}
        #: Sizes of the cohorts computed so far (for benchmarks and tests).
        self.cohort_sizes: list[int] = []

    def submit(self, job: ClientJob, start_weights: Tensor) -> None:
        """Register a dispatched job."""
        if job.request_step is not None:
            raise ValueError("the cohort engine cannot run jobs with a mid-training server request; use engine='fast'")
        self._pending[job.job_id] = (job, start_weights)

    def cancel(self, job_id: int) -> None:
        """Forget a job whose update will never be consumed."""
        self._pending.pop(job_id, None)
        self._done.pop(job_id, None)

    def result(self, job_id: int, fresh: tuple[Tensor, int] | None = None) -> ClientUpdate:
        """The update of a job, computing it with every other pending job if it is not computed yet."""
        if job_id not in self._done:
            others = sorted(k for k in self._pending if k != job_id)
            ids = [job_id, *others][: self.max_cohort]
            entries = [self._pending[k] for k in ids]
            self.cohort_sizes.append(len(ids))
            with generators_kept(self.trainer.device):
                updates = self.trainer.train_many([e[0] for e in entries], [e[1] for e in entries])
            for k in ids:  # only now: the jobs of a cohort that raised are still pending
                del self._pending[k]
            self._done.update(zip(ids, updates))
        return self._done.pop(job_id)


#: The former name of :class:`CohortEngine` (an alias, kept so that existing imports work).
CohortTrainer = CohortEngine
