"""Gradient clipping in every client job: ``lightning.Trainer(gradient_clip_val=...)`` as a client callback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from lit_asyncfl.checks import check_choice, check_number
from lit_asyncfl.client_callbacks.base import ClientCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.engines.fast import LocalTrainer


class GradientClipping(ClientCallback):
    """Clip each local step's gradients as ``lightning.Trainer(gradient_clip_val=..., gradient_clip_algorithm=...)``
    does: after ``backward`` (and the client callbacks listed before this one), before ``optimizer.step``, over the
    parameters of the job's optimizer — by their total 2-norm (``"norm"``: ``torch.nn.utils.clip_grad_norm_``) or
    element-wise (``"value"``: ``clip_grad_value_``). Weights equal a ``lightning.Trainer`` fit with the same flags
    (tested under ``engine="fast"`` and ``"lightning"``); the ``cohort`` engine refuses it at fit start, and so does
    a module with manual optimization (which clips its own gradients, as Lightning requires).

    Add it to the algorithm: ``algo = FedAvg(); algo.client_callbacks.append(GradientClipping(0.5))``.

    Args:
        gradient_clip_val: The largest norm (or absolute value) of the gradients, ``> 0``.
        gradient_clip_algorithm: ``"norm"`` or ``"value"``.

    Example:
        >>> GradientClipping(0.5).gradient_clip_algorithm
        'norm'
    """

    runs_on_workers = True  # no state: what it does depends on the step's gradients alone

    def __init__(self, gradient_clip_val: float, gradient_clip_algorithm: str = "norm") -> None:
        check_number("gradient_clip_val", gradient_clip_val, 0, open_min=True)
        check_choice("gradient_clip_algorithm", gradient_clip_algorithm, ("norm", "value"))
        self.gradient_clip_val = gradient_clip_val
        self.gradient_clip_algorithm = gradient_clip_algorithm

    def on_after_backward(self, trainer: LocalTrainer, job: ClientJob) -> None:
        params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
        if self.gradient_clip_algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, self.gradient_clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, self.gradient_clip_val)
