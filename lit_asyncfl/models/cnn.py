"""The small CNN of the FedASMU appendix (Table 3)."""

from __future__ import annotations

from torch import nn

from lit_asyncfl.checks import check_int
from lit_asyncfl.models.base import MOMENTUM, WEIGHT_DECAY, ClassificationModule


class SimpleCNN(ClassificationModule):
    """Conv 64@2x2, ReLU, conv 32@2x2, ReLU, flatten, dense to the classes (FedASMU appendix, Table 3).

    Args:
        num_classes: Number of classes.
        in_channels: Input channels.
        input_size: Side of the square input.
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> import torch
        >>> SimpleCNN(in_channels=3, input_size=32)(torch.zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int = 32,
        lr: float = 0.03,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("in_channels", in_channels, 1)
        check_int("input_size", input_size, 3)
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 64, 2),
            nn.ReLU(),
            nn.Conv2d(64, 32, 2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(32 * (input_size - 2) ** 2, num_classes),
        )
