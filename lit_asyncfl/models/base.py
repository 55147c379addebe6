"""A small classification ``LightningModule`` base and the normalisation-layer choice shared by the bundled models."""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.functional.classification import multiclass_accuracy

from lit_asyncfl.checks import check_int, check_number

#: Largest ``width`` multiplier of the scalable models (VGG11, AlexNet): 16x VGG11 has about 2,000x its parameters.
MAX_WIDTH = 16
#: Defaults of the local SGD (learning rate, momentum, L2 penalty) of the bundled models.
LR = 0.05
MOMENTUM = 0.0
WEIGHT_DECAY = 0.0


class ClassificationModule(L.LightningModule):
    """Cross-entropy training, accuracy/loss evaluation and an SGD optimizer around ``self.net``.

    Subclasses build ``self.net`` (a module mapping inputs to logits) or override ``forward``. When ``self.net`` is
    an ``nn.Sequential``, :meth:`representation` is the input of its last layer (the classifier) and ``forward``
    computes through it, as representation-based methods (MOON) need; a subclass overriding ``forward`` overrides
    :meth:`representation` too. ``validation_step``
    logs ``val_loss`` and ``val_acc``; ``test_step`` logs ``test_loss`` and ``test_acc`` (accuracy via
    torchmetrics). Training and evaluation share :meth:`loss` (cross-entropy), which a subclass may override.

    Args:
        num_classes: Number of classes.
        lr: Local SGD learning rate.
        momentum: SGD momentum.
        weight_decay: L2 penalty.
    """

    def __init__(
        self, num_classes: int = 10, lr: float = LR, momentum: float = MOMENTUM, weight_decay: float = WEIGHT_DECAY
    ):
        super().__init__()
        check_int("num_classes", num_classes, 2)
        check_number("lr", lr, 0, open_min=True)
        check_number("momentum", momentum, 0, 1, open_max=True)
        check_number("weight_decay", weight_decay, 0)
        self.num_classes = num_classes
        self.lr = lr
        self.momentum = momentum
        self.weight_decay = weight_decay
        self.net: nn.Module = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        net = self.net
        if isinstance(net, nn.Sequential) and len(net) > 1:
            *_, head = net
            return head(self.representation(x))
        return net(x)

    def representation(self, x: Tensor) -> Tensor:
        """The representation of ``x`` the classifier reads: the input of the last layer of ``self.net`` (MOON's
        :math:`z`). ``forward`` computes through this method, so one forward pass yields both."""
        net = self.net
        if not isinstance(net, nn.Sequential) or len(net) < 2:
            raise NotImplementedError(
                f"{type(self).__name__}.net is not an nn.Sequential of two or more layers: define "
                "representation(x) (the features its classifier reads) and compute forward through it"
            )
        *body, _ = net
        for layer in body:
            x = layer(x)
        return x

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """The training and evaluation loss of ``logits`` against integer labels ``y`` (here cross-entropy)."""
        return F.cross_entropy(logits, y)

    def sample_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """The loss of each sample, whose mean is :meth:`loss` (here per-sample cross-entropy). A subclass that
        overrides :meth:`loss` overrides this too, or per-client evaluation falls back to one evaluation loop per
        client."""
        if type(self).loss is not ClassificationModule.loss:
            raise NotImplementedError(f"{type(self).__name__} overrides loss() but not sample_loss()")
        return F.cross_entropy(logits, y, reduction="none")

    def per_sample_metrics(self, batch: list[Tensor], prefix: str = "val") -> dict[str, Tensor]:
        """What ``validation_step`` (``prefix="val"``) or ``test_step`` logs, one value per sample: their means over
        any set of samples are what the step logs for it (per-client evaluation batches all clients with it).

        Example:
            >>> from lit_asyncfl.models import LogisticRegression
            >>> m = LogisticRegression(input_dim=2, num_classes=2)
            >>> {k: v.shape for k, v in m.per_sample_metrics([torch.zeros(3, 2), torch.tensor([0, 1, 1])]).items()}
            {'val_loss': torch.Size([3]), 'val_acc': torch.Size([3])}
        """
        x, y = batch
        logits = self(x)
        return {f"{prefix}_loss": self.sample_loss(logits, y), f"{prefix}_acc": (logits.argmax(-1) == y).float()}

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = self.loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def _evaluate(self, batch: list[Tensor], prefix: str) -> None:
        x, y = batch
        logits = self(x)
        self.log(f"{prefix}_loss", self.loss(logits, y), batch_size=len(y))
        acc = multiclass_accuracy(logits, y, num_classes=self.num_classes, average="micro")
        self.log(f"{prefix}_acc", acc, batch_size=len(y))

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)


def feature_size(features: nn.Module, in_channels: int, input_size: int) -> int:
    """Length of the flat features ``features`` (ending in ``nn.Flatten``) makes of one ``input_size`` x
    ``input_size`` image with ``in_channels`` channels: the input width of the classifier after them.

    Example:
        >>> feature_size(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), in_channels=3, input_size=8)
        144
    """
    with torch.no_grad():
        return features(torch.zeros(1, in_channels, input_size, input_size)).shape[1]


_NORM_LAYERS: dict[str, Callable[[int, int], nn.Module]] = {
    "batch": lambda channels, groups: nn.BatchNorm2d(channels),
    "group": lambda channels, groups: nn.GroupNorm(groups, channels),
    "none": lambda channels, groups: nn.Identity(),
}


def norm2d(norm: str, channels: int, groups: int = 8) -> nn.Module:
    """The normalisation layer after a convolution: ``"batch"``, ``"group"`` or ``"none"``.

    ``"group"`` (GroupNorm with ``groups`` groups) keeps no running statistics, so a model using it has no buffers:
    it runs under a batched (vmap) client engine and federated averaging of its parameters is the whole story.

    Args:
        norm: ``"batch"`` (BatchNorm2d), ``"group"`` (GroupNorm) or ``"none"`` (identity).
        channels: Channels of the normalised feature map.
        groups: GroupNorm groups; must divide ``channels`` (used only by ``"group"``).

    Example:
        >>> norm2d("group", 16, groups=8).num_groups
        8
        >>> norm2d("none", 16)
        Identity()
        >>> norm2d("layer", 16)
        Traceback (most recent call last):
        ...
        ValueError: norm must be one of ['batch', 'group', 'none'], got 'layer'
    """
    if norm not in _NORM_LAYERS:
        raise ValueError(f"norm must be one of {sorted(_NORM_LAYERS)}, got {norm!r}")
    check_int("groups", groups, 1)
    if norm == "group" and channels % groups:
        raise ValueError(f"groups must be >= 1 and divide the channel count {channels}, got {groups}")
    return _NORM_LAYERS[norm](channels, groups)
