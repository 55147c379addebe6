"""The Ray executor's workers: the actor that trains jobs, the pool of idle workers kept between runs, and the torch
settings a worker takes over from the simulation's process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.executors.ray.wire import _portable, _Wire


def ray_available() -> bool:
    """Whether Ray can be imported (the ``ray`` extra: ``pip install 'lit-asyncfl[ray]'``)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "executor='ray' needs Ray: pip install 'lit-asyncfl[ray]' (or pip install 'ray>=2.9'); "
            "executor='sequential' needs nothing more"
        ) from error
    return ray


#: Idle workers kept for the next run of this process, per (Ray job, CPUs, GPUs) (see ``reuse_workers``).
_IDLE: dict[tuple[str, float, float], list[Any]] = {}


def release_workers() -> None:
    """End the idle Ray workers that runs of this process kept for later runs (their CPUs and GPUs return to Ray)."""
    ray = _import_ray()
    for workers in _IDLE.values():
        for worker in workers:
            try:
                ray.kill(worker)
            except Exception:  # pragma: no cover (already gone)
                pass
    _IDLE.clear()


class _Worker:
    """A Ray actor: builds a run's engine once (the module copy and every client's data stay resident) and trains
    the jobs sent to it."""

    def __init__(self) -> None:
        self.trainer: Any = None

    def load(
        self, make_trainer: Callable[[torch.device], Any], device: str, num_threads: int, settings: dict[str, Any]
    ) -> None:
        torch.set_num_threads(num_threads)
        _apply_torch_settings(settings)
        self.trainer = None  # the previous run's engine goes first
        self.trainer = make_trainer(torch.device(device))

    def unload(self) -> None:
        self.trainer = None  # an idle worker keeps no run's model or data

    def train(self, job: ClientJob, start: _Wire) -> tuple[tuple[ClientUpdate, _Wire], float]:
        began = time.perf_counter()
        update = _portable(self.trainer.train(job, start.tensor(), None))
        return update, time.perf_counter() - began

    def train_many(self, jobs: list[ClientJob], *starts: _Wire) -> tuple[list[tuple[ClientUpdate, _Wire]], float]:
        # (the start models come as separate arguments: Ray resolves object references only at the top level)
        began = time.perf_counter()
        updates = [_portable(u) for u in self.trainer.train_many(jobs, [s.tensor() for s in starts])]
        return updates, time.perf_counter() - began

    def where(self) -> tuple[str, int]:
        """The worker's Ray node and process id."""
        import os

        import ray

        return ray.get_runtime_context().get_node_id(), os.getpid()


def _torch_settings() -> dict[str, Any]:
    """The process-wide torch settings that change what a job computes, as this process has them (a worker takes
    them over, so that a job trains as it would here)."""
    return {
        "default_dtype": torch.get_default_dtype(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "mkldnn_enabled": torch.backends.mkldnn.enabled,
    }


def _apply_torch_settings(settings: dict[str, Any]) -> None:
    torch.set_default_dtype(settings["default_dtype"])
    torch.use_deterministic_algorithms(
        settings["deterministic_algorithms"], warn_only=settings["deterministic_warn_only"]
    )
    torch.set_float32_matmul_precision(settings["float32_matmul_precision"])
    torch.backends.cudnn.deterministic = settings["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = settings["cudnn_benchmark"]
    torch.backends.cuda.matmul.allow_tf32 = settings["cuda_matmul_allow_tf32"]
    torch.backends.cudnn.allow_tf32 = settings["cudnn_allow_tf32"]
    torch.backends.mkldnn.enabled = settings["mkldnn_enabled"]
