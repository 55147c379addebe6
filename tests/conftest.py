"""Shared fixtures: small, fast federated runs on the bundled digits."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server.base import ServerCallback


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """A simulation must not leave threads behind (an event loop is single-threaded by design)."""
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = [t for t in threading.enumerate() if t.ident not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"leaked threads: {leaked}"


@pytest.fixture
def one_thread():
    """One intra-op thread for tiny models: faster, and it does not fight a busy machine for cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


def assert_same(a, b) -> None:
    """Nested states equal, tensors exactly (NaN equals NaN: the same state)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


def check_determinism_and_exact_resume(
    tmp_path, make, versions, midway, data=None, fractions=(0.55, 0.6, 0.65, 0.7, 0.75), **kwargs
):
    """Two runs of the algorithm ``make()`` give identical weights, and a run stopped between two events where
    ``midway(algorithm)`` holds (state carried over: a half-filled buffer, a cache) resumes from its checkpoint to the
    full run's weights and server stats. Returns ``(full, resumed)`` for a preset's own further checks."""
    data = {"partition": "dirichlet"} if data is None else data
    full = run(tmp_path / "full", make(), max_versions=versions, data_kwargs=data, **kwargs)
    again = run(tmp_path / "again", make(), max_versions=versions, data_kwargs=data, **kwargs)
    assert torch.equal(global_weights(full), global_weights(again))
    first = None
    for fraction in fractions:  # stop between two events with state to carry over
        first = run(tmp_path / f"first{fraction}", make(), max_virtual_time=fraction * full.simulator.now + 0.123,
                    data_kwargs=data, **kwargs)  # fmt: skip
        if midway(first.algorithm):
            break
    assert first is not None and midway(first.algorithm)
    assert 0 < first.simulator.server.version < versions
    ckpt = next((tmp_path / f"first{fraction}").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", make(), max_versions=versions, **kwargs)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(**data), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed.simulator.server.stats == full.simulator.server.stats
    return full, resumed


class RecordsVersions(ServerCallback):
    """A server callback recording every new global version (updates aggregated, weights before and after), for
    tests that replay a run by hand; subclasses record the uploads they need."""

    def __init__(self) -> None:
        self.versions: list[dict] = []

    @property
    def state_key(self) -> str:
        return "test-uploads"

    def on_aggregated(self, server, updates):
        self.versions.append({"count": len(updates), "before": server.previous_weights, "after": server.weights})
