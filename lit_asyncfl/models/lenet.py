"""LeNet-5 for 8x8, 28x28 and 32x32 inputs."""

from __future__ import annotations

from torch import nn

from lit_asyncfl.checks import check_int
from lit_asyncfl.models.base import LR, MOMENTUM, WEIGHT_DECAY, ClassificationModule, feature_size


class LeNet5(ClassificationModule):
    """LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, FC 120-84-classes) adapted to the input size.

    For 32x32 inputs the convolutions are unpadded, as in the original; for 28x28 the first convolution is padded
    by 2 (the classic MNIST variant); for small inputs such as the 8x8 digits both are padded by 2 so the feature
    maps stay at least 2x2. The flattened size is computed from the input shape.

    Args:
        num_classes: Number of classes.
        in_channels: Input channels (1 for digits/MNIST, 3 for CIFAR).
        input_size: Side of the square input (8, 28, 32, ...).
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> import torch
        >>> model = LeNet5(input_size=8)
        >>> model(torch.zeros(2, 1, 8, 8)).shape
        torch.Size([2, 10])
        >>> LeNet5(in_channels=3, input_size=32)(torch.zeros(1, 3, 32, 32)).shape
        torch.Size([1, 10])
    """

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 1,
        input_size: int = 8,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("in_channels", in_channels, 1)
        check_int("input_size", input_size, 4)
        self.save_hyperparameters()
        pad1 = 0 if input_size >= 32 else 2
        after_pool1 = (input_size + 2 * pad1 - 4) // 2
        pad2 = 0 if after_pool1 >= 10 else 2
        features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=pad1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=pad2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = feature_size(features, in_channels, input_size)
        self.net = nn.Sequential(
            features,
            nn.Linear(flat, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )
