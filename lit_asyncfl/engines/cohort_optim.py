"""The cohort engine's optimizers: SGD (momentum, dampening, Nesterov, weight decay) and Adam/AdamW applied to the
weights of many jobs stacked in one ``[jobs, parameters]`` tensor, one state row per job, as ``torch.optim`` would
step each job alone."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.optim import Optimizer


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


def optimizer_settings(optimizer: Optimizer, schedulers: list) -> _SGDSettings | _AdamSettings:
    """The settings of the optimizer ``configure_optimizers`` returned, or a ``ValueError`` naming ``engine='fast'``
    for one the cohort engine cannot batch (see :func:`~lit_asyncfl.engines.check_cohort_support`)."""
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


def moves_without_gradient(settings: _SGDSettings | _AdamSettings) -> str | None:
    """What in the optimizer would move a parameter whose gradient is zero, or ``None`` (plain SGD).

    The cohort engine's batched gradients are zero for a parameter a step leaves unused, where ``torch.optim``
    skips a parameter whose ``.grad`` is ``None``: weight decay, a momentum buffer or Adam's moments (kept from the
    steps that used it) would then move it under the cohort engine only. A zero gradient changes nothing under
    plain SGD.

    Example:
        >>> sgd = _SGDSettings(lr=0.1, weight_decay=0.0, momentum=0.9, dampening=0.0, nesterov=False)
        >>> moves_without_gradient(sgd)
        'SGD with momentum=0.9'
        >>> moves_without_gradient(sgd._replace(momentum=0.0)) is None
        True
    """
    if isinstance(settings, _AdamSettings):
        return "AdamW" if settings.decoupled else "Adam"
    terms = [f"{name}={getattr(settings, name)}" for name in ("weight_decay", "momentum") if getattr(settings, name)]
    return f"SGD with {' and '.join(terms)}" if terms else None


class _BatchedOptimizer:
    """One optimizer step for many jobs at once: FedProx's term and weight decay added to the gradients, AdamW's
    decoupled decay, and the step direction of SGD (with momentum) or Adam, with one state row per job.

    Args:
        settings: What :func:`optimizer_settings` read from ``configure_optimizers``.

    Example:
        >>> opt = _BatchedOptimizer(_SGDSettings(lr=0.1, weight_decay=0.0, momentum=0.0, dampening=0.0, nesterov=False))
        >>> w = torch.ones(2, 3)
        >>> opt.start(w)
        >>> g, lr = opt.direction(0, torch.full((2, 3), 2.0), torch.tensor([[0.1], [0.1]]), opt.state)
        >>> w.addcmul_(lr, g, value=-1)[0]
        tensor([0.8000, 0.8000, 0.8000])
    """

    def __init__(self, settings: _SGDSettings | _AdamSettings) -> None:
        self.settings = settings
        self.adam = isinstance(settings, _AdamSettings)
        #: The weight decay added to the gradient (AdamW's decays the weights instead, see :meth:`decay`).
        self.weight_decay = 0.0 if self.adam and settings.decoupled else settings.weight_decay  # type: ignore[union-attr]
        #: State of the cohort in training (one row per job): SGD's momentum buffer, Adam's two moments.
        self.state: list[Tensor] = []

    def start(self, weights: Tensor) -> None:
        """Fresh state rows for a cohort whose stacked weights are ``weights``."""
        if self.adam:
            self.state = [torch.zeros_like(weights), torch.zeros_like(weights)]
        else:  # a momentum buffer is filled at each job's first step
            self.state = [torch.empty_like(weights)] if self.settings.momentum else []  # type: ignore[union-attr]

    def penalize(self, g: Tensor, w: Tensor, anchor: Tensor | None, prox: list[float]) -> None:
        """Add to the gradients ``g`` (in place) FedProx's term, as ``ProximalTerm.on_after_backward``
        (``mu (w - w_start)`` for each ``mu`` in ``prox``), then weight decay, as ``torch.optim.SGD``
        (``weight_decay * w``); one job's rows or many stacked."""
        for mu in prox:
            g.add_(w - anchor, alpha=mu)  # type: ignore[operator]
        if self.weight_decay:
            g.add_(w, alpha=self.weight_decay)

    def direction(self, t: int, g: Tensor, lr: Tensor, state: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The optimizer's step for the jobs' gradients ``g`` (weight decay included) at their step ``t`` (the first
        for every job when ``t == 0``), updating their ``state`` rows in place: ``(direction, step size)`` such that
        the weights move by ``-step size * direction``, as ``torch.optim.SGD`` (momentum) or ``Adam`` would."""
        settings = self.settings
        if isinstance(settings, _AdamSettings):
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

    def decay(self, w: Tensor, lr: Tensor) -> None:
        """AdamW's decoupled weight decay of the jobs' weights ``w`` (``w * (1 - lr * weight_decay)``), before the
        step."""
        settings = self.settings
        if isinstance(settings, _AdamSettings) and settings.decoupled and settings.weight_decay:
            w.mul_(1 - lr * settings.weight_decay)
