"""Multi-layer perceptron and multinomial logistic regression."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from lit_asyncfl.checks import check, check_int, is_int
from lit_asyncfl.models.base import LR, MOMENTUM, WEIGHT_DECAY, ClassificationModule


class MLP(ClassificationModule):
    """Fully connected network on flattened inputs.

    Args:
        input_dim: Number of input features after flattening (64 for 8x8 digits).
        hidden_dims: Sizes of the hidden layers.
        num_classes: Number of classes.
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> import torch
        >>> MLP(input_dim=64, hidden_dims=(32,))(torch.zeros(3, 1, 8, 8)).shape
        torch.Size([3, 10])
    """

    def __init__(
        self,
        input_dim: int = 64,
        hidden_dims: Sequence[int] = (200, 200),
        num_classes: int = 10,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("input_dim", input_dim, 1)
        check(
            isinstance(hidden_dims, Sequence) and all(is_int(h) and h >= 1 for h in hidden_dims),
            f"hidden_dims must be a sequence of integers >= 1, got {hidden_dims!r}",
        )
        self.save_hyperparameters()
        layers: list[nn.Module] = [nn.Flatten()]
        width = input_dim
        for hidden in hidden_dims:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)


class LogisticRegression(MLP):
    """Multinomial logistic regression: one linear layer on flattened inputs.

    Args:
        input_dim: Number of input features.
        num_classes: Number of classes.
        lr: Local SGD learning rate.
        weight_decay: L2 penalty.

    Example:
        >>> import torch
        >>> LogisticRegression(input_dim=64)(torch.zeros(2, 64)).shape
        torch.Size([2, 10])
    """

    def __init__(self, input_dim: int = 64, num_classes: int = 10, lr: float = LR, weight_decay: float = WEIGHT_DECAY):
        super().__init__(input_dim=input_dim, hidden_dims=(), num_classes=num_classes, lr=lr, weight_decay=weight_decay)
