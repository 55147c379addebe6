"""Local-training engines behind one executor interface, chosen by ``FederatedTrainer(engine=...)``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch

from lit_asyncfl.checks import check, check_int
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.data.shards import ClientShards, DatasetShards
from lit_asyncfl.engines.base import LocalEngine, choose_onednn
from lit_asyncfl.engines.cohort import CohortEngine
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.engines.lightning import LightningEngine
from lit_asyncfl.executors.cohort import CohortExecutor
from lit_asyncfl.executors.ray.executor import RayExecutor
from lit_asyncfl.executors.sequential import SequentialExecutor

#: Engine name -> local trainer class.
ENGINES: dict[str, type] = {"fast": FastEngine, "lightning": LightningEngine, "cohort": CohortEngine}

#: Intra-op threads of each engine when the user sets none. One client update is too small to split over threads:
#: with another busy process on a 2-core machine, 2 threads made the per-client engines 1.8-3.1x slower (issue 8).
#: A cohort gains from a second thread on a quiet machine (LeNet-5, 50 jobs: 1.6-1.9 -> 1.0-1.6 ms per update),
#: but with another busy process on the 2 cores the cohort tests ran 10x slower with 2 threads than with 1: set
#: ``num_threads`` on a machine of your own.
DEFAULT_NUM_THREADS: dict[str, int] = {"fast": 1, "lightning": 1, "cohort": 1}


#: Accepted ``accelerator`` values.
ACCELERATORS = ("cpu", "cuda", "gpu", "auto")


def check_engine(
    engine: str, onednn: bool | None = None, compile_cohort: bool = False, num_threads: int | None = None
) -> None:
    """Raise a ``ValueError`` naming the bad value unless ``engine`` is one of :data:`ENGINES` and its options fit.

    Example:
        >>> check_engine("fast")
        >>> check_engine("slow")
        Traceback (most recent call last):
        ...
        ValueError: unknown engine 'slow'; allowed: ['fast', 'lightning', 'cohort']
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; allowed: {list(ENGINES)}")
    check(onednn is None or isinstance(onednn, bool), f"onednn must be True, False or None, got {onednn!r}")
    check(not compile_cohort or engine == "cohort", f"compile_cohort=True needs engine='cohort', got engine={engine!r}")
    check_int("num_threads", num_threads, 1, optional=True)


def resolve_device(accelerator: str) -> torch.device:
    """The device of an ``accelerator`` name (one of :data:`ACCELERATORS`); CUDA must be available when asked for.

    Example:
        >>> resolve_device("cpu")
        device(type='cpu')
    """
    check(accelerator in ACCELERATORS, f"unknown accelerator {accelerator!r}; allowed: {list(ACCELERATORS)}")
    if accelerator == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if accelerator in ("cuda", "gpu"):
        check(torch.cuda.is_available(), f"accelerator={accelerator!r} but no CUDA device is available; use 'cpu'")
        return torch.device("cuda")
    return torch.device("cpu")


def _probe_batch(shards: ClientShards | DatasetShards, batch_size: int) -> object | None:
    """A first training batch of the largest client (its shape decides the automatic kernel choice)."""
    sizes = [shards.num_samples(c) for c in range(shards.num_clients)]
    if not sizes or max(sizes) == 0:
        return None
    client = max(range(len(sizes)), key=sizes.__getitem__)
    return next(iter(shards.batches(client, batch_size, torch.Generator().manual_seed(0))))


def make_local_trainer(
    engine: str,
    module: L.LightningModule,
    shards: ClientShards | DatasetShards,
    batch_size: int,
    callbacks: Sequence[ClientCallback],
    onednn: bool | None,
    compile_cohort: bool,
    device: torch.device,
) -> Any:
    """The engine's local trainer on ``device`` (the clients' data moved there if need be). Partially applied to
    everything but the device, it is what a Ray worker builds its engine with."""
    extra = {"compile": True} if compile_cohort else {}
    return ENGINES[engine](module, shards.to(device), batch_size, callbacks, device, onednn=onednn, **extra)


def build_executor(
    engine: str,
    *engine_args: Any,
    sequential: Callable[[Any], Any] = SequentialExecutor,
    compile_cohort: bool = False,
    executor: RayExecutor | None = None,
    num_threads: int = 1,
    **engine_kwargs: Any,
) -> Any:
    """The executor computing the clients' updates with the chosen engine.

    Args:
        engine: ``"fast"`` (:class:`~lit_asyncfl.engines.FastEngine`), ``"lightning"``
            (:class:`~lit_asyncfl.engines.LightningEngine`) or ``"cohort"``
            (:class:`~lit_asyncfl.engines.CohortEngine` behind a
            :class:`~lit_asyncfl.executors.CohortExecutor`).
        engine_args: The engine's arguments, positional or by name, as every engine takes them (those of
            :class:`~lit_asyncfl.engines.LocalEngine`: ``module``, ``shards``, ``batch_size``, ``callbacks``,
            ``device``, ``onednn``). Here ``onednn=None`` chooses by :func:`~lit_asyncfl.engines.choose_onednn`
            (off for small convolutions on the CPU); the engine applies the choice (``trainer.onednn``) around each
            job, whatever executor runs it.
        sequential: Builds the executor of the per-client engines from their local trainer (default
            :class:`~lit_asyncfl.executors.SequentialExecutor`); the cohort engine has its own.
        compile_cohort: ``torch.compile`` the cohort engine's batched step (only with ``engine="cohort"``).
        executor: A :class:`~lit_asyncfl.executors.RayExecutor` to start (its workers build the engine);
            ``None``: compute in this process.
        num_threads: The run's intra-op threads (what Ray workers use unless their executor sets its own).

    Example:
        >>> from lit_asyncfl.data import ClientShards
        >>> from lit_asyncfl.models import LogisticRegression
        >>> shards = ClientShards(torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), [[0, 1], [2, 3]])
        >>> type(build_executor("fast", LogisticRegression(input_dim=3), shards, 2)).__name__
        'SequentialExecutor'
    """
    check_engine(engine)
    bound = inspect.signature(LocalEngine).bind(*engine_args, **engine_kwargs)  # (a TypeError names a bad one)
    bound.apply_defaults()
    module, shards, batch_size = bound.arguments["module"], bound.arguments["shards"], bound.arguments["batch_size"]
    callbacks, onednn = bound.arguments["callbacks"], bound.arguments["onednn"]
    device = torch.device(bound.arguments["device"])
    if onednn is None and device.type == "cpu" and engine != "cohort":  # a cohort's batched convolutions are large
        batch = _probe_batch(shards, batch_size)
        if batch is not None:
            onednn = choose_onednn(None, module, batch, device)  # on a copy, self.trainer a fast job's stand-in
    if compile_cohort and engine != "cohort":
        raise ValueError(f"compile_cohort=True needs engine='cohort', got engine={engine!r}")
    make = functools.partial(make_local_trainer, engine, module, shards, batch_size, callbacks, onednn, compile_cohort)
    if executor is not None:
        return executor.start(make, device, callbacks, cohort=engine == "cohort", num_threads=num_threads)
    trainer = make(device)
    return CohortExecutor(trainer) if engine == "cohort" else sequential(trainer)
