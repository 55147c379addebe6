"""CPU kernel choice for local training: oneDNN on or off for small convolutions."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from lit_asyncfl.core.workspace import unseen

#: oneDNN is switched off (``onednn=None``, automatic) when the largest convolution input of a training batch has
#: at most this many elements and the batch at most :data:`ONEDNN_AUTO_MAX_BATCH` samples. Measured on a 2-core
#: CPU, one thread, SGD steps of LeNet-5, speed-up of oneDNN off: 8x8 digits 1.51x (batch 5), 1.28x (10), 1.13x
#: (16), 1.10x (20), 0.98x (32), 0.92x (50); 28x28 inputs 1.36x (batch 5), 1.12x (10; 11,760 elements), 0.97x (16;
#: 18,816), 0.82x (20); 3x32x32 inputs at batch 10 (30,720 elements) 0.66x; ResNet-20 on 32x32 at batch 10 0.58x.
#: The rule picks the faster setting at every one of these points.
ONEDNN_AUTO_MAX_ELEMENTS = 12_000
#: See :data:`ONEDNN_AUTO_MAX_ELEMENTS`.
ONEDNN_AUTO_MAX_BATCH = 20


def largest_conv_input(module: nn.Module, batch: Any) -> torch.Size | None:
    """Shape of the largest convolution input when the module's ``training_step`` runs on ``batch``.

    The step runs in evaluation mode without gradients, with the CPU random state restored afterwards, so neither
    the weights, the buffers nor the random stream change.

    Args:
        module: A ``LightningModule`` (its ``training_step`` is run) or a plain module (called on ``batch[0]``).
        batch: One training batch.

    Returns:
        The shape (batch dimension first) of the input with the most elements, or ``None`` when the module has
        no convolution.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 2, 3))
        >>> largest_conv_input(net, [torch.zeros(10, 1, 8, 8)])  # the second conv sees 10 x 4 x 6 x 6
        torch.Size([10, 4, 6, 6])
        >>> largest_conv_input(nn.Linear(3, 1), [torch.zeros(2, 3)]) is None
        True
    """
    convs = [m for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if not convs:
        return None
    shapes: list[torch.Size] = []
    hooks = [m.register_forward_pre_hook(lambda mod, args: shapes.append(args[0].shape)) for m in convs]
    was_training = module.training
    module.eval()
    try:
        with unseen(), torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r".*self\.log\(\)`? but the `self\.trainer` reference.*")
            step = getattr(module, "training_step", None)
            step(batch, 0) if step is not None else module(batch[0])
    finally:
        for hook in hooks:
            hook.remove()
        module.train(was_training)
    return max(shapes, key=lambda shape: shape.numel(), default=None)


def choose_onednn(onednn: bool | None, module: nn.Module, batch: Any, device: torch.device) -> bool | None:
    """The oneDNN setting for local training: the user's choice, else the automatic one.

    Automatic (``onednn=None``): off on the CPU when the module's largest convolution input on ``batch`` has at
    most :data:`ONEDNN_AUTO_MAX_ELEMENTS` elements and :data:`ONEDNN_AUTO_MAX_BATCH` samples; otherwise left as it
    is (``None``). The choice depends only on the model and the batch shape, never on timings, so it is the same
    in every run of a configuration.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3))
        >>> choose_onednn(None, net, [torch.zeros(10, 1, 8, 8)], torch.device("cpu"))
        False
        >>> choose_onednn(None, net, [torch.zeros(10, 1, 64, 64)], torch.device("cpu")) is None
        True
        >>> choose_onednn(None, net, [torch.zeros(32, 1, 8, 8)], torch.device("cpu")) is None
        True
        >>> choose_onednn(True, net, [torch.zeros(10, 1, 8, 8)], torch.device("cpu"))
        True
    """
    if onednn is not None or device.type != "cpu":
        return onednn
    largest = largest_conv_input(module, batch)
    if largest is not None and largest.numel() <= ONEDNN_AUTO_MAX_ELEMENTS and largest[0] <= ONEDNN_AUTO_MAX_BATCH:
        return False
    return None


class OneDNN:
    """Context manager setting ``torch.backends.mkldnn.enabled`` (``None``: leave it) and restoring it on exit.

    Example:
        >>> with OneDNN(False):
        ...     torch.backends.mkldnn.enabled
        False
    """

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self._previous: bool | None = None

    def __enter__(self) -> None:
        if self.enabled is not None:
            self._previous = torch.backends.mkldnn.enabled
            torch.backends.mkldnn.enabled = self.enabled

    def __exit__(self, *exc: Any) -> None:
        if self.enabled is not None:
            torch.backends.mkldnn.enabled = self._previous
