"""Shared fixtures: small, fast federated runs on the bundled digits."""

from __future__ import annotations

import threading

import pytest
import torch

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """A simulation must not leave threads behind (an event loop is single-threaded by design)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"leaked threads: {leaked}"


def make_trainer(tmp_path, algorithm, **kwargs) -> FederatedTrainer:
    """A quiet trainer writing into ``tmp_path``."""
    kwargs.setdefault("num_clients", 10)
    kwargs.setdefault("logger", False)
    kwargs.setdefault("enable_progress_bar", False)
    kwargs.setdefault("print_summary", False)
    kwargs.setdefault("default_root_dir", str(tmp_path))
    return FederatedTrainer(algorithm=algorithm, **kwargs)


def run(tmp_path, algorithm, model_seed: int | None = None, data_kwargs=None, model=None, data=None, **kwargs):
    """Fit a LeNet-5 (or ``model``) on digits (or ``data``) and return the trainer (the model is built after the
    trainer seeded the RNGs)."""
    trainer = make_trainer(tmp_path, algorithm, **kwargs)
    if model is None:
        if model_seed is not None:
            torch.manual_seed(model_seed)
        model = LeNet5(lr=0.05)
    trainer.fit(model, datamodule=data if data is not None else DigitsDataModule(**(data_kwargs or {})))
    return trainer


def global_weights(trainer: FederatedTrainer) -> torch.Tensor:
    assert trainer.simulator is not None
    return trainer.simulator.server.weights
