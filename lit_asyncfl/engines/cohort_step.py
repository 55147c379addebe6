"""The cohort engine's batched training step: the module's ``training_step`` run on many jobs' weights in one
``vmap`` call (the jobs' weights bound in place of the module's parameters, as ``functional_call`` would, without its
and ``torch.func.vmap``'s pytree processing) whose gradient autograd takes outside ``vmap`` (inside it, through
``vmap(functional_call(...))``, when compiled), what the module sees while it runs (``self.log`` and ``self.trainer``
stand-ins), and the padding of smaller batches with its exactness probe."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import torch
import torch._C._functorch as functorch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch._functorch.vmap import lazy_load_decompositions
from torch.func import functional_call, grad_and_value, vmap
from torch.overrides import TorchFunctionMode
from torchmetrics import Metric

from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.engines.base import generator_state, restore_generators
from lit_asyncfl.engines.cohort_kernels import _CE_ARGS, BatchedKernels, _bound
from lit_asyncfl.loops.stand_in import JobTrainer

log = logging.getLogger("lit_asyncfl")

#: The refusal of a torchmetrics object updated in ``training_step`` (checked at fit start, see
#: :meth:`~lit_asyncfl.engines.CohortEngine.step_refusal`).
METRIC_REFUSAL = (
    "engine='cohort' cannot update a torchmetrics object in training_step (its state is one per job, the cohort "
    "trains many jobs in one batched call); use engine='fast', or log the tensor itself (self.log('name', value))"
)


class _Refused(ValueError):
    """``training_step`` does what the batched step cannot do the way ``engine='fast'`` does it (refused at fit
    start where the probe finds it, raised where a later step does, never redone without the kernels)."""


def _batch_size_of_one_sample(name: str) -> str:
    return (
        f"self.log({name!r}, ..., batch_size=...) in a padded step, where training_step runs on single samples (the "
        "batch size would be read from one sample, not from the job's batch): leave batch_size out (the engine gives "
        "each value its job's batch size, as Lightning infers it), or use engine='fast'"
    )


def _logged_twice(name: str) -> str:
    return (
        f"engine='cohort' cannot take self.log({name!r}, ...) twice in one training_step (each call counts in the "
        "job's mean under engine='fast' and Lightning; the batched step keeps one value per name and step); use "
        "engine='fast', or log the two values under different names"
    )


def _refuse_metric(*args: Any, **kwargs: Any) -> None:
    raise _Refused(METRIC_REFUSAL)


_NLL_ARGS = _CE_ARGS[:7]  # F.nll_loss's arguments: F.cross_entropy's but label_smoothing


class _IgnoreIndexes(TorchFunctionMode):
    """Records, while active, the ``ignore_index`` of every class-index ``F.cross_entropy`` or ``F.nll_loss`` call
    whose reduction is a mean (``nll_loss`` divides by the number of samples whose target is not ``ignore_index``,
    which a batch padded with zero-weight samples does not preserve), by loss name in :attr:`found`; the loss name
    ends in ``" (computed target)"`` where a call outside ``vmap`` takes a target that is not one of ``batch``'s
    integer tensors (or its first samples) as they are, so that searching the data for the value would not do."""

    def __init__(self, batch: Any) -> None:
        super().__init__()
        self.found: dict[int, str] = {}
        self.leaves = [leaf for leaf in pytree.tree_leaves(batch) if isinstance(leaf, Tensor) and leaf.dim() > 0]

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is F.cross_entropy or func is F.nll_loss:
            names = _CE_ARGS if func is F.cross_entropy else _NLL_ARGS
            bound = _bound(names, args, kwargs)
            target = bound.get("target")
            legacy = bound.get("size_average") is not None or bound.get("reduce") is not None
            mean = legacy or bound.get("reduction", "mean") == "mean"
            if mean and isinstance(target, Tensor) and not target.is_floating_point():
                value, name = int(bound.get("ignore_index", -100)), func.__name__
                if not functorch.is_batchedtensor(target) and not self._from_batch(target):
                    name += " (computed target)"
                if value not in self.found or name.endswith(")"):  # a computed target decides
                    self.found[value] = name
        return func(*args, **kwargs)

    def _from_batch(self, target: Tensor) -> bool:
        """Whether ``target`` is a tensor of the batch or of its first samples as it is (the same memory and
        values: the batch itself, a view or a no-op conversion of it); equal values alone do not say that a target
        computed from the batch (``torch.where(y == 2, -1, y)``) equals the data on every batch."""
        while functorch.is_gradtrackingtensor(target):  # grad's wrapper (the probe's call is under grad_and_value)
            target = functorch.get_unwrapped(target)
        try:
            memory = target.untyped_storage().data_ptr()
            flat = target.flatten()
            for leaf in self.leaves:
                if leaf.untyped_storage().data_ptr() != memory:
                    continue
                for part in (leaf, leaf[: leaf.shape[0] - 1]):
                    if part.numel() == flat.numel() and bool((part.flatten() == flat).all()):
                        return True
        except (RuntimeError, NotImplementedError):  # a tensor without storage (another transform's wrapper)
            pass
        return False


class _CohortLog:
    """``self.log`` inside the batched ``training_step``: collects the logged values (batched over the cohort's jobs)
    and their arguments, handed to each job's :class:`~lit_asyncfl.loops.JobLog` after the step."""

    def __init__(self) -> None:
        self.values: dict[str, Tensor] | None = None
        self.kwargs: dict[str, dict[str, Any]] = {}
        #: ``training_step`` runs on single samples (a padded step): a ``batch_size`` it passes is one sample's.
        self.single_samples = False

    def log(self, name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError("pass self.log's options by keyword under engine='cohort'")
        if isinstance(value, Metric):
            _refuse_metric()
        assert self.values is not None, "self.log outside training_step under engine='cohort'"
        if name in self.values:
            raise _Refused(_logged_twice(name))
        if self.single_samples and kwargs.get("batch_size") is not None:
            raise _Refused(_batch_size_of_one_sample(name))
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


class _StandIns:
    """While it is entered, the module's ``self.log``/``self.log_dict`` collect into the batched step's log and
    ``self.trainer`` is ``trainer``; left, they are the module's own again."""

    def __init__(self, step: _TrainingStep, trainer: CohortJobTrainer | None = None) -> None:
        self.step, self.trainer = step, trainer

    def __enter__(self) -> None:
        module, collector = self.step.m, self.step.log
        self.before = module.log, module.log_dict
        module._trainer = self.trainer
        module.log, module.log_dict = collector.log, collector.log_dict  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        module = self.step.m
        module._trainer = None
        module.log, module.log_dict = self.before  # type: ignore[method-assign]


def _batch_dim(batch: Any, level: int) -> Any:
    """``batch`` (a tensor, or a list or tuple of tensors, or any pytree) batched over its leading dimension at the
    ``vmap`` level ``level``."""
    if type(batch) is Tensor:
        return functorch._add_batch_dim(batch, 0, level)
    if type(batch) in (list, tuple) and all(type(leaf) is Tensor for leaf in batch):
        return type(batch)(functorch._add_batch_dim(leaf, 0, level) for leaf in batch)
    return pytree.tree_map(lambda leaf: functorch._add_batch_dim(leaf, 0, level), batch)


def _unbatched(value: Any, level: int, size: int) -> Tensor:
    """An output of a function ``vmap``-ed at ``level`` over ``size`` jobs with its batch dimension first, as
    ``vmap`` returns it (a tensor not batched at that level is expanded)."""
    if not isinstance(value, Tensor):
        raise ValueError(f"training_step must return and log tensors under engine='cohort', got {type(value)}")
    return functorch._remove_batch_dim(value, level, size, 0)


class _BatchedStep:
    """The module's ``training_step`` on the weights of many jobs at once: for ``k`` jobs' stacked weights and their
    ``k`` batches, the gradients, losses and logged values of every job in one batched call.

    :attr:`step` runs whole batches; :attr:`padded_step` runs batches padded to one size with zero-weight samples,
    as the mean of ``training_step`` on each sample alone (exact for losses that are means over per-sample terms,
    which :meth:`padding_refusal` checks). A torchmetrics object updated in ``training_step`` cannot be batched (its
    state is one per job), nor can what differs between jobs be read from ``self.trainer``: :meth:`step_refusal`
    finds either at fit start.

    Args:
        module: The engine's private copy of the user's module, bound to ``flat``.
        flat: The module's flat weights.
        device: The training device.
        compile: ``torch.compile`` the two batched calls (``dynamic=True``).
    """

    def __init__(self, module: L.LightningModule, flat: FlatParameters, device: torch.device, compile: bool) -> None:
        self.module = _TrainingStep(module)
        self.flat, self.device = flat, device
        self.names = [f"m.{name}" for name, _ in module.named_parameters()]
        # Where each parameter sits (every alias of a tied one), to bind a job's weights in place of the module's for
        # one batched call (what functional_call does, without its name lookups and pytree: 5% of a step of 5 jobs).
        index = {id(p): i for i, p in enumerate(module.parameters())}
        self._slots = []
        for name, p in module.named_parameters(remove_duplicate=False):
            owner, _, attr = name.rpartition(".")
            self._slots.append((module.get_submodule(owner), attr, index[id(p)]))
        lazy_load_decompositions()  # vmap's Python batching rules, which torch.func.vmap loads at its first call
        self.shapes = [p.shape for p in flat.params]
        self.metrics = [m for m in module.modules() if isinstance(m, Metric)]
        for metric in self.metrics:  # one state per job cannot be batched: refused at fit start (step_refusal)
            metric.update = metric.forward = _refuse_metric  # type: ignore[method-assign]
        #: The operations routed over the stacked jobs (convolutions and max-poolings channels-last, linear layers
        #: and cross-entropy losses; its ``routed`` counts them by name).
        self.kernels = BatchedKernels()
        #: The ``ignore_index`` of each mean-reduced class-index ``F.cross_entropy``/``F.nll_loss`` call of the padding
        #: probe (:meth:`padding_refusal`), with the loss's name: padding is exact only where no target holds it.
        self.ignore_indexes: dict[int, str] = {}
        #: Why the batched steps run without :attr:`kernels` (``vmap``'s own rules), or ``None`` while they route.
        self.kernels_off_because: str | None = (
            "compile=True: the gradient is taken inside vmap, where nothing is routed"
            if compile
            else f"the kernels route CPU tensors only (device {device.type!r})"
            if device.type != "cpu"
            else None
        )
        if compile:  # what torch.compile traces: the gradient inside vmap
            self.step = torch.compile(
                vmap(grad_and_value(self.loss, has_aux=True), in_dims=(0, 0, None), randomness="different"),
                dynamic=True,
            )
            self.padded_step = torch.compile(
                vmap(grad_and_value(self.padded_loss, has_aux=True), in_dims=(0, 0, 0, None), randomness="different"),
                dynamic=True,
            )
        else:
            self.step = self._gradients(self._batched_loss)
            self.padded_step = self._gradients(self._batched_padded_loss)

    def _gradients(self, batched: Any) -> Any:
        """The step of the jobs' ``batched`` losses (:meth:`_batched_loss` or :meth:`_batched_padded_loss`, the
        parameters a list in the order of :attr:`names`): their forward under ``vmap`` with the routed kernels
        (:class:`~lit_asyncfl.engines.cohort_kernels.BatchedKernels`), recorded by ordinary autograd, and the
        gradient of the sum of the jobs' losses, whose part in a job's weights is that job's gradient (the jobs do
        not interact). Returns what ``vmap(grad_and_value(...,
        has_aux=True))`` would: the gradients by name, and the losses and logged values, detached.

        The routed kernels hand ``vmap`` views of channels-last tensors, which some user code cannot take (e.g.
        ``x.view(x.size(0), -1)`` after a convolution or pooling: not contiguous). Where a routed step raises, it is
        redone without them (the random generator rewound: the same draws), and the engine runs unrouted from then on,
        :attr:`kernels_off_because` saying why; an error the unrouted step raises too surfaces as it is."""

        def run(params: dict[str, Tensor], args: tuple[Any, ...], kernels: Any) -> Any:
            leaves = {name: p.detach().requires_grad_() for name, p in params.items()}
            inputs = list(leaves.values())
            with torch.enable_grad():
                with kernels:
                    loss, logged = batched(inputs, *args)
                grads = (
                    torch.autograd.grad(loss.sum(), inputs, allow_unused=True, materialize_grads=True)
                    if loss.requires_grad
                    else [torch.zeros_like(p) for p in inputs]  # a loss that does not depend on the weights
                )
            return dict(zip(leaves, grads)), (loss.detach(), {name: v.detach() for name, v in logged.items()})

        def step(params: dict[str, Tensor], *args: Any) -> tuple[dict[str, Tensor], tuple[Tensor, dict[str, Tensor]]]:
            if self.kernels_off_because is not None:
                return run(params, args, contextlib.nullcontext())
            state, routed = generator_state(self.device), self.kernels.routed.copy()
            try:
                return run(params, args, self.kernels)
            except (MemoryError, torch.OutOfMemoryError, _Refused):
                raise  # not the kernels' layout: running again would not help
            except Exception as error:
                reason = f"{type(error).__name__}: {error}"  # (redone below, outside the handler: its frames freed)
            restore_generators(self.device, state)  # the same draws as the routed attempt's
            self.kernels.routed = routed  # the calls of the steps taken
            result = run(params, args, contextlib.nullcontext())  # what raises here too is the module's own
            self.kernels_off_because = (
                f"training_step raised {reason} with the batched kernels routed (it runs without them, on vmap's own "
                "rules; e.g. x.view(x.size(0), -1) on a routed convolution's or pooling's channels-last output: "
                "x.flatten(1) or x.reshape takes it)"
            )
            log.warning(
                "lit_asyncfl: engine='cohort' runs without its batched kernels (cohort_kernels): %s",
                self.kernels_off_because,
            )
            return result

        return step

    def probe_kernels(self, batch: Any, padded: bool) -> None:
        """Run one batched step of 2 jobs on ``batch`` (a first batch of the largest client; with ``padded``, also a
        padded step of it and itself less one sample) at the start weights, so that a ``training_step`` that fails on
        the routed kernels' output runs without them from the start (:attr:`kernels_off_because`) rather than from
        the step where it first fails. What else it raises is left to the first job, as without the probe."""
        if self.kernels_off_because is not None:
            return
        w = self.flat.read().detach()
        params = self.params(torch.stack([w, w]))
        leaves = pytree.tree_leaves(batch)
        n = leaves[0].shape[0] if leaves and isinstance(leaves[0], Tensor) and leaves[0].dim() else 0
        pairs = [[batch, batch]]
        if padded and n > 1:
            pairs.append([batch, pytree.tree_map(lambda leaf: leaf[: n - 1], batch)])
        try:
            with self.stand_ins(CohortJobTrainer()):
                for pair in pairs:
                    stacked, weights = self.stack_batches(pair)
                    self.step(params, stacked, 0) if weights is None else self.padded_step(params, stacked, weights, 0)
        except Exception:  # not this probe's business: the first job raises it, as without the probe
            pass
        finally:
            self.kernels.routed.clear()  # counts the jobs' calls only

    def stand_ins(self, trainer: CohortJobTrainer | None = None) -> _StandIns:
        """A context in which the module's ``self.log`` collects into this step and ``self.trainer`` is
        ``trainer``."""
        return _StandIns(self.module, trainer)

    def _call_bound(self, params: Sequence[Tensor], batch: Any, batch_idx: int) -> tuple[Tensor, dict[str, Tensor]]:
        """``training_step`` on ``batch`` with the module's parameters replaced by ``params`` (in the order of
        :attr:`names`) for the call, as ``functional_call`` would."""
        before = self._bind(params)
        try:
            return self.module(batch, batch_idx)
        finally:
            self._unbind(before)

    def _bind(self, params: Sequence[Tensor]) -> list[tuple[dict[str, Any], str, Any]]:
        """Put ``params`` (in the order of :attr:`names`) in place of the module's parameters, under every name of
        each (a tied parameter has several); returns what :meth:`_unbind` puts back."""
        before = [(owner._parameters, attr, owner._parameters[attr]) for owner, attr, _ in self._slots]
        for owner, attr, i in self._slots:
            owner._parameters[attr] = params[i]  # type: ignore[assignment]
        return before

    @staticmethod
    def _unbind(before: list[tuple[dict[str, Any], str, Any]]) -> None:
        for slots, attr, p in before:
            slots[attr] = p

    def _batched_loss(self, params: list[Tensor], batch: Any, batch_idx: int) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`loss` of each job, ``vmap``-ed over the jobs (the leading dimension of ``params`` and ``batch``):
        what ``vmap(self.loss, in_dims=(0, 0, None), randomness="different")`` computes, without its pytree
        processing of the arguments (a tenth of a step of 5 jobs)."""
        jobs = params[0].shape[0]
        level = functorch._vmap_increment_nesting(jobs, "different")
        try:
            inner = [functorch._add_batch_dim(p, 0, level) for p in params]
            loss, logged = self._call_bound(inner, _batch_dim(batch, level), batch_idx)
            return _unbatched(loss, level, jobs), {name: _unbatched(v, level, jobs) for name, v in logged.items()}
        finally:
            functorch._vmap_decrement_nesting()

    def _batched_padded_loss(
        self, params: list[Tensor], batch: Any, weights: Tensor, batch_idx: int
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """:meth:`padded_loss` of each job, ``vmap``-ed over the jobs as :meth:`_batched_loss`."""
        jobs = params[0].shape[0]
        level = functorch._vmap_increment_nesting(jobs, "different")
        try:
            inner = [functorch._add_batch_dim(p, 0, level) for p in params]
            batch, weights = _batch_dim(batch, level), functorch._add_batch_dim(weights, 0, level)
            samples = weights.shape[0]
            inner_level = functorch._vmap_increment_nesting(samples, "different")
            try:  # training_step on each sample alone: each leaf of the batch given its batch dimension back
                single = pytree.tree_map(lambda leaf: functorch._add_batch_dim(leaf, 0, inner_level)[None], batch)
                with self._single_samples():
                    losses, logged = self._call_bound(inner, single, batch_idx)
                losses = _unbatched(losses, inner_level, samples)
                logged = {name: _unbatched(v, inner_level, samples) for name, v in logged.items()}
            finally:
                functorch._vmap_decrement_nesting()
            loss = (losses * weights).sum()
            logged = {name: (value * weights).sum() for name, value in logged.items()}
            return _unbatched(loss, level, jobs), {name: _unbatched(v, level, jobs) for name, v in logged.items()}
        finally:
            functorch._vmap_decrement_nesting()

    def loss(self, params: dict[str, Tensor], batch: Any, batch_idx: int) -> tuple[Tensor, Any]:
        """``training_step`` on ``batch`` at the weights ``params``: the loss and what it logged."""
        return functional_call(self.module, params, (batch, batch_idx), strict=False)

    def _sample_loss(self, params: dict[str, Tensor], sample: Any, batch_idx: int) -> tuple[Tensor, Any]:
        """``training_step`` on one sample (every leaf given its batch dimension back): that sample's loss."""
        batch = pytree.tree_map(lambda leaf: leaf.unsqueeze(0), sample)
        with self._single_samples():
            return functional_call(self.module, params, (batch, batch_idx), strict=False)

    @contextlib.contextmanager
    def _single_samples(self) -> Iterator[None]:
        """``training_step`` runs on single samples inside (what its ``self.log`` refuses a ``batch_size`` for)."""
        log, before = self.module.log, self.module.log.single_samples
        log.single_samples = True
        try:
            yield
        finally:
            log.single_samples = before

    def padded_loss(self, params: dict[str, Tensor], batch: Any, weights: Tensor, batch_idx: int) -> tuple[Tensor, Any]:
        """A job's loss on its padded batch: ``sum_i weights[i] * loss_i`` over per-sample losses (``1/n`` for its
        ``n`` real samples, 0 for padding), i.e. the mean over its real samples that ``training_step`` computes on
        the unpadded batch (checked at construction, see :meth:`padding_refusal`); what it logs, weighted alike."""
        losses, logged = vmap(self._sample_loss, in_dims=(None, 0, None), randomness="different")(
            params, batch, batch_idx
        )
        return (losses * weights).sum(), {name: (value * weights).sum() for name, value in logged.items()}

    def params(self, weights: Tensor) -> dict[str, Tensor]:
        """The parameters of the stacked ``[jobs, parameters]`` weights, by name (views)."""
        views, offset, rows = {}, 0, weights.shape[0]
        for name, shape in zip(self.names, self.shapes):
            n = shape.numel()
            views[name] = weights[:, offset : offset + n].view(rows, *shape)
            offset += n
        return views

    def flat_gradients(self, grads: dict[str, Tensor], rows: int) -> Tensor:
        """The gradients by name (as :attr:`step` returns them) as one ``[rows, parameters]`` tensor in the order
        of the flat weights: each copied once into its columns (the channels-last gradients of convolutions, not
        contiguous, would otherwise be copied twice, by a reshape and a concatenation)."""
        first = grads[self.names[0]]
        flat = torch.empty(rows, self.flat.param_numel, dtype=first.dtype, device=first.device)
        for name, view in self.params(flat).items():
            view.copy_(grads[name])
        return flat

    def stack_batches(self, batches: list[Any]) -> tuple[Any, Tensor | None]:
        """The jobs' batches stacked into one ``[jobs, samples, ...]`` batch, and the per-sample loss weights
        (``None`` when every batch is full: no padding). A smaller batch is padded with copies of its first sample,
        of weight 0; a real sample of a batch of ``n`` weighs ``1/n``."""
        # Batches that are tensors (e.g. the sample indices of ClientShards.batch_indices) are their own only leaf:
        # the same as through pytree, without flattening every batch twice (0.025 to 0.017 ms per update of a
        # FedAsync run with 50 in flight, index plans).
        tensors = all(type(b) is Tensor for b in batches)

        def each_leaf(combine: Callable[[Sequence[Tensor]], Tensor]) -> Any:
            return combine(batches) if tensors else pytree.tree_map(lambda *leaves: combine(leaves), *batches)

        sizes = [b.shape[0] for b in batches] if tensors else [pytree.tree_leaves(b)[0].shape[0] for b in batches]
        most = max(sizes)
        if min(sizes) == most:
            return each_leaf(torch.stack), None
        # Row j of the padded batch reads the samples offset_j .. offset_j + n_j - 1 of the concatenated batches,
        # then the first of them again: one concatenation and one gather per leaf, whatever the number of jobs.
        counts = torch.tensor(sizes, device=self.device)
        offsets = torch.cumsum(counts, 0) - counts
        positions = torch.arange(most, device=self.device)
        real = positions < counts[:, None]
        index = offsets[:, None] + torch.where(real, positions, 0)
        dtype = self.flat.params[0].dtype
        weights = torch.where(real, 1.0 / counts[:, None].to(dtype), 0.0).to(dtype)
        return each_leaf(lambda leaves: torch.cat(leaves)[index]), weights

    def step_refusal(self, batch: Any, moves_without_gradient: str | None = None) -> str | None:
        """Why ``training_step`` cannot run batched, found by running it once on ``batch`` (on the engine's copy),
        or ``None``: it updates or logs a torchmetrics object, reads from ``self.trainer`` what differs between the
        jobs of a cohort (:class:`CohortJobTrainer`), or it leaves a parameter without a gradient (plain autograd,
        unused parameters not materialized as zeros) under an optimizer that would move a parameter with the zero
        gradient the batched step gives it, where ``torch.optim`` skips it (``moves_without_gradient`` names that
        optimizer, see :func:`~lit_asyncfl.engines.cohort_optim.moves_without_gradient`). Whatever else
        ``training_step`` raises here surfaces at the first job, as without the probe."""
        try:
            with self.stand_ins(CohortJobTrainer()), torch.enable_grad():
                loss, _ = self.module(batch, 0)
        except _Refused as refusal:
            return str(refusal)
        except AttributeError as error:  # what CohortJobTrainer cannot offer
            return f"training_step: {error}" if "self.trainer." in str(error) else None
        except Exception:  # not this probe's business
            return None
        if moves_without_gradient is None or not isinstance(loss, Tensor) or not loss.requires_grad:
            return None
        try:
            grads = torch.autograd.grad(loss, self.flat.params, allow_unused=True)
        except RuntimeError:  # e.g. a loss that is not a scalar: the first job says so, as without the probe
            return None
        unused = [name.removeprefix("m.") for name, g in zip(self.names, grads) if g is None]
        if not unused:
            return None
        return (
            f"training_step leaves parameters without a gradient ({', '.join(unused[:3])}"
            f"{', ...' if len(unused) > 3 else ''}; found on the largest client's first batch): torch.optim skips "
            f"them, but engine='cohort' steps them with a zero gradient, which {moves_without_gradient} moves; use "
            "engine='fast', plain SGD (no weight decay, no momentum), or remove the unused parameters"
        )

    def padding_refusal(self, batch: Any) -> str | None:
        """Why padding ``batch`` (a first batch of the largest client) with zero-weight samples would not give this
        module's exact loss, or ``None``: see :meth:`~lit_asyncfl.engines.CohortEngine.padding_refusal`."""
        try:
            leaves = pytree.tree_leaves(batch)
            if not leaves or not all(isinstance(leaf, Tensor) and leaf.dim() > 0 for leaf in leaves):
                return "the batch is not made of tensors with a batch dimension"
            n = leaves[0].shape[0]
            if n < 2 or any(leaf.shape[0] != n for leaf in leaves):
                return "the batch's tensors differ in their first (batch) dimension"
            return self._probe_padding(batch, n)
        except _Refused as refusal:  # what a padded step cannot do: grouped by batch shape instead
            return str(refusal)
        except Exception as error:  # whatever training_step raises on single samples under vmap: no padding
            return f"training_step raised {type(error).__name__} on single samples: {error}"

    def _probe_padding(self, batch: Any, n: int) -> str | None:
        self.ignore_indexes = {}
        params = {name: p.detach() for name, p in zip(self.names, self.flat.params)}
        shorter = pytree.tree_map(lambda leaf: leaf[: n - 1], batch)
        padded = pytree.tree_map(lambda leaf: torch.cat([leaf[: n - 1], leaf[:1]]), batch)
        full = torch.full((n,), 1.0 / n, dtype=self.flat.params[0].dtype, device=self.device)
        pad = torch.cat([torch.full((n - 1,), 1.0 / (n - 1), dtype=full.dtype, device=self.device), full[:1] * 0])
        recorder = _IgnoreIndexes(batch)
        with self.stand_ins(CohortJobTrainer()), torch.enable_grad(), recorder:
            cases = []
            for reference, (b, w) in ((batch, (batch, full)), (shorter, (padded, pad))):
                want_g, (want, want_log) = grad_and_value(self.loss, has_aux=True)(params, reference, 0)
                got_g, (got, got_log) = grad_and_value(self.padded_loss, has_aux=True)(params, b, w, 0)
                cases.append(([want, *want_g.values(), *want_log.values()], [got, *got_g.values(), *got_log.values()]))
        self.ignore_indexes = recorder.found
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
