"""A private, flat-bound copy of the user's module to run local training or server-side computations on."""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import torch

from lit_asyncfl.core.flat import FlatParameters


def _no_log(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``LightningModule.log`` outside a Trainer (nothing to log to)."""


class ModelWorkspace:
    """A deep copy of a module, its weights bound to one flat vector, with ``self.log`` silenced.

    Args:
        module: The module to copy.
        device: Where the copy lives.

    Example:
        >>> ws = ModelWorkspace(torch.nn.Linear(3, 2))
        >>> ws.flat.numel
        8
    """

    def __init__(self, module: L.LightningModule | torch.nn.Module, device: torch.device | str = "cpu") -> None:
        self.module = copy.deepcopy(module).to(device)
        self.module.log = _no_log  # type: ignore[method-assign,assignment]
        self.module.log_dict = _no_log  # type: ignore[method-assign,assignment]
        self.flat = FlatParameters(self.module)
