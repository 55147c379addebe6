"""A private, flat-bound copy of the user's module to run local training or server-side computations on."""

from __future__ import annotations

import contextlib
import copy
import io
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch

from lit_asyncfl.core.flat import FlatParameters


def _no_log(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``LightningModule.log`` outside a Trainer (nothing to log to)."""


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """Around a fit-start probe of user code (one ``training_step`` on a copy of the module): what it prints or
    warns goes nowhere and its draws from torch's generator leave no trace, so a module that counts its steps in its own
    state, logs or prints sees exactly the steps of its client jobs (as under ``lightning.Trainer``, which runs no
    probe). The copy keeps the module's own state apart; a counter outside the module (a global) is not hidden.

    Example:
        >>> with unseen():
        ...     print("not shown")
    """
    with (
        torch.random.fork_rng(devices=[]),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(record=True),  # recorded and dropped; the registry is reset on exit, so a job
    ):  # shows the warnings of its own steps as under lightning.Trainer
        warnings.simplefilter("always")
        yield


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
