"""Batched image transforms on resident tensors: normalisation and CIFAR-style augmentation.

They work on a whole client batch at once (no ``DataLoader`` per client) and draw their randomness from the
job's ``torch.Generator``, so a run with augmentation is as reproducible as one without.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def normalize(images: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``uint8`` (or [0, 255] float) images ``(N, C, H, W)`` to float32, standardised per channel.

    Example:
        >>> normalize(torch.full((1, 1, 2, 2), 255, dtype=torch.uint8), mean=(0.5,), std=(0.5,)).flatten().tolist()
        [1.0, 1.0, 1.0, 1.0]
    """
    x = images.float().div_(255.0)
    m = torch.tensor(mean, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    return (x - m) / s


def random_crop_flip(images: Tensor, padding: int, generator: torch.Generator, flip: bool = True) -> Tensor:
    """Random crop after zero padding by ``padding`` pixels, then a horizontal flip with probability 1/2, per image.

    The standard CIFAR augmentation (``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()``), applied to a batch
    ``(N, C, H, W)`` of any dtype with one ``gather``; offsets and flips are drawn from ``generator`` (on the CPU;
    the flip draws are made even with ``flip=False``, so switching it does not move other random streams).

    Example:
        >>> x = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4)
        >>> out = random_crop_flip(x, padding=0, generator=torch.Generator().manual_seed(0))
        >>> out.shape, sorted(out.flatten().tolist()) == list(range(16))
        (torch.Size([1, 1, 4, 4]), True)
    """
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    n, c, h, w = images.shape
    offsets = torch.randint(0, 2 * padding + 1, (2, n), generator=generator).to(images.device)
    flips = (torch.rand(n, generator=generator) < 0.5).to(images.device) & flip
    padded = F.pad(images, (padding,) * 4) if padding else images
    width = w + 2 * padding
    rows = offsets[0, :, None] + torch.arange(h, device=images.device)  # (n, h)
    cols = offsets[1, :, None] + torch.arange(w, device=images.device)  # (n, w)
    cols = torch.where(flips[:, None], cols.flip(-1), cols)
    flat = (rows[:, :, None] * width + cols[:, None, :]).view(n, 1, h * w).expand(n, c, h * w)
    return padded.reshape(n, c, -1).gather(2, flat).view(n, c, h, w)
