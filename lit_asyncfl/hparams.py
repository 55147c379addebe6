"""Hyper-parameters of a run: plain descriptions of its parts, logged to every logger and checked on resume."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.engines.base import parse_optimizers
from lit_asyncfl.loops.stand_in import JobTrainer

_SKIP = object()
#: Never part of a configuration: data, modules, and the per-client state store (where state lives, in memory or on
#: disk, never changes a result: ``client_state_budget`` may differ between a checkpoint and its resumption).
_NOT_CONFIGURATION = (torch.Tensor, torch.nn.Module, torch.utils.data.Dataset, L.Trainer, ClientStateStore)


def describe(obj: Any, depth: int = 0) -> Any:
    """A plain, comparable description of a configuration object: its class and public simple attributes.

    Nested components (schedulers, aggregators, callbacks, partitioners, ...) are described recursively; tensors,
    datasets and other heavy or mutable state are left out.

    Example:
        >>> from lit_asyncfl.algorithms import FedAsync
        >>> describe(FedAsync(alpha=0.3))["aggregator"]["alpha"]
        0.3
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (list, tuple)):
        if len(obj) > 64:  # data, not configuration
            return _SKIP
        items = [describe(v, depth + 1) for v in obj]
        return [v for v in items if v is not _SKIP]
    if isinstance(obj, dict):
        if len(obj) > 64 or not all(isinstance(k, str) for k in obj):
            return _SKIP
        items = {k: describe(v, depth + 1) for k, v in obj.items()}
        return {k: v for k, v in items.items() if v is not _SKIP}
    if depth > 4 or not hasattr(obj, "__dict__") or isinstance(obj, _NOT_CONFIGURATION):
        return _SKIP
    out: dict[str, Any] = {"class": type(obj).__qualname__}
    for key, value in vars(obj).items():
        if key.startswith("_") or isinstance(value, set):
            continue
        described = describe(value, depth + 1)
        if described is not _SKIP:
            out[key] = described
    return out


def lightning_hparams(obj: L.LightningModule | L.LightningDataModule) -> dict[str, Any]:
    """A module's or data module's class and ``hparams`` (from ``save_hyperparameters``), described plainly; a
    data module without ``hparams`` is described by its public attributes.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> lightning_hparams(LogisticRegression(input_dim=4, num_classes=2))["input_dim"]
        4
    """
    if obj.hparams:
        params = describe(dict(obj.hparams))
        return {
            "class": f"{type(obj).__module__}.{type(obj).__qualname__}",
            **(params if isinstance(params, dict) else {}),
        }
    described = describe(obj)
    return described if isinstance(described, dict) else {"class": type(obj).__qualname__}


def run_fingerprint(
    trainer: Any, model: L.LightningModule, numel: int, datamodule: L.LightningDataModule, dtype: Any = None
) -> dict[str, Any]:
    """What must not change between a checkpoint and its resumption (budgets, logging, callbacks,
    ``client_state_budget`` and ``on_client_error`` may: see :func:`~lit_asyncfl.checkpoint.run_entries`).

    Args:
        trainer: The :class:`~lit_asyncfl.FederatedTrainer`.
        model: The module (its class, size, dtype and ``hparams`` count).
        numel: Elements of the model's flat weights.
        datamodule: The run's (federated) data module.
        dtype: The dtype of the model's flat weights (a float64 run resumed as float32 would mix both).
    """
    return {
        "algorithm": describe(trainer.algorithm),
        "num_clients": trainer.num_clients,
        "local_epochs": trainer.local_epochs,
        "seed": trainer.seed,
        "device_model": describe(trainer.device_model),
        "availability": describe(trainer.availability),
        "model": {
            "class": type(model).__qualname__,
            "numel": numel,
            "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
            "hparams": describe(dict(model.hparams)),
        },
        "optimizer": optimizer_fingerprint(model, trainer.engine),
        "data": describe(datamodule),
        # what changes float results (thread count and kernels change the order of float sums) or the outcome
        "engine": trainer.engine,
        "num_threads": trainer.job_num_threads,
        "onednn": trainer.onednn,
        "compile_cohort": trainer.compile_cohort,
        "device": str(trainer.device),
    }


def optimizer_fingerprint(model: L.LightningModule, engine: str) -> dict[str, Any]:
    """The optimizer ``configure_optimizers`` makes — its class, every parameter group's hyper-parameters (``lr``,
    ``momentum``, ``weight_decay``, ...) and its schedulers — so that a resume refuses a changed optimizer even
    when the module does not save it in ``hparams``.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> fp = optimizer_fingerprint(LogisticRegression(input_dim=4, lr=0.5), "fast")
        >>> fp["class"], fp["groups"][0]["lr"]
        ('SGD', 0.5)
    """
    attached = model._trainer is not None
    if not attached:
        model._trainer = JobTrainer(engine)
    try:
        optimizer, schedulers = parse_optimizers(model.configure_optimizers())
    except Exception as error:  # the engine's own checks report it; the fingerprint records that it failed
        return {"unavailable": f"{type(error).__name__}: {error}"}
    finally:
        if not attached:
            model._trainer = None
    groups = [
        {k: describe(v) for k, v in group.items() if k != "params" and not isinstance(v, torch.Tensor)}
        for group in optimizer.param_groups
    ]
    return {
        "class": type(optimizer).__qualname__,
        "groups": groups,
        "schedulers": [[type(sched).__qualname__, interval] for sched, interval in schedulers],
    }


def run_hyperparameters(
    trainer: Any, init_args: dict[str, Any], model: L.LightningModule, datamodule: L.LightningDataModule
) -> dict[str, Any]:
    """What a Python-API run logs with ``log_hyperparams``: the model's and data module's ``hparams``, the
    algorithm's hyper-parameters and the trainer's arguments (the CLI logs its whole parsed config instead).

    Args:
        trainer: The :class:`~lit_asyncfl.FederatedTrainer`.
        init_args: The trainer's constructor arguments.
        model: The user's module.
        datamodule: The user's data module.
    """
    algo = trainer.algorithm
    args = {k: v for k, v in init_args.items() if k not in ("algorithm", "logger", "callbacks")}
    return {
        "model": lightning_hparams(model),
        "data": lightning_hparams(datamodule),
        "algorithm": {"class": type(algo).__qualname__, "name": algo.name, **describe(algo.hparams)},
        "trainer": {
            **describe(args),
            "logger": [type(lg).__name__ for lg in trainer.loggers],
            "callbacks": [type(cb).__name__ for cb in trainer.callbacks],
        },
    }
