"""ResNet-20, the CIFAR residual network of He et al. (2016)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from lit_asyncfl.checks import check_int
from lit_asyncfl.models.base import LR, MOMENTUM, WEIGHT_DECAY, ClassificationModule, norm2d


class _PadShortcut(nn.Module):
    """Option-A shortcut: subsample by ``stride`` and zero-pad the new channels (no parameters)."""

    def __init__(self, stride: int, extra_channels: int) -> None:
        super().__init__()
        self.stride = stride
        self.extra_channels = extra_channels

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        before = self.extra_channels // 2
        return F.pad(x, (0, 0, 0, 0, before, self.extra_channels - before))


class _BasicBlock(nn.Module):
    """conv3x3-norm-ReLU-conv3x3-norm plus the shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str, groups: int) -> None:
        super().__init__()
        bias = norm == "none"
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=bias)
        self.norm1 = norm2d(norm, out_channels, groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=bias)
        self.norm2 = norm2d(norm, out_channels, groups)
        if stride == 1 and in_channels == out_channels:
            self.shortcut: nn.Module = nn.Identity()
        else:
            self.shortcut = _PadShortcut(stride, out_channels - in_channels)

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(ClassificationModule):
    """ResNet-20 for CIFAR-sized images (He et al., 2016, Section 4.2).

    A 3x3 convolution with 16 channels, then 3 stages of 3 basic blocks (two 3x3 convolutions each) with 16, 32
    and 64 channels, the first block of stages 2 and 3 halving the resolution; global average pooling and a linear
    head. Shortcuts are the paper's option A: identity, or, where the shape changes, stride-2 subsampling with
    the new channels zero-padded, so shortcuts have no parameters (about 0.27M parameters in all). Thanks to the
    global pooling any input side works (8 and up keeps every stage's map at least 2x2), e.g. 8x8 digits, 28x28
    MNIST and 32x32 CIFAR. Convolutions use He (Kaiming normal) initialisation, the head PyTorch's default; with
    ``norm="none"`` the second convolution of each residual branch starts at zero (as in Fixup), so the untrained
    network is a stable shallow one instead of blowing up without normalisation (it then wants a smaller
    learning rate than the normalised variants).

    Args:
        num_classes: Number of classes.
        in_channels: Input channels (3 for CIFAR, 1 for MNIST).
        norm: ``"batch"`` (BatchNorm, as in the paper), ``"group"`` (GroupNorm: no running statistics, so the
            model has no buffers, runs under a batched/vmap client engine and averages cleanly) or ``"none"``.
        groups: GroupNorm groups (must divide 16); used only with ``norm="group"``.
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> import torch
        >>> ResNet20()(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
        >>> model = ResNet20(in_channels=1, norm="group")
        >>> model(torch.zeros(2, 1, 28, 28)).shape, len(list(model.buffers()))
        (torch.Size([2, 10]), 0)
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        norm: str = "batch",
        groups: int = 8,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("in_channels", in_channels, 1)
        self.save_hyperparameters()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=norm == "none"),
            norm2d(norm, 16, groups),
            nn.ReLU(),
        ]
        width = 16
        for stage, channels in enumerate((16, 32, 64)):
            for block in range(3):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(_BasicBlock(width, channels, stride, norm, groups))
                width = channels
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
        self.net = nn.Sequential(*layers)
        for module in self.net.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if norm == "none":
            for module in self.net.modules():
                if isinstance(module, _BasicBlock):
                    nn.init.zeros_(module.conv2.weight)
