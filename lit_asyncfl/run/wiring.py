"""Wiring a ``FederatedTrainer``'s run at fit start: the data split into clients, the engine and executor, the
server and the simulator, each checked against the model and the data before anything trains."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import lightning as L
import numpy as np
import torch

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl import namespaces
from lit_asyncfl.checks import check
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import Simulator, sample_profiles
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data.base import FederatedDataModule, PartitionedDataModule
from lit_asyncfl.evaluation import eval_loader
from lit_asyncfl.executors.factory import build_executor
from lit_asyncfl.hparams import run_fingerprint, run_hyperparameters
from lit_asyncfl.loops.contract import (
    check_lightning_contract,
    check_manual_optimization,
    check_model_fits_data,
    evaluation_loaders,
)

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


def build_run(
    trainer: FederatedTrainer, model: L.LightningModule, datamodule: L.LightningDataModule, sequential: Any
) -> Simulator:
    """Check ``model`` and ``datamodule`` and wire the run's simulator for ``trainer`` (its ``datamodule``,
    ``global_model``, ``client_state`` and ``simulator`` are set here); ``sequential`` is the in-process executor's
    class (the trainer's, which tests may replace)."""
    if not isinstance(model, namespaces.classes("LightningModule")):
        raise TypeError(f"model must be a LightningModule, got {type(model).__name__}")
    if not isinstance(datamodule, namespaces.classes("LightningDataModule")):
        raise TypeError(f"datamodule must be a LightningDataModule, got {type(datamodule).__name__}")
    dm = datamodule if isinstance(datamodule, FederatedDataModule) else PartitionedDataModule(datamodule)
    dm.prepare_data()
    dm.setup("fit")
    trainer.datamodule = dm
    dm.check_model(model)
    trainer._user_datamodule = datamodule
    ckpt.check_hparams_loadable(model)
    ckpt.check_hparams_loadable(datamodule)
    check_lightning_contract(model, trainer.engine, datamodule)
    algo = trainer.algorithm
    check_manual_optimization(model, algo.client_callbacks)
    for cb in algo.client_callbacks:
        cb.check_module(model)
    trainer.client_state = None
    if any(cb.uses_client_state for cb in algo.client_callbacks):
        trainer.client_state = ClientStateStore(
            trainer.client_state_budget, directory=lambda: os.path.join(trainer.log_dir, "client_state")
        )
        for cb in algo.client_callbacks:
            if cb.uses_client_state:
                cb.client_state = trainer.client_state
    num_clients, seed, device = trainer.num_clients, trainer.seed, trainer.device
    fraction = max((cb.server_data_fraction for cb in algo.server_callbacks), default=0.0)
    server_set = dm.split_server_data(fraction, seed)  # before the clients' partition
    profiles = sample_profiles(trainer.device_model, num_clients, seed)
    shards = dm.client_shards(num_clients, seed, device, slowness=profiles.time_per_sample)
    for callback in trainer.callbacks:  # e.g. PerClientEvaluation holds each client's evaluation samples out
        shards = callback.setup_client_data(trainer, shards)
    smallest = min(shards.num_samples(c) for c in range(num_clients))
    check(
        not dm.drop_last or smallest >= dm.batch_size,
        f"drop_last=True with batch_size={dm.batch_size}, but a client holds {smallest} samples: its jobs would "
        "take no step; use fewer clients, a smaller batch_size or drop_last=False",
    )
    model.to(device)
    probe_batch = next(iter(shards.batches(0, dm.batch_size, torch.Generator().manual_seed(seed))))
    check_model_fits_data(model, probe_batch, type(datamodule).__name__)
    for cb in algo.client_callbacks:  # what a client callback can only check on a real batch (e.g. MOON's z)
        if callable(getattr(cb, "check_batch", None)):
            cb.check_batch(model, probe_batch)
    trainer.global_model = model
    trainer._flat = flat = FlatParameters(model)
    executor = build_executor(
        trainer.engine,
        model,
        shards,
        dm.batch_size,
        algo.client_callbacks,
        device,
        onednn=trainer.onednn,
        compile_cohort=trainer.compile_cohort,
        sequential=sequential,
        executor=trainer.executor,
        num_threads=trainer.effective_num_threads,
    )
    server = Server(
        flat.read(),
        algo.aggregator,
        algo.server_callbacks,
        num_clients,
        data=None if server_set is None else tuple(t.to(device) for t in server_set.tensors[:2]),
        workspace_factory=lambda: ModelWorkspace(model, device),
        param_numel=flat.param_numel,
    )
    hooks = trainer._hooks
    trainer.simulator = sim = Simulator(
        server=server,
        scheduler=algo.scheduler,
        executor=executor,
        device_model=trainer.device_model,
        num_samples=[shards.num_samples(c) for c in range(num_clients)],
        local_epochs=trainer.local_epochs,
        batch_size=dm.batch_size,
        drop_last=dm.drop_last,
        seed=seed,
        model_bytes=flat.nbytes,
        client_callbacks=algo.client_callbacks,
        profiles=profiles,
        evaluator=hooks.current_metrics,
        observers=[hooks],
        on_client_error=trainer.on_client_error,
        availability=trainer.availability,
        client_state=trainer.client_state,
    )
    check_some_device_comes_online(trainer)
    evaluation = trainer.evaluation
    loaders = evaluation_loaders(model, lambda: eval_loader(dm), evaluation.monitor, algo.scheduler, trainer.callbacks)
    evaluation.setup(model, flat.load, loaders, trainer._wall_seconds, seed)
    trainer._final_state = None
    hooks.setup()
    trainer._fingerprint = run_fingerprint(trainer, model, flat.numel, dm, flat.flat.dtype)
    for callback in trainer.callbacks:  # what they changed in the clients' data (e.g. a held-out split)
        trainer._fingerprint["data"] = {**trainer._fingerprint["data"], **callback.data_fingerprint()}
    trainer._hparams = run_hyperparameters(trainer, trainer._init_args, model, datamodule)
    return sim


def check_some_device_comes_online(trainer: FederatedTrainer) -> None:
    """Refuse an availability under which no update can ever arrive: no device ever online, or none before the
    virtual-time budget (known at fit start; a trace is exact)."""
    availability = trainer.availability
    if availability.always_online:
        return
    first = availability.next_online(np.arange(trainer.num_clients), 0.0)
    name = type(availability).__name__
    check(
        math.isfinite(first),
        f"no device is ever online under the availability {name} (for {trainer.num_clients} clients): no update "
        "can arrive; check the trace or the model's parameters",
    )
    check(
        trainer.max_virtual_time is None or first <= trainer.max_virtual_time,
        f"under the availability {name} the first device comes online at virtual time {first:g}, after "
        f"max_virtual_time={trainer.max_virtual_time!r}: no update can arrive; raise max_virtual_time (or scale the "
        "trace's time_scale)",
    )
