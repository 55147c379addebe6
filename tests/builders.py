"""Builders shared by test modules in several folders (``from builders import ...``; ``conftest.py`` holds the small
federated runs): the repository root, client updates built by hand, executors and models that expose hidden state,
dataset files written in their real on-disk formats."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from conftest import RecordsVersions, run
from torch import nn

from lit_asyncfl.algorithms import PRESETS, FedCompass
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.client import ClientCallback, LocalTrainer
from lit_asyncfl.client.sequential import SequentialExecutor
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.models import ClassificationModule
from lit_asyncfl.server.base import ServerCallback

ROOT = Path(__file__).resolve().parents[1]  # the repository: configs/, scripts/, docs/


def make_update(
    client: int,
    weights,
    base,
    base_version: int = 0,
    num_samples: int = 10,
    *,
    num_steps: int = 1,
    job_id: int = 0,
    info: dict | None = None,
) -> ClientUpdate:
    """A client's upload built by hand: ``weights`` trained from ``base`` (lists become tensors, tensors are taken
    as they are), dispatched at time 0 from version ``base_version``."""
    job = ClientJob(job_id, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.as_tensor(weights), torch.as_tensor(base), num_samples, num_steps, 0.0,
                        info=info if info is not None else {})  # fmt: skip


class ReversedExecutor(SequentialExecutor):
    """Computes every pending job at once, newest first, when any update is requested."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.done = {}
        self.compute_order = []

    def result(self, job_id, fresh=None):
        if job_id in self._after:  # computed at its request event (SequentialExecutor.request), at its virtual time
            return super().result(job_id)
        if job_id not in self.done:
            for jid in sorted(self._pending, reverse=True):
                if self._pending[jid][0].request_step is not None:
                    continue  # waits for its request event
                job, start = self._pending.pop(jid)
                self.compute_order.append(jid)
                self.done[jid] = self.trainer.train(job, start)
        return self.done.pop(job_id)


class FailAfterTheMerge(ClientCallback):
    """The jobs ``jobs`` raise at their first local step after their merge (FedASMU's fresh-model merge), wherever
    they train (a worker's copy holds its job's merge too). In the simulation's process it records each dropped job
    (``drops``: job id, virtual time of the drop from ``clock``, the job's request and arrival times)."""

    runs_on_workers = True
    clock = None  # () -> the run's virtual time, set by the test (a class attribute: it stays in this process)

    def __init__(self, jobs=()):
        self.jobs, self.merged, self.drops = set(jobs), set(), []

    def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
        if job.job_id in self.jobs:
            self.merged.add(job.job_id)

    def on_after_backward(self, trainer, job):
        if job.job_id in self.merged:
            raise RuntimeError(f"boom after the merge of job {job.job_id}")

    def on_job_dropped(self, job, reason):
        self.drops.append((job.job_id, FailAfterTheMerge.clock(), job.request_time, job.arrival_time))


class FailInTheMerge(FailAfterTheMerge):
    """The jobs ``jobs`` raise in their merge: in this callback's ``on_fresh_model``, which runs after FedASMU's
    (the merge's learning computed already, not learned yet)."""

    def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
        if job.job_id in self.jobs:
            raise RuntimeError(f"boom in the merge of job {job.job_id}")


class BatchNormNet(ClassificationModule):
    """BatchNorm with cumulative averaging (momentum=None) uses the integer num_batches_tracked buffer, and
    training_step draws from numpy's global generator: both are hidden state outside the weights."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(64, 32),
            torch.nn.BatchNorm1d(32, momentum=None),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 10),
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        noise = torch.from_numpy(np.random.normal(0, 0.01, size=tuple(x.shape)).astype(np.float32))
        return F.cross_entropy(self(x + noise), y)


def make_cifar(root, hundred=False, per_batch=8, n_test=6):
    rng = np.random.default_rng(1)
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True)
    key = "fine_labels" if hundred else "labels"
    classes = 100 if hundred else 10
    names = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    written = {}
    for name in [*names, "test"] if hundred else [*names, "test_batch"]:
        n = n_test if name.startswith("test") else per_batch
        data = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
        labels = list(rng.integers(0, classes, n))
        with open(folder / name, "wb") as fh:
            pickle.dump({"data": data, key: labels, "batch_label": name}, fh)  # CIFAR's own pickle layout
        written[name] = (data, labels)
    return written


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding: a replay by hand sums in another order than the library."""
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


class RecordsUploads(RecordsVersions):
    """Records every accepted upload (in aggregation order: its client, staleness, versions, weights, base, delta
    and weight) and every new global version, for tests that replay a run by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[dict] = []

    def weight_update(self, server, update, weight):
        self.uploads.append({"client": update.client, "staleness": update.staleness,
                             "base_version": update.base_version, "version": server.version,
                             "weights": update.weights, "base": update.base_weights, "delta": update.delta,
                             "weight": weight})  # fmt: skip
        return weight


class JobLog(ServerCallback):
    """Records each accepted upload's job and weights, and which jobs made each version."""

    def __init__(self) -> None:
        self.uploads: dict[int, dict] = {}
        self.versions: list[dict] = []

    @property
    def state_key(self) -> str:
        return "test-job-log"

    def weight_update(self, server, update, weight):
        self.uploads[update.job.job_id] = {"job": update.job, "weights": update.weights, "base": update.base_weights,
                                           "steps": update.num_steps, "client": update.client}  # fmt: skip
        assert weight == 1.0
        return weight

    def on_aggregated(self, server, updates):
        self.versions.append({"jobs": [u.job.job_id for u in updates], "version": server.version - 1,
                              "before": server.previous_weights, "after": server.weights})  # fmt: skip


def compass_run(tmp_path, **kwargs):
    """A small FedCompass run (jobs of different numbers of local steps) recorded by a :class:`JobLog`."""
    algo = FedCompass(q_min=2, q_max=7, latest_time_factor=1.3)
    log = JobLog()
    algo.server_callbacks.append(log)
    kwargs.setdefault("max_versions", 14)
    trainer = run(tmp_path, algo, num_clients=6, data_kwargs={"partition": "dirichlet"}, **kwargs)
    return trainer, log


def make_job(job_id: int = 0, client: int = 0) -> ClientJob:
    """A job dispatched at time 0 from version 0 (seed 7, one local epoch), for local training by hand."""
    return ClientJob(job_id, client, 0, 0.0, JobTiming(0, 1, 0), seed=7, local_epochs=1)


def one_client_trainer(module, callbacks, x, y, batch_size):
    """A local trainer whose one client holds all of ``x, y``."""
    shards = ClientShards(x, y, [torch.arange(len(x))])
    return LocalTrainer(module, shards, batch_size=batch_size, callbacks=callbacks)


class Diverging(ClassificationModule):
    """A two-layer classifier whose loss is multiplied by ``scale`` (``inf``: the job diverges to NaN weights)."""

    scale = 1.0

    def __init__(self) -> None:
        super().__init__(num_classes=2, lr=0.1)
        self.net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * type(self).scale


def recorded_run(tmp_path, algorithm, **kwargs) -> RecordsUploads:
    """A run on 8 clients (Dirichlet partition unless ``data_kwargs``) with every upload and version recorded; the
    algorithm's own callbacks leave every weight at 1."""
    record = RecordsUploads()
    algorithm.server_callbacks.append(record)
    kwargs.setdefault("data_kwargs", {"partition": "dirichlet"})
    run(tmp_path, algorithm, num_clients=8, **kwargs)
    assert record.versions and all(u["weight"] == 1.0 for u in record.uploads)
    return record


class DoubleClientZero(ServerCallback):
    """Doubles client 0's aggregation weight."""

    def weight_update(self, server, update, weight):
        return weight * (2.0 if update.client == 0 else 1.0)


class RecordsArrivals(RecordsVersions):
    """Put first among the callbacks: records every arrival (accepted or not) and every new version."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[dict] = []

    def reject_update(self, server, update):
        self.arrivals.append({"client": update.client, "staleness": update.staleness, "weights": update.weights,
                              "base": update.base_weights, "base_version": update.base_version,
                              "global": server.weights, "n": update.num_samples, "info": dict(update.info),
                              "dispatch_time": update.job.dispatch_time, "arrival_time": server.now,
                              "accepted": False})  # fmt: skip
        return None

    def weight_update(self, server, update, weight):
        assert weight == 1.0 and self.arrivals[-1]["weights"] is update.weights
        self.arrivals[-1]["accepted"] = True
        return weight


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """An independent cosine: dot over the product of norms, in float64."""
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


def check_config_runs(tmp_path, name: str, overrides: list[str]) -> None:
    """``configs/<name>.yaml`` parses into its preset, every setting it gives that ``overrides`` leaves alone reaches
    the preset's hyper-parameters, and the config runs 3 versions on 12 clients with a finite accuracy."""
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", "--trainer.eval_every=3", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false", *overrides]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    changed = {o.split("=")[0].rsplit(".", 1)[1] for o in overrides}
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key not in changed:
            assert algorithm.hparams[key] == value, key
    summary = cli.trainer.summary
    assert summary["versions"] == 3 and summary["stop_reason"] == "max_versions"
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0
