"""The ``cohort`` engine: all pending client jobs trained at once with ``torch.func`` over stacked weights.

Its parts live in modules of their own: the batched ``training_step`` with its ``self.log``/``self.trainer``
stand-ins and the padding of smaller batches (:mod:`~lit_asyncfl.engines.cohort_step`), the optimizers applied to
the stacked weights (:mod:`~lit_asyncfl.engines.cohort_optim`), and the executor that gathers the pending jobs into
cohorts (:class:`~lit_asyncfl.executors.CohortExecutor`, still importable from here under its former path).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree
from lightning.pytorch.utilities.data import extract_batch_size
from torch import Tensor, nn

from lit_asyncfl.client_callbacks.base import ClientCallback, LearningRateDecay, ProximalTerm
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.engines.base import (
    LocalEngine,
    OneDNN,
    choose_onednn,
    generators_kept,
    in_training_mode,
    parse_optimizers,
)
from lit_asyncfl.engines.cohort_optim import (
    _AdamSettings,
    _BatchedOptimizer,
    _SGDSettings,
    moves_without_gradient,
    optimizer_settings,
)
from lit_asyncfl.engines.cohort_step import CohortJobTrainer, _BatchedStep
from lit_asyncfl.loops.stand_in import _Entry
from lit_asyncfl.loops.validation_loop import JobLog

#: Client callbacks the cohort engine applies itself (as gradient or learning-rate terms).
SUPPORTED_CALLBACKS = (ProximalTerm, LearningRateDecay)

#: Steps shared by fewer jobs than this run one job at a time with plain autograd: an eager ``vmap`` call of the
#: batched step costs about 2.2 ms plus 0.3 ms per job on LeNet-5 (digits, batch 10, 1 thread), one job's plain step
#: about 1 ms, so batching pays from about 4 jobs. Such steps are the last ones of the largest shards of a cohort.
MIN_BATCHED = 4


def check_cohort_support(module: nn.Module, callbacks: Sequence[ClientCallback] = ()) -> _SGDSettings | _AdamSettings:
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
    return optimizer_settings(optimizer, schedulers)


def _integer(t: Any) -> bool:
    """Whether ``t`` is a tensor of integers (what a class-index target can be)."""
    return isinstance(t, Tensor) and not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def _representable(value: int, dtype: torch.dtype) -> bool:
    """Whether an integer tensor of ``dtype`` can hold ``value`` (a uint8 tensor never holds -100)."""
    info = torch.iinfo(dtype)
    return info.min <= value <= info.max


class CohortEngine(LocalEngine):
    """Trains many client jobs at once (the ``cohort`` engine).

    The jobs' weights are stacked into one ``[jobs, parameters]`` tensor, in rows ordered by decreasing number of
    local steps; at local step ``t`` every job that still trains (the first rows) is trained in one call of
    ``vmap(functional_call(training_step))`` (its gradient taken by autograd outside ``vmap``; convolutions and
    max-pooling run channels-last over the jobs, linear layers and the cross-entropy loss as one call over them,
    see :mod:`~lit_asyncfl.engines.cohort_kernels`, unless
    :attr:`kernels_off_because` says why not; with ``compile=True`` the gradient stays inside ``vmap``, what
    ``torch.compile`` traces, and nothing is routed), each on exactly the batch the ``fast`` engine would give it
    (same generator, same order), whatever the shard sizes:

    - A smaller batch (a client's last one) is **padded** to the largest batch of the step with copies of its first
      sample whose loss weight is 0: the loss is then ``training_step`` on each sample alone (an inner ``vmap``),
      weighted ``1/n`` for the ``n`` real samples, i.e. the mean the module computes on the unpadded batch, with the
      same gradient. This holds for losses that are means over per-sample terms (the usual mean-reduced losses, what
      ``training_step`` logs likewise), which is checked once at construction (:meth:`padding_refusal`); for any
      other module (a sum-reduced loss, a loss coupling the samples of a batch, random operations)
      :attr:`no_padding_because` says why and the jobs of a step are grouped by batch shape instead, as exact and
      slower. So is a mean-reduced ``F.cross_entropy``/``F.nll_loss`` whose ``ignore_index`` some client's data holds
      (searched at construction; data read from a dataset at each draw cannot be searched and is not padded). A
      step where every batch is full needs no padding and runs ``training_step`` on the whole batches.
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

    What the engine cannot batch is refused at construction, i.e. at fit start, naming ``engine='fast'``: the
    optimizers, buffers and client callbacks of :func:`check_cohort_support`, and a ``training_step`` that updates or
    logs a torchmetrics object, reads a per-job count from ``self.trainer``, or leaves a parameter without a
    gradient under weight decay, momentum or Adam (:meth:`step_refusal`: the batched gradient of an unused
    parameter is zero, which these would apply, where ``torch.optim`` skips a parameter whose ``.grad`` is
    ``None``; plain SGD is exact). The probe runs one batch: a parameter used on it but unused on a later batch
    is not found.

    Takes the arguments of :class:`~lit_asyncfl.engines.LocalEngine` (``module``, ``shards``, ``batch_size``,
    ``callbacks`` (see :func:`check_cohort_support`), ``device``, ``onednn``: ``torch.backends.mkldnn.enabled``
    while a cohort trains) and, by keyword:

    Args:
        compile: Compile the batched step with ``torch.compile`` (``dynamic=True``). Costs about a minute of
            compilation on first use (LeNet-5, 2 CPU cores) and makes each step of cohorts of that size about 25%
            faster; results equal the eager cohort's within float32 rounding. Needs a C++ compiler on the CPU
            (Inductor). The number of stacked jobs is specialised all the same: each new cohort size or batch shape
            recompiles (about 1.4 s) until ``torch._dynamo``'s recompile limit, after which the step runs eagerly,
            so in whole runs with cohorts of many sizes it does not pay (measured: ``docs/speed.md``).
    """

    def __init__(self, *args: Any, compile: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.optimizer_settings = check_cohort_support(self.module, self.callbacks)
        self.lr = self.optimizer_settings.lr
        #: The optimizer applied to the stacked weights, with its state rows (one per job of the cohort in training).
        self.stacked_optimizer = _BatchedOptimizer(self.optimizer_settings)
        #: The batched ``training_step`` (and its padded variant) on the stacked weights.
        self.batched = _BatchedStep(self.module, self.flat, self.device, compile)
        self._step_module = self.batched.module
        self._step, self._padded_step = self.batched.step, self.batched.padded_step
        self.compiled = compile
        refusal = self.step_refusal()
        if refusal is not None:
            raise ValueError(refusal)
        #: Why smaller batches are not padded (the jobs of a step are then grouped by batch shape), or ``None``.
        self.no_padding_because = self.padding_refusal()
        batch = self._probe_batch()
        if batch is not None:  # a module that cannot take the routed kernels' output runs without them from the start
            with generators_kept(self.device), OneDNN(self.onednn), torch.no_grad():
                self.batched.probe_kernels(batch, padded=self.no_padding_because is None)
        #: Groups of fewer jobs step one job at a time without ``vmap`` (see :data:`MIN_BATCHED`); a compiled step
        #: batches every group, as before (its cost per call was not measured against plain steps).
        self.min_batched = 1 if compile else MIN_BATCHED
        #: oneDNN for the steps run one job at a time: the ``fast`` engine's choice for this module and data
        #: (:func:`~lit_asyncfl.engines.choose_onednn`, off for small convolutions: 1.39x faster single-job steps of
        #: LeNet-5 on digits), where the batched steps keep ``onednn`` (its channels-last grouped convolutions).
        self.single_job_onednn = self.onednn
        if batch is not None:  # probed on a copy, with self.trainer a job's stand-in
            with generators_kept(self.device):
                self.single_job_onednn = choose_onednn(self.onednn, self.module, batch, self.device, CohortJobTrainer())

    @property
    def kernels_off_because(self) -> str | None:
        """Why the batched steps do not route convolutions and max-pooling (channels-last), linear layers and the
        cross-entropy loss over the jobs (:class:`~lit_asyncfl.engines.BatchedKernels`), or ``None`` while they do:
        ``compile=True``, a device other than the CPU, or
        ``training_step`` raised on the routed output (e.g. ``x.view(x.size(0), -1)`` after a convolution, found
        at construction by one batched step of 2 jobs on the largest client's first batch, or at the first step
        that raised, which is redone without them). Such a module trains with ``vmap``'s own kernels: the same
        results, within float32 rounding."""
        return self.batched.kernels_off_because

    def _probe_batch(self) -> Any:
        """The largest client's first batch (in the order of a generator seeded 0), or ``None`` without data."""
        sizes = [self.shards.num_samples(c) for c in range(self.shards.num_clients)]
        if not sizes or max(sizes) == 0:
            return None
        client = max(range(len(sizes)), key=sizes.__getitem__)
        return next(iter(self.shards.batches(client, self.batch_size, torch.Generator().manual_seed(0))))

    def step_refusal(self) -> str | None:
        """Why the module's ``training_step`` cannot run under the cohort engine, or ``None``: it updates or logs a
        torchmetrics object (one state per job cannot be batched), or reads a count that differs between the jobs
        of a cohort from ``self.trainer``, or it leaves a parameter without a gradient under an optimizer that
        would move it with the zero gradient the batched step gives it (weight decay, momentum, Adam; see
        :func:`~lit_asyncfl.engines.cohort_optim.moves_without_gradient`). Found at construction (fit start) by
        running ``training_step`` once on the largest client's first batch, on the engine's copy, leaving the
        random generators as they were."""
        with generators_kept(self.device), OneDNN(self.onednn), torch.no_grad():
            batch = self._probe_batch()
            moves = moves_without_gradient(self.optimizer_settings)
            return None if batch is None else self.batched.step_refusal(batch, moves)

    def padding_refusal(self) -> str | None:
        """Why a batch padded with zero-weight samples would not give this module's exact loss, or ``None``.

        Padding is exact when ``training_step``'s loss (and what it logs) is the mean over the batch of per-sample
        terms, as for the usual mean-reduced losses (``F.cross_entropy``, ``F.mse_loss``, ...). Checked once, on
        the largest client's first batch at the start weights: the loss, its gradient and the logged values on
        that batch must equal the mean of ``training_step`` on each of its samples alone, and on a batch padded
        with one zero-weight sample they must equal the unpadded batch's (a sum-reduced loss, a loss that couples
        the samples of a batch, random operations or an exception make the check fail). A mean-reduced
        ``F.cross_entropy``/``F.nll_loss`` on class indices divides by the samples whose target is not its
        ``ignore_index``: the check records that value and searches every client's data for it (a batch without it
        passes the check), refusing padding where a client holds it or the data cannot be searched
        (:class:`~lit_asyncfl.data.DatasetShards`). When it fails the engine groups jobs by batch shape instead
        (exact, slower).
        """
        sizes = [self.shards.num_samples(c) for c in range(self.shards.num_clients)]
        if not sizes or max(sizes) < 2 or self.batch_size < 2:
            return None  # every batch holds one sample: nothing is ever padded
        with generators_kept(self.device), OneDNN(self.onednn):
            batch = self._probe_batch()
            refusal = self.batched.padding_refusal(batch)
        return refusal or self._ignore_index_refusal(self.batched.ignore_indexes, batch)

    def _ignore_index_refusal(self, ignore_indexes: dict[int, str], batch: Any) -> str | None:
        """Why the ``ignore_index`` of a mean-reduced loss seen by the padding probe makes padding inexact, or
        ``None``: such a loss divides by the number of samples whose target is not ``ignore_index`` (and a sample
        alone whose target is ignored has the loss 0/0), so a padded batch's ``1/n`` weights differ from it where a
        batch holds that value. Every integer tensor of every client's resident data
        (:class:`~lit_asyncfl.data.ClientShards`: the targets, and the inputs where no ``transform`` changes them) is
        searched for the value; data read from a dataset at each draw cannot be searched at construction, nor can a
        target computed from the batch (not one of its tensors as they are, e.g. ``y - 1``): both are refused
        whenever such a loss is seen."""
        if not ignore_indexes:
            return None
        shards = self.shards
        for value, loss in sorted(ignore_indexes.items()):
            name = loss.removesuffix(" (computed target)")
            grouped = (
                f"training_step's {name} ignores the target {value} (ignore_index) in its mean, which a batch padded "
                "with zero-weight samples does not reproduce; the jobs of a step are grouped by batch shape instead "
                "(exact, slower)"
            )
            if loss.endswith("(computed target)"):
                return f"{grouped}: its target is computed from the batch, so the data cannot be searched for it"
            if not isinstance(shards, ClientShards) or (
                shards.transform is not None and _integer(pytree.tree_leaves(batch)[0])
            ):
                return f"{grouped}: the clients' data ({type(shards).__name__}) cannot be searched for it beforehand"
            tensors = [shards.targets] + ([shards.inputs] if shards.transform is None else [])
            for t in tensors:
                if not _integer(t) or not _representable(value, t.dtype):
                    continue
                rows = (t == value).reshape(len(t), -1).any(1)
                for client, index in enumerate(shards.indices):
                    if bool(rows[index].any()):
                        return f"{grouped}: client {client}'s data holds {value}"
        return None

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
        if not in_training_mode(self.module):  # module.train() walks and sets every submodule: 0.1 ms a cohort
            self.module.train()
        # Every job's (epoch, batch_idx, batch) list over all its epochs: the fast engine's batches. Where a batch is
        # the gather of its sample indices (resident shards without a random transform), the plans hold the index
        # tensors instead, and a step gathers all its jobs' batches at once (_step_group); nothing then draws from
        # the global generators, so seeding them for the last job alone leaves them as seeding every job in turn.
        gathers = getattr(self.shards, "gathers", False)
        epochs = self.shards.batch_indices if gathers else self.shards.batches
        plans = []
        for job in jobs:
            # a dataset's random transforms draw as in the job's own fast run
            generator = self.job_generator(job) if gathers and job is not jobs[-1] else self.seed_job(job)
            plans.append(
                [
                    (epoch, i, b)
                    for epoch in range(job.local_epochs)
                    for i, b in enumerate(epochs(job.client, self.batch_size, generator))
                ][: job.local_steps]  # a job's own number of steps (FedCompass) cuts its last epoch
            )
        # Rows in order of decreasing number of steps: the jobs still training at any step are the first rows, so a
        # step works on views of the stacked tensors and a job that has finished sits out (no update, no decay).
        order = sorted(range(len(jobs)), key=lambda j: -len(plans[j]))
        jobs, starts, plans = [jobs[j] for j in order], [starts[j] for j in order], [plans[j] for j in order]
        weights = torch.stack([s.to(self.device) for s in starts])
        prox = [cb.mu for cb in self.callbacks if isinstance(cb, ProximalTerm) and cb.mu != 0]
        self.stacked_optimizer.start(weights)
        lr_values = [self._lr(j) for j in jobs]
        cohort = _Cohort(
            plans=plans,
            weights=weights,
            anchors=weights.clone() if prox else None,
            prox=prox,
            lrs=torch.tensor(lr_values, dtype=weights.dtype, device=self.device),
            loss_sums=torch.zeros(len(jobs), dtype=weights.dtype, device=self.device),
            logs=_CohortLogs(plans, self._step_module.log.kwargs, gathers),
            gather=self.shards.gather if gathers else None,
            views=self.batched.params(weights),
        )
        padded = self.no_padding_because is None
        stand_ins: dict[int, CohortJobTrainer] = {}  # one self.trainer per number of local epochs, updated per step
        with self.batched.stand_ins():  # self.log collects into the batched step; self.trainer is set per group
            for t in range(len(plans[0])):
                groups: dict[tuple[Any, ...], list[int]] = {}
                for j, plan in enumerate(plans):
                    if t >= len(plan):
                        break  # rows are ordered by number of steps: every later job has finished too
                    epoch, idx, batch = plan[t]
                    if gathers:  # an index tensor: the batch's shapes follow from its number of samples
                        shapes: tuple[Any, ...] = () if padded else (len(batch),)
                    else:
                        shapes = tuple(getattr(leaf, "shape", None) for leaf in pytree.tree_leaves(batch))
                        if padded:  # one group whatever the batch sizes: smaller batches are padded
                            shapes = tuple(None if s is None else s[1:] for s in shapes)
                    groups.setdefault((epoch, jobs[j].local_epochs, idx, shapes), []).append(j)
                for (epoch, local_epochs, idx, _), members in groups.items():
                    # self.trainer as a Trainer running each of these jobs alone would read it at this step (as the
                    # fast engine's: one object whose counters move as the job runs)
                    stand_in = stand_ins.get(local_epochs)
                    if stand_in is None:
                        stand_in = stand_ins[local_epochs] = CohortJobTrainer(local_epochs)
                    if self.module._trainer is not stand_in:
                        self.module._trainer = stand_in
                    stand_in.current_epoch, stand_in.global_step = epoch, t
                    if len(members) < self.min_batched:
                        for j in members:
                            self._step_one(t, idx, j, cohort)
                    else:
                        self._step_group(t, idx, members, cohort)
        updates: list[ClientUpdate] = [None] * len(jobs)  # type: ignore[list-item]
        losses = cohort.loss_sums.tolist()  # one copy from the device, not one per job
        metrics = cohort.logs.results()
        for j, job in enumerate(jobs):
            info = {"lr": lr_values[j]}
            update = self.make_update(job, weights[j].clone(), starts[j], len(plans[j]), losses[j], info)
            update.metrics = metrics[j]
            updates[order[j]] = update
        return updates

    def _step_group(self, t: int, idx: int, members: list[int], cohort: _Cohort) -> None:
        """One SGD step of the jobs ``members`` (their step ``t``, batch ``idx``) on the cohort's stacked weights."""
        # The common case, the first rows (the jobs still training, all in one group when batches are padded), works
        # on views of the stacked tensors, updated in place without copies.
        k = len(members)
        prefix = members[-1] == k - 1
        optimizer, weights, anchors = self.stacked_optimizer, cohort.weights, cohort.anchors
        batch, sample_weights = self.batched.stack_batches([cohort.plans[j][t][2] for j in members])
        if cohort.gather is not None:  # the stacked (and padded) index tensors: one gather for all the jobs
            batch = cohort.gather(batch)
        if prefix:
            w, lr = weights[:k], cohort.lrs[:k, None]
            anchor = None if anchors is None else anchors[:k]
            # the views batched.params(w) would make, as one slice of each of the cohort's views
            params = cohort.views if k == len(weights) else {name: v[:k] for name, v in cohort.views.items()}
        else:
            rows = torch.tensor(members, device=self.device)
            w, lr = weights.index_select(0, rows), cohort.lrs.index_select(0, rows)[:, None]
            anchor = None if anchors is None else anchors.index_select(0, rows)
            params = self.batched.params(w)
        with torch.enable_grad():
            if sample_weights is None:
                grads, (loss, logged) = self._step(params, batch, idx)
            else:
                grads, (loss, logged) = self._padded_step(params, batch, sample_weights, idx)
        g = self.batched.flat_gradients(grads, k)
        optimizer.penalize(g, w, anchor, cohort.prox)
        optimizer.decay(w, lr)
        if prefix:
            g, lr = optimizer.direction(t, g, lr, [s[:k] for s in optimizer.state])
            w.addcmul_(lr, g, value=-1)
            cohort.loss_sums[:k].add_(loss.detach())
        else:
            state = [s.index_select(0, rows) for s in optimizer.state]
            g, lr = optimizer.direction(t, g, lr, state)
            for s, rows_state in zip(optimizer.state, state):
                s.index_copy_(0, rows, rows_state)
            weights.index_copy_(0, rows, torch.addcmul(w, lr, g, value=-1))
            cohort.loss_sums.index_add_(0, rows, loss.detach())
        cohort.logs.log(members, prefix, t, logged)

    def _step_one(self, t: int, idx: int, j: int, cohort: _Cohort) -> None:
        """The step of :meth:`_step_group` for the one job ``j``, on the module itself with plain autograd (where
        ``vmap``'s fixed cost per call would outweigh the batching, see :data:`MIN_BATCHED`)."""
        optimizer, w = self.stacked_optimizer, cohort.weights[j]  # a view: updated in place
        self.flat.load(w)  # the module's parameters are views of self.flat (no floating buffers under this engine)
        with torch.enable_grad(), OneDNN(self.single_job_onednn):
            loss, logged = self._step_module(cohort.batch(j, t), idx)
            grads = torch.autograd.grad(loss, self.flat.params, allow_unused=True, materialize_grads=True)
        g = torch.cat([grad.reshape(-1) for grad in grads])
        optimizer.penalize(g, w, None if cohort.anchors is None else cohort.anchors[j], cohort.prox)
        lr = cohort.lrs[j : j + 1]
        optimizer.decay(w, lr)
        g, lr = optimizer.direction(t, g, lr, [s[j] for s in optimizer.state])
        w.addcmul_(lr, g, value=-1)
        cohort.loss_sums[j] += loss.detach()
        cohort.logs.log_one(j, t, logged)


@dataclass
class _Cohort:
    """What the jobs of one :meth:`CohortEngine.train_many` share while they train, in rows ordered by decreasing
    number of steps: each job's batches (``plans``: ``(epoch, batch_idx, batch)`` per step, where ``batch`` is the
    batch's sample indices when ``gather`` turns those into the batch), the stacked weights, the proximal anchors
    (their start weights, ``None`` without FedProx) and coefficients ``prox``, the learning rates, the running loss
    sums, what the jobs log (:class:`_CohortLogs`) and the stacked weights' parameters by name (``views``:
    ``_BatchedStep.params`` of ``weights``)."""

    plans: list[list[tuple[int, int, Any]]]
    weights: Tensor
    anchors: Tensor | None
    prox: list[float]
    lrs: Tensor
    loss_sums: Tensor
    logs: _CohortLogs
    views: dict[str, Tensor]
    gather: Callable[[Tensor], Any] | None = None

    def batch(self, j: int, t: int) -> Any:
        """Job ``j``'s batch at its step ``t``."""
        planned = self.plans[j][t][2]
        return planned if self.gather is None else self.gather(planned)


class _CohortLogs:
    """What the jobs of a cohort log in ``training_step``, reduced for each job as its own
    :class:`~lit_asyncfl.loops.JobLog` reduces it under ``engine='fast'``.

    The common call, ``self.log(name, tensor)`` of one value per job (``on_step``/``on_epoch`` aside, which a job
    ignores), is reduced for all the jobs of a step at once: per job a float32 sum of ``value * batch size`` and one
    of the batch sizes, the mean their quotient, which are the float32 operations of ``JobLog``'s own path for that
    call, element by element (about 7 us per job and step less on LeNet-5's logged loss). A name logged any
    other way goes to each job's own ``JobLog`` from then on, which takes over the sums so far.

    Args:
        plans: The cohort's plans (``(epoch, batch_idx, batch)`` per step; rows as the stacked weights).
        kwargs: The options each name was last logged with (the batched step's log, updated at each call).
        gathers: The plans hold index tensors (a batch's size is their length).
    """

    def __init__(self, plans: list[list[tuple[int, int, Any]]], kwargs: dict[str, dict[str, Any]], gathers: bool):
        self.plans, self.kwargs, self.gathers = plans, kwargs, gathers
        #: Per name reduced in batch: the float32 sums of ``value * batch size`` and of the batch sizes, per job.
        self.sums: dict[str, tuple[Tensor, Tensor]] = {}
        #: Each job's own ``JobLog`` (built when a call first needs them), and the names they reduce.
        self.own: list[JobLog] | None = None
        self.own_names: set[str] = set()

    def _batch_size(self, j: int, t: int) -> int:
        """The batch size ``JobLog`` gives job ``j``'s value at step ``t``: Lightning's inference from the batch (an
        index tensor stands for its batch), 1 for an empty batch."""
        batch = self.plans[j][t][2]
        return (len(batch) if self.gathers else extract_batch_size(batch)) or 1

    def _batched(self, name: str, value: Tensor, count: int) -> bool:
        options = self.kwargs[name]
        return (
            name not in self.own_names
            and value.dim() == 1
            and value.shape[0] == count
            and (not options or options.keys() <= {"on_step", "on_epoch"})
        )

    def log(self, members: list[int], prefix: bool, t: int, logged: dict[str, Tensor]) -> None:
        """Reduce what the jobs ``members`` (the first rows when ``prefix``) logged at their step ``t``: ``logged``
        maps each name to a batched step's values, one per member."""
        sizes: Tensor | None = None
        rows: Tensor | None = None
        for name, value in logged.items():
            if not self._batched(name, value, len(members)):
                self._log_own(members, t, name, value.detach().to("cpu", torch.float32).unbind(0))
                continue
            if sizes is None:
                sizes = torch.tensor([self._batch_size(j, t) for j in members], dtype=torch.float32)
            total, weight = self._sums(name)
            products = value.detach().to("cpu", torch.float32) * sizes
            if prefix:
                total[: len(members)].add_(products)
                weight[: len(members)].add_(sizes)
            else:
                rows = torch.tensor(members) if rows is None else rows
                total.index_add_(0, rows, products)
                weight.index_add_(0, rows, sizes)

    def log_one(self, j: int, t: int, logged: dict[str, Any]) -> None:
        """Reduce what job ``j`` logged at its step ``t`` on the module itself (each value a tensor of the module)."""
        for name, value in logged.items():
            if not (type(value) is Tensor and value.numel() == 1 and value.dim() == 0):
                self._log_own([j], t, name, [value])  # JobLog's own reading of the value as it is
                continue
            one = value.detach().to("cpu", torch.float32).reshape(1)
            if not self._batched(name, one, 1):
                self._log_own([j], t, name, [value])
                continue
            total, weight = self._sums(name)
            size = self._batch_size(j, t)
            total[j : j + 1].add_(one * size)
            weight[j] += size

    def _sums(self, name: str) -> tuple[Tensor, Tensor]:
        found = self.sums.get(name)
        if found is None:
            n = len(self.plans)  # float32 as JobLog's sums, whatever torch's default dtype
            found = self.sums[name] = (torch.zeros(n, dtype=torch.float32), torch.zeros(n, dtype=torch.float32))
        return found

    def _log_own(self, members: list[int], t: int, name: str, values: Sequence[Any]) -> None:
        """Hand ``name``'s ``values`` to each member's own ``JobLog``, which goes on from the sums so far."""
        if self.own is None:
            self.own = [JobLog() for _ in self.plans]
        if name not in self.own_names:
            self.own_names.add(name)
            found = self.sums.pop(name, None)
            if found is not None:
                for j, (total, weight) in enumerate(zip(found[0].tolist(), found[1].tolist())):
                    if weight:  # the entry JobLog's own path would hold after the same calls
                        entry = _Entry("mean")
                        entry.sums = (np.float32(total), np.float32(weight))
                        self.own[j].entries[("training_step", name)] = (entry, None)
        for j, value in zip(members, values):
            log = self.own[j]
            log.batch = self.plans[j][t][2]
            log.log(name, value, **self.kwargs[name])

    def results(self) -> list[dict[str, float]]:
        """Each job's reduced values (its ``update.metrics``), in the rows' order."""
        out: list[dict[str, float]] = [{} for _ in self.plans]
        for name, (total, weight) in self.sums.items():
            for j, (mean, logged) in enumerate(zip((total / weight).tolist(), weight.tolist())):
                if logged:
                    out[j][name] = mean
        if self.own is not None:
            for j, log in enumerate(self.own):
                out[j].update(log.results()[0])
        return out


#: The former name of :class:`CohortEngine` (an alias, kept so that existing imports work).
CohortTrainer = CohortEngine

#: Names this module held before the cohort executor moved to :mod:`lit_asyncfl.executors.cohort` (the executors
#: package imports the engines, so they are looked up when first asked for rather than imported here).
_MOVED = ("CohortExecutor", "DEFAULT_MAX_COHORT")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from lit_asyncfl.executors import cohort

        return getattr(cohort, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
