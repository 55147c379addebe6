"""Faster kernels for the cohort engine's batched step: 2-D convolutions and max-pooling over the stacked jobs run
channels-last on the CPU, linear layers and the cross-entropy loss as one call over the jobs.

Under ``vmap``, a convolution whose weights differ per job becomes one grouped convolution (one group per job,
the jobs folded into the channels) and a max-pooling folds the jobs into the samples. ``vmap``'s own rules lay both
out as ``[samples, channels, height, width]`` (NCHW): the pooling's rule copies the convolution's output to fold the
jobs into the samples, the next convolution's copies it back to fold them into the channels, and oneDNN's grouped
convolution on NCHW runs one group at a time. :class:`BatchedKernels` routes both operations itself: it takes the
physical tensors out of ``vmap``'s batched tensors, folds the jobs into the channels of a channels-last tensor,
calls the same ``torch`` operation once, and hands the result back to ``vmap`` as a view. A convolution's output is
then already in the layout the pooling and the next convolution read, and oneDNN's channels-last grouped
convolution is 2-4x faster than its NCHW one at the cohort's shapes (LeNet-5 on 8x8 digits, 20-50 jobs of 10
samples, 1 thread). The backward pass is the ordinary autograd of these calls, so the step records its forward
under ``vmap`` and takes the gradient of the summed job losses outside it (see
:class:`~lit_asyncfl.engines.cohort_step._BatchedStep`).

The same mode runs ``F.linear`` as one batched matrix product over the jobs (``baddbmm``, every sample of a job a
row of its matrix, whatever the inner ``vmap`` levels) and ``F.cross_entropy`` with class-index targets on every
job's rows at once, reduced per job (a mean over the samples whose target is not ``ignore_index``, as ``nll_loss``),
where ``vmap``'s rules run a matrix product, a bias addition and, for the loss, a Python decomposition of some twenty
operations forward and backward: one batched step of LeNet-5 made 1.2-1.35x faster with the step's own binding of
the weights (``scripts/bench_engines.py --step``).

The values are those of the same operation on each job alone, up to float32 rounding of the convolutions' and matrix
products' sums (another kernel order); max-pooling keeps the first maximum of a window in row-major order in both
layouts, NaN included, so its gradient goes to the same sample.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
import torch._C._functorch as functorch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.utils import _pair
from torch.overrides import TorchFunctionMode

_VMAP = functorch.TransformType.Vmap
_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_POOL_ARGS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_LINEAR_ARGS = ("input", "weight", "bias")
_CE_ARGS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing")
#: The class-index target dtypes ``F.cross_entropy`` takes (int32, which it rejects, is left to vmap's own rule).
_CE_TARGETS = (torch.long, torch.uint8)


def _vmap_levels() -> list[tuple[int, int]]:
    """The ``(level, batch size)`` of every transform on functorch's stack, outermost first; empty when a
    transform other than ``vmap`` (``grad``, ``jvp``) is on it or none is."""
    levels = []
    for interpreter in functorch.get_interpreter_stack() or ():
        if interpreter.key() != _VMAP:
            return []
        levels.append((interpreter.level(), functorch.CVmapInterpreterPtr(interpreter).batchSize()))
    return levels


def _physical(t: Tensor, levels: list[tuple[int, int]]) -> Tensor:
    """``t`` without ``vmap``'s wrappers: one leading dimension per level (outermost first) before its own
    dimensions, of size 1 at a level where ``t`` is not batched."""
    for level, _ in reversed(levels):
        if functorch.is_batchedtensor(t) and functorch.maybe_get_level(t) == level:
            t, dim = functorch._unwrap_batched(t, level)
            if dim:  # (a movedim(0, 0) is an operation too, and a node of the backward graph)
                t = t.movedim(dim, 0)
        else:
            t = t.unsqueeze(0)
    return t


def _per_job(t: Tensor | None, levels: list[tuple[int, int]]) -> Tensor | None:
    """``t`` (weights) without ``vmap``'s wrapper, its jobs first, where it is batched at the outermost level (the
    jobs) and at no other; otherwise ``None``."""
    if t is None or not functorch.is_batchedtensor(t) or functorch.maybe_get_level(t) != levels[0][0]:
        return None
    t, dim = functorch._unwrap_batched(t, levels[0][0])
    if functorch.is_batchedtensor(t):  # batched at a level outside the vmap levels (not the step's)
        return None
    return t.movedim(dim, 0) if dim else t


def _batched(t: Tensor, levels: list[tuple[int, int]]) -> Tensor:
    """The inverse of :func:`_physical` for a tensor batched at every level."""
    for level, _ in levels:
        t = functorch._add_batch_dim(t, 0, level)
    return t


def _channels_last(p: Tensor, inner: int) -> Tensor | None:
    """``p`` ``[jobs, *inner levels, N, C, H, W]`` as a channels-last ``[inner levels * N, jobs * C, H, W]``: a view
    when ``p`` came from :func:`_split` (the output of a routed call, or an element-wise function of it), a copy
    when ``p`` does not require a gradient (the data: copied once, forward only); otherwise ``None``. An activation
    laid out by another operation (a normalization, a residual sum) is left to ``vmap``'s rules: converting it and
    its gradient each time costs more than the faster kernel gains (ResNet-20 with GroupNorm: 1.6x slower)."""
    jobs, (c, h, w) = p.shape[0], p.shape[-3:]
    try:
        q = p.view(jobs, -1, c, h, w).permute(1, 3, 4, 0, 2)  # N', H, W, jobs, C
        q = q.view(q.shape[0], h, w, jobs * c).permute(0, 3, 1, 2)
    except RuntimeError:  # not a view of the jobs folded into the channels
        q = None
    if q is not None and q.is_contiguous(memory_format=torch.channels_last):
        return q
    if p.requires_grad:
        return None
    q = p.flatten(1, inner + 1).permute(1, 3, 4, 0, 2).reshape(-1, h, w, jobs * c).permute(0, 3, 1, 2)
    return q.contiguous(memory_format=torch.channels_last)


def _split(y: Tensor, jobs: int, lead: torch.Size) -> Tensor:
    """The output ``[N', jobs * C, H, W]`` of a call on :func:`_channels_last` as ``[jobs, *lead, C, H, W]``."""
    n, jc, h, w = y.shape
    return y.view(n, jobs, jc // jobs, h, w).movedim(1, 0).reshape(jobs, *lead, jc // jobs, h, w)


def _bound(names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class BatchedKernels(TorchFunctionMode):
    """While active around a ``vmap`` over stacked jobs, runs ``F.conv2d`` and ``F.max_pool2d`` on the jobs at once
    in channels-last layout, and ``F.linear`` and ``F.cross_entropy`` on the jobs at once (see the module's
    docstring), on the CPU; every other call, and these where the route does not apply, runs as usual. The linear
    layer is routed where its weight (and bias) are batched over the jobs only and its input at every level; the
    loss where its input is ``[samples, classes]`` and its class-index target ``[samples]`` for each job, batched at
    every level, without class weights or label smoothing.

    The four are routed over 2 jobs or more (the outermost ``vmap`` level's size; a single job keeps ``vmap``'s own
    rule, which is its own operation), the loss only for int64 or uint8 targets (what ``F.cross_entropy`` takes; an
    int32 target keeps ``vmap``'s rule, which takes it); the convolution when its weights (and bias) are batched at
    the outermost level only (the jobs) and its 4-D input at every level, its padding is not a string, and oneDNN
    is enabled (``torch.backends.mkldnn``: without it the channels-last grouped convolution is slower than
    ``vmap``'s own); max-pooling when its 4-D input is batched at every level and no indices are asked for. These two
    only when their
    input is already laid out as a routed call leaves it (the output of a routed call or an element-wise function
    of it: the conversion is a view) or needs no gradient (the data); an activation laid out by another operation
    (a normalization, a residual sum) is left to ``vmap``'s rules, as converting it forward and backward at every
    layer cost more than the kernels gained (ResNet-20 with GroupNorm, 10 jobs: 1.6x slower than without routing;
    LeNet-5 and the convolutions of :class:`~lit_asyncfl.models.SimpleCNN` are routed). Only ``vmap`` may be on
    functorch's stack (the step takes the gradient outside ``vmap``, with ordinary autograd): under ``grad`` nothing
    is routed. :attr:`routed` counts the routed calls by name (``"conv2d"``, ``"max_pool2d"``, ``"linear"``,
    ``"cross_entropy"``). A routed convolution's or pooling's output is a
    view of a channels-last tensor, not contiguous: code that views it flat (``x.view(x.size(0), -1)``) raises, and
    the cohort engine then runs that module without these kernels (``CohortEngine.kernels_off_because``).

    Example:
        >>> import torch, torch.nn.functional as F
        >>> from torch.func import vmap
        >>> x, w = torch.randn(3, 2, 1, 6, 6), torch.randn(3, 4, 1, 3, 3)  # 3 jobs: 2 samples, 4 filters each
        >>> kernels = BatchedKernels()
        >>> with kernels:
        ...     y = vmap(lambda x, w: F.max_pool2d(F.conv2d(x, w), 2))(x, w)
        >>> y.shape, dict(kernels.routed)
        (torch.Size([3, 2, 4, 2, 2]), {'conv2d': 1, 'max_pool2d': 1})
        >>> torch.allclose(y[1], F.max_pool2d(F.conv2d(x[1], w[1]), 2), atol=1e-6)
        True
        >>> a, v, t = torch.randn(3, 5, 4), torch.randn(3, 2, 4), torch.randint(0, 2, (3, 5))
        >>> with kernels:
        ...     losses = vmap(lambda a, v, t: F.cross_entropy(F.linear(a, v), t))(a, v, t)
        >>> kernels.routed["linear"], kernels.routed["cross_entropy"]
        (1, 1)
        >>> torch.allclose(losses[2], F.cross_entropy(F.linear(a[2], v[2]), t[2]))
        True
    """

    def __init__(self) -> None:
        super().__init__()
        self.routed: Counter[str] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = None
        if func is F.conv2d:  # nn.Conv2d's call (F.conv2d is torch.conv2d)
            out = self._conv2d(**_bound(_CONV_ARGS, args, kwargs))
        elif func is F.max_pool2d:  # nn.MaxPool2d's call (torch.max_pool2d is not routed)
            out = self._max_pool2d(**_bound(_POOL_ARGS, args, kwargs))
        elif func is F.linear:  # nn.Linear's call
            out = self._linear(**_bound(_LINEAR_ARGS, args, kwargs))
        elif func is F.cross_entropy:
            out = self._cross_entropy(**_bound(_CE_ARGS, args, kwargs))
        return func(*args, **kwargs) if out is None else out

    def _conv2d(
        self,
        input: Tensor,
        weight: Tensor,
        bias: Tensor | None = None,
        stride: Any = 1,
        padding: Any = 0,
        dilation: Any = 1,
        groups: int = 1,
    ) -> Tensor | None:
        if isinstance(padding, str) or input.dim() != 4 or input.device.type != "cpu":
            return None
        if not torch.backends.mkldnn.enabled:
            return None
        levels = _vmap_levels()
        if not levels or levels[0][1] < 2:  # one job: vmap's rule is the job's own convolution
            return None
        x, w, b = _physical(input, levels), _per_job(weight, levels), _per_job(bias, levels)
        sizes = [size for _, size in levels]
        jobs, inner = sizes[0], len(levels) - 1
        if list(x.shape[: inner + 1]) != sizes or w is None or (b is None) != (bias is None):
            return None  # the input is not batched at some level, or the weights at another level than the jobs'
        grouped = _channels_last(x, inner)
        if grouped is None:
            return None
        y = F.conv2d(
            grouped,
            w.flatten(0, 1),
            None if b is None else b.flatten(),
            _pair(stride),
            _pair(padding),
            _pair(dilation),
            groups * jobs,
        )
        self.routed["conv2d"] += 1
        return _batched(_split(y, jobs, x.shape[1 : inner + 2]), levels)

    def _max_pool2d(
        self,
        input: Tensor,
        kernel_size: Any,
        stride: Any = None,
        padding: Any = 0,
        dilation: Any = 1,
        ceil_mode: bool = False,
        return_indices: bool = False,
    ) -> Tensor | None:
        if return_indices or input.dim() != 4 or input.device.type != "cpu":
            return None
        levels = _vmap_levels()
        if not levels or levels[0][1] < 2:
            return None
        x = _physical(input, levels)
        sizes = [size for _, size in levels]
        if list(x.shape[: len(levels)]) != sizes:
            return None
        inner = len(levels) - 1
        stride = kernel_size if stride is None or (isinstance(stride, (list, tuple)) and not stride) else stride
        grouped = _channels_last(x, inner)
        if grouped is None:
            return None
        y = F.max_pool2d(grouped, kernel_size, stride, padding, dilation, ceil_mode)
        self.routed["max_pool2d"] += 1
        return _batched(_split(y, sizes[0], x.shape[1 : inner + 2]), levels)

    def _linear(self, input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor | None:
        if input.device.type != "cpu" or input.dim() < 1 or weight.dim() != 2:
            return None
        levels = _vmap_levels()
        if not levels or levels[0][1] < 2:
            return None
        x, w, b = _physical(input, levels), _per_job(weight, levels), _per_job(bias, levels)  # w: [jobs, out, in]
        sizes = [size for _, size in levels]
        jobs = sizes[0]
        if list(x.shape[: len(levels)]) != sizes or w is None or (b is None) != (bias is None):
            return None
        rows = x.reshape(jobs, -1, x.shape[-1])  # every sample of a job (all inner levels) is a row of its matrix
        if b is None:
            y = torch.bmm(rows, w.transpose(1, 2))
        else:
            y = torch.baddbmm(b.unsqueeze(1), rows, w.transpose(1, 2))
        self.routed["linear"] += 1
        return _batched(y.view(*x.shape[:-1], w.shape[1]), levels)

    def _cross_entropy(
        self,
        input: Tensor,
        target: Tensor,
        weight: Tensor | None = None,
        size_average: Any = None,
        ignore_index: int = -100,
        reduce: Any = None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> Tensor | None:
        if weight is not None or size_average is not None or reduce is not None or label_smoothing != 0.0:
            return None
        if reduction not in ("mean", "sum", "none") or input.device.type != "cpu":
            return None
        if input.dim() != 2 or target.dim() != 1 or target.dtype not in _CE_TARGETS:  # class indices of [n, classes]
            return None
        levels = _vmap_levels()
        if not levels or levels[0][1] < 2:
            return None
        x, t = _physical(input, levels), _physical(target, levels)
        sizes = [size for _, size in levels]
        if list(x.shape[: len(levels)]) != sizes or list(t.shape[: len(levels)]) != sizes:
            return None
        losses = F.cross_entropy(x.reshape(-1, x.shape[-1]), t.reshape(-1), ignore_index=ignore_index, reduction="none")
        losses = losses.view(t.shape)  # [*levels, n], 0 where the target is ignore_index
        if reduction == "sum":
            losses = losses.sum(-1)
        elif reduction == "mean":  # over the samples whose target is not ignore_index, as nll_loss
            losses = losses.sum(-1) / (t != ignore_index).sum(-1).to(losses.dtype)
        self.routed["cross_entropy"] += 1
        return _batched(losses, levels)
