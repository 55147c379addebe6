"""The convolutional sentence classifier of Kim (2014)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lit_asyncfl.checks import check, check_int, check_number, is_int
from lit_asyncfl.models.base import LR, MOMENTUM, WEIGHT_DECAY, ClassificationModule


class TextCNN(ClassificationModule):
    """TextCNN (Kim, 2014): embeddings, parallel 1-D convolutions, ReLU, max-over-time pooling, dropout, linear.

    The input is a ``LongTensor`` of token ids of shape ``(batch, length)``, with ``padding_idx`` marking padding
    (its embedding is the zero vector and gets no gradient). One convolution per kernel size with ``num_filters``
    filters runs over the embedded sequence; each feature map is max-pooled over time and the concatenation
    (``num_filters * len(kernel_sizes)`` features) goes through dropout to the linear classifier. Sequences shorter
    than the largest kernel are right-padded with ``padding_idx`` inside ``forward``, so any length >= 1 works.
    Embeddings are randomly initialised and trained (Kim's CNN-rand).

    Args:
        vocab_size: Number of token ids (ids are in ``[0, vocab_size)``).
        embed_dim: Embedding size.
        num_filters: Filters per kernel size.
        kernel_sizes: Convolution widths, in tokens.
        dropout: Dropout probability before the classifier.
        padding_idx: Token id of padding, in ``[0, vocab_size)``.
        num_classes: Number of classes.
        lr, momentum, weight_decay: Local SGD's (:class:`~lit_asyncfl.models.ClassificationModule`'s arguments).

    Example:
        >>> model = TextCNN(vocab_size=100, embed_dim=16, num_filters=8)
        >>> model(torch.randint(1, 100, (4, 20))).shape
        torch.Size([4, 2])
        >>> model(torch.tensor([[5, 7]])).shape
        torch.Size([1, 2])
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int = 128,
        num_filters: int = 100,
        kernel_sizes: Sequence[int] = (3, 4, 5),
        dropout: float = 0.5,
        padding_idx: int = 0,
        num_classes: int = 2,
        lr: float = LR,
        momentum: float = MOMENTUM,
        weight_decay: float = WEIGHT_DECAY,
    ) -> None:
        super().__init__(num_classes=num_classes, lr=lr, momentum=momentum, weight_decay=weight_decay)
        check_int("vocab_size", vocab_size, 1)
        check_int("embed_dim", embed_dim, 1)
        check_int("num_filters", num_filters, 1)
        check(
            isinstance(kernel_sizes, Sequence)
            and len(kernel_sizes) > 0
            and all(is_int(k) and k >= 1 for k in kernel_sizes),
            "kernel_sizes must be a non-empty sequence of integers >= 1, got "
            f"{list(kernel_sizes) if isinstance(kernel_sizes, Sequence) else kernel_sizes!r}",
        )
        check_number("dropout", dropout, 0, 1, open_max=True)
        check_int("padding_idx", padding_idx, 0)
        if not 0 <= padding_idx < vocab_size:
            raise ValueError(f"padding_idx must be in [0, vocab_size={vocab_size}), got {padding_idx}")
        self.save_hyperparameters()
        self.padding_idx = padding_idx
        self.max_kernel = max(kernel_sizes)
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, num_filters, k) for k in kernel_sizes)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(num_filters * len(kernel_sizes), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.representation(x))

    def representation(self, x: Tensor) -> Tensor:
        """The pooled convolution features the classifier ``head`` reads (after dropout)."""
        if x.dim() != 2:
            raise ValueError(f"TextCNN expects token ids of shape (batch, length), got shape {tuple(x.shape)}")
        if x.shape[1] < self.max_kernel:
            x = F.pad(x, (0, self.max_kernel - x.shape[1]), value=self.padding_idx)
        emb = self.embedding(x).transpose(1, 2)  # (batch, embed_dim, length)
        pooled = [F.relu(conv(emb)).amax(dim=2) for conv in self.convs]
        return self.dropout(torch.cat(pooled, dim=1))
