"""VGG-11 (Simonyan and Zisserman, 2015, configuration A) adapted to CIFAR-sized inputs."""

from __future__ import annotations

from torch import nn

from lit_asyncfl.checks import check_int, check_number
from lit_asyncfl.models.base import LR, MAX_WIDTH, MOMENTUM, WEIGHT_DECAY, ClassificationModule, norm2d


class VGG11(ClassificationModule):
    """VGG-11 for small images: configuration A's convolutions and a small 512-512-classes head.

    Eight 3x3 convolutions (64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M, where M is a 2x2 max-pool),
    each followed by the normalisation layer and ReLU. The five pools divide the side by 32, so ``input_size``
    must be a multiple of 32; for 32x32 inputs the final feature map is 512x1x1. The head is
    ``Linear(512 * (input_size/32)**2, 512)``, ReLU, ``Linear(512, num_classes)`` (the original's 4096-4096 head
    shrunk to the feature size, no dropout). Convolutions and the hidden linear layer use He (Kaiming normal)
    initialisation, the output layer PyTorch's default (small logits at the start).

    Args:
        num_classes: Number of classes.
        in_channels: Input channels.
        input_size: Side of the square input; a multiple of 32.
        norm: ``"batch"`` (BatchNorm), ``"group"`` (GroupNorm: no running statistics, so the model has no buffers,
            runs under a batched/vmap client engine and averages cleanly) or ``"none"`` (the original VGG).
        groups: GroupNorm groups (must divide every scaled channel count); used only with ``norm="group"``.
        width: Multiplier of every layer's width (channels and the hidden head size), rounded, at least 1; in
            ``(0, MAX_WIDTH]`` (16); e.g. 0.25 gives 16-32-64-128 channels and a 128-unit head for tests and CPU runs.
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> import torch
        >>> VGG11(width=0.25)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
        >>> VGG11(input_size=28)
        Traceback (most recent call last):
        ...
        ValueError: input_size must be a positive multiple of 32 (VGG11 pools five times), got 28
    """

    CONFIG_A: tuple[int | str, ...] = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int = 32,
        norm: str = "batch",
        groups: int = 8,
        width: float = 1.0,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("in_channels", in_channels, 1)
        check_int("input_size", input_size, 1)
        if input_size % 32:
            raise ValueError(f"input_size must be a positive multiple of 32 (VGG11 pools five times), got {input_size}")
        check_number("width", width, 0, MAX_WIDTH, open_min=True)
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        channels = in_channels
        for item in self.CONFIG_A:
            if item == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            out = max(1, round(int(item) * width))
            conv = nn.Conv2d(channels, out, 3, padding=1, bias=norm == "none")
            layers += [conv, norm2d(norm, out, groups), nn.ReLU()]
            channels = out
        hidden = max(1, round(512 * width))
        side = input_size // 32
        layers += [
            nn.Flatten(),
            nn.Linear(channels * side * side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        ]
        self.net = nn.Sequential(*layers)
        for module in self.net[:-1].modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
