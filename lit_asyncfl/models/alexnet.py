"""AlexNet (Krizhevsky et al., 2012) in its common CIFAR-sized variant."""

from __future__ import annotations

from torch import nn

from lit_asyncfl.checks import check_int, check_number
from lit_asyncfl.models.base import LR, MAX_WIDTH, MOMENTUM, WEIGHT_DECAY, ClassificationModule, feature_size


class AlexNet(ClassificationModule):
    """AlexNet for small images: five convolutions (64-192-384-256-256), three max-pools, a three-layer head.

    The common CIFAR variant: a 3x3 stride-2 convolution replaces the 11x11 stride-4 one, every convolution is
    3x3 with padding 1 and followed by ReLU, 2x2 max-pools follow convolutions 1, 2 and 5 (no local response
    normalisation). On 32x32 inputs the features are 256x2x2; the head is dropout, ``Linear(1024, hidden_dim)``,
    ReLU, dropout, ``Linear(hidden_dim, hidden_dim)``, ReLU, ``Linear(hidden_dim, num_classes)``. The default
    ``hidden_dim=1024`` keeps the model at about 4.3M parameters for CPU simulation; ``hidden_dim=4096`` gives the
    original head width (about 23M). The flattened size is computed from the input shape. Convolutions and hidden
    linear layers use He (Kaiming normal) initialisation (without it the plain eight-layer stack barely trains), the
    output layer PyTorch's default.

    Args:
        num_classes: Number of classes.
        in_channels: Input channels.
        input_size: Side of the square input, at least 16 (the features are then at least 1x1).
        hidden_dim: Width of the two hidden fully connected layers (before the ``width`` multiplier).
        dropout: Dropout probability before each of the two hidden fully connected layers.
        width: Multiplier of every layer's width (channels and ``hidden_dim``), rounded, at least 1; in
            ``(0, MAX_WIDTH]`` (16).
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> from torch import zeros
        >>> AlexNet(width=0.25)(zeros(2, 3, 32, 32)).shape
        torch.Size([2, 10])
        >>> AlexNet(in_channels=1, input_size=28, width=0.25)(zeros(2, 1, 28, 28)).shape
        torch.Size([2, 10])
    """

    CHANNELS: tuple[int, ...] = (64, 192, 384, 256, 256)

    def __init__(
        self,
        num_classes: int = 10,
        in_channels: int = 3,
        input_size: int = 32,
        hidden_dim: int = 1024,
        dropout: float = 0.5,
        width: float = 1.0,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("in_channels", in_channels, 1)
        check_int("input_size", input_size, 16)  # AlexNet downsamples by 16
        check_int("hidden_dim", hidden_dim, 1)
        check_number("dropout", dropout, 0, 1, open_max=True)
        check_number("width", width, 0, MAX_WIDTH, open_min=True)
        self.save_hyperparameters()
        c1, c2, c3, c4, c5 = (max(1, round(c * width)) for c in self.CHANNELS)
        hidden = max(1, round(hidden_dim * width))
        features = nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c2, c3, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c3, c4, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c4, c5, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        flat = feature_size(features, in_channels, input_size)
        self.net = nn.Sequential(
            features,
            nn.Dropout(dropout),
            nn.Linear(flat, hidden),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
        for module in self.net[:-1].modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
                nn.init.zeros_(module.bias)
