"""Linear models: least-squares regression and a multi-class linear SVM."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.regression import R2Score

from lit_asyncfl.checks import check_int, check_number
from lit_asyncfl.models.base import LR, WEIGHT_DECAY, ClassificationModule


class _R2Score(R2Score):
    """``R2Score`` that yields NaN instead of raising when fewer than two samples were seen."""

    def compute(self) -> Tensor:
        if self.total < 2:
            return torch.tensor(float("nan"), device=self.total.device)
        return super().compute()


class LinearRegression(L.LightningModule):
    """Least-squares linear regression ``y = w . x + b`` on flattened inputs, trained by SGD on the MSE.

    ``forward`` returns predictions of shape ``(batch,)``; targets are float tensors of shape ``(batch,)``.
    ``validation_step``/``test_step`` log ``{prefix}_loss`` (MSE) and ``{prefix}_mae``, both batch means that the
    evaluation averages weighted by batch size, and ``{prefix}_r2``, a torchmetrics ``R2Score`` object accumulated
    over the whole evaluation set and computed once at its end (a per-batch R^2 averaged over batches would be
    wrong, and undefined for a batch of one sample). The R^2 is NaN if the set has fewer than two samples.

    Args:
        input_dim: Number of input features after flattening.
        lr: Local SGD learning rate.
        weight_decay: L2 penalty (ridge regression).

    Example:
        >>> model = LinearRegression(input_dim=13)
        >>> model(torch.zeros(4, 13)).shape
        torch.Size([4])
    """

    def __init__(self, input_dim: int, lr: float = LR, weight_decay: float = WEIGHT_DECAY) -> None:
        super().__init__()
        check_int("input_dim", input_dim, 1)
        check_number("lr", lr, 0, open_min=True)
        check_number("weight_decay", weight_decay, 0)
        self.save_hyperparameters()
        self.lr = lr
        self.weight_decay = weight_decay
        self.linear = nn.Linear(input_dim, 1)
        self.val_r2 = _R2Score()
        self.test_r2 = _R2Score()

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.flatten(1)).squeeze(-1)

    def training_step(self, batch: list[Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        pred = self(x)
        loss = F.mse_loss(pred, y.reshape(pred.shape).to(pred.dtype))
        self.log("train_loss", loss)
        return loss

    def _evaluate(self, batch: list[Tensor], prefix: str) -> None:
        x, y = batch
        pred = self(x)
        y = y.reshape(pred.shape).to(pred.dtype)
        self.log(f"{prefix}_loss", F.mse_loss(pred, y), batch_size=len(y))
        self.log(f"{prefix}_mae", F.l1_loss(pred, y), batch_size=len(y))
        r2: R2Score = getattr(self, f"{prefix}_r2")
        r2.update(pred, y)
        self.log(f"{prefix}_r2", r2, batch_size=len(y))

    def validation_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: list[Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


class LinearSVM(ClassificationModule):
    r"""A linear classifier on flattened inputs trained with the multi-class hinge loss.

    The loss is :func:`torch.nn.functional.multi_margin_loss` (the Weston-Watkins multi-class hinge, averaged over
    classes):

    .. math:: \ell(s, y) = \frac{1}{C} \sum_{i \ne y} \max(0, \text{margin} - s_y + s_i)

    For two classes with ``f = s_1 - s_0`` and ``t = +1/-1`` for class 1/0 this is ``max(0, margin - t f) / 2``,
    the classic hinge loss (halved). ``weight_decay`` is the SVM's L2 regulariser (applied to the bias too).
    Evaluation logs ``{prefix}_loss`` (hinge) and ``{prefix}_acc`` as every :class:`ClassificationModule`.

    Args:
        input_dim: Number of input features after flattening.
        num_classes: Number of classes.
        lr: Local SGD learning rate.
        weight_decay: L2 penalty.
        margin: Hinge margin, > 0.

    Example:
        >>> svm = LinearSVM(input_dim=2)
        >>> svm.loss(torch.tensor([[0.0, 2.0], [0.5, 0.0]]), torch.tensor([1, 1]))
        tensor(0.3750)
    """

    def __init__(
        self,
        input_dim: int,
        num_classes: int = 2,
        lr: float = LR,
        weight_decay: float = WEIGHT_DECAY,
        margin: float = 1.0,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, weight_decay=weight_decay)
        check_int("input_dim", input_dim, 1)
        check_number("margin", margin, 0, open_min=True)
        self.save_hyperparameters()
        self.margin = margin
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(input_dim, num_classes))

    def loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """The multi-class hinge loss (``multi_margin_loss`` with ``margin``), averaged over the batch."""
        return F.multi_margin_loss(logits, y, margin=self.margin)

    def sample_loss(self, logits: Tensor, y: Tensor) -> Tensor:
        """The hinge loss of each sample (its mean is :meth:`loss`)."""
        return F.multi_margin_loss(logits, y, margin=self.margin, reduction="none")
