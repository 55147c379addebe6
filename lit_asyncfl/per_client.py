"""Per-client evaluation: each client's held-out samples, the global (or a fine-tuned) model's metric on each, and
the statistics over clients that the personalized-FL literature reports (mean, weighted mean, spread, tails).

The run callback :class:`~lit_asyncfl.callbacks.PerClientEvaluation` puts these together; this module holds the
pieces: :func:`hold_out` (the split), :func:`client_statistics` (the formulas), :class:`ClientEvaluator` (batched
evaluation over every client at once, or per client where the metric does not decompose per sample, and the
personalized evaluation after ``k`` fine-tuning steps). See ``docs/per_client.md``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate

from lit_asyncfl.core.update import ClientJob, JobTiming, derive_seed
from lit_asyncfl.core.workspace import ModelWorkspace
from lit_asyncfl.data.shards import ClientShards, DatasetShards, steps_per_epoch
from lit_asyncfl.engines.base import generators_kept
from lit_asyncfl.loops.validation_loop import run_evaluation

__all__ = [
    "ClientEvaluator",
    "client_statistics",
    "hold_out",
    "personalization_job",
    "personalization_seed",
    "with_indices",
]

#: Statistics of :func:`client_statistics`, in the order rows and the summary list them.
STATISTICS = ("mean", "weighted", "std", "worst10", "best10", "p10", "p25", "p50", "p75", "p90")
#: The statistics the summary keeps (the percentiles are for the plot and the history).
SUMMARY_STATISTICS = ("mean", "weighted", "std", "worst10", "best10")


def hold_out(indices: Sequence[np.ndarray], fraction: float, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    r"""Split each client's samples into the ones it trains on and the ones held out to evaluate it.

    Client :math:`i` with :math:`n_i` samples holds out :math:`h_i = \min(n_i - 1, \max(1, \lfloor f n_i + 1/2
    \rfloor))` of them, drawn uniformly without replacement from one generator seeded by the run ``seed`` (its own
    stream, clients in order), so the split is the same in every run with that seed and moves no other draw. A
    client needs two samples (one to train on, one to hold out).

    Args:
        indices: Each client's sample indices (its whole shard).
        fraction: :math:`f \in (0, 1)`.
        seed: The run seed.

    Returns:
        The training indices and the held-out indices of every client (each sorted).

    Example:
        >>> train, held = hold_out([np.arange(10), np.arange(10, 13)], 0.2, seed=0)
        >>> [len(t) for t in train], [len(h) for h in held]
        ([8, 2], [2, 1])
    """
    rng = np.random.default_rng([seed, 0xC11E47])
    train, held = [], []
    for client, idx in enumerate(indices):
        idx = np.asarray(idx, dtype=np.int64)
        n = len(idx)
        if n < 2:
            raise ValueError(
                f"client {client} holds {n} sample(s): it cannot both train and hold one out for its evaluation; use "
                "fewer clients, a partition that gives every client at least 2 samples (e.g. Dirichlet(min_samples=2)) "
                "or no per-client evaluation"
            )
        k = min(n - 1, max(1, math.floor(fraction * n + 0.5)))
        order = rng.permutation(n)
        held.append(np.sort(idx[order[:k]]))
        train.append(np.sort(idx[order[k:]]))
    return train, held


def with_indices(shards: ClientShards | DatasetShards, indices: Sequence[np.ndarray]) -> ClientShards | DatasetShards:
    """The same data and settings as ``shards`` (a shallow copy: every attribute, e.g. ``shuffle`` and
    ``drop_last``, carries over), each client holding ``indices`` instead.

    Example:
        >>> shards = ClientShards(torch.zeros(4, 1), torch.arange(4), [np.array([0, 1]), np.array([2, 3])],
        ...                       shuffle=False)
        >>> narrowed = with_indices(shards, [np.array([0]), np.array([2, 3])])
        >>> narrowed.num_samples(0), narrowed.shuffle
        (1, False)
    """
    narrowed = copy.copy(shards)  # every setting carries over (shuffle, drop_last, transform, ...)
    if isinstance(shards, ClientShards):
        narrowed.indices = [torch.as_tensor(np.asarray(i, dtype=np.int64), device=shards.device) for i in indices]
        narrowed._sizes = np.array([len(i) for i in indices], dtype=np.int64)
    else:
        narrowed.indices = [np.asarray(i, dtype=np.int64) for i in indices]
    return narrowed


def _tail_mean(sorted_values: np.ndarray, fraction: float, worst_first: bool) -> float:
    count = max(1, math.ceil(fraction * len(sorted_values)))
    part = sorted_values[:count] if worst_first else sorted_values[-count:]
    return float(part.mean())


def client_statistics(
    values: np.ndarray, weights: np.ndarray, target: float, mode: str = "max", prefix: str = "client"
) -> dict[str, float | int]:
    r"""The statistics over clients of one metric :math:`a_i` (e.g. accuracy) of :math:`K` clients with
    :math:`n_i` evaluation samples each.

    - ``{prefix}_acc_mean`` :math:`= \frac1K \sum_i a_i` (each client counts once);
    - ``{prefix}_acc_weighted`` :math:`= \sum_i n_i a_i / \sum_i n_i` (each sample counts once: the pooled metric);
    - ``{prefix}_acc_std`` :math:`= \sqrt{\frac1K \sum_i (a_i - \bar a)^2}` (population standard deviation);
    - ``{prefix}_acc_worst10`` / ``_best10``: the mean of the :math:`\lceil K/10 \rceil` worst / best :math:`a_i`
      (lowest / highest for ``mode="max"``; the reverse for ``"min"``), as q-FFL and Ditto report them;
    - ``{prefix}_acc_p10`` ... ``_p90``: percentiles of :math:`a_i` (NumPy's linear interpolation);
    - ``{prefix}_reaching_target`` :math:`= |\{i : a_i \ge \text{target}\}|` (:math:`\le` for ``mode="min"``);
    - ``clients_evaluated`` :math:`= K`.

    Example:
        >>> stats = client_statistics(np.array([0.5, 1.0, 0.75]), np.array([2, 2, 4]), target=0.7)
        >>> stats["client_acc_mean"], stats["client_acc_weighted"], stats["client_acc_worst10"]
        (0.75, 0.75, 0.5)
        >>> stats["client_reaching_target"], stats["clients_evaluated"]
        (2, 3)
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    ascending = np.sort(values)
    worst_first = mode == "max"
    percentiles = np.percentile(values, [10, 25, 50, 75, 90])
    reached = values >= target if mode == "max" else values <= target
    out: dict[str, float | int] = {
        f"{prefix}_acc_mean": float(values.mean()),
        f"{prefix}_acc_weighted": float((weights * values).sum() / weights.sum()),
        f"{prefix}_acc_std": float(values.std()),
        f"{prefix}_acc_worst10": _tail_mean(ascending, 0.1, worst_first),
        f"{prefix}_acc_best10": _tail_mean(ascending, 0.1, not worst_first),
    }
    out.update({f"{prefix}_acc_p{q}": float(v) for q, v in zip((10, 25, 50, 75, 90), percentiles)})
    out[f"{prefix}_reaching_target"] = int(reached.sum())
    out["clients_evaluated"] = len(values)
    return out


class ClientEvaluator:
    """Evaluates one set of weights (or each client's own, fine-tuned) on every client's held-out samples.

    **Batched** when the module's validation metrics decompose per sample: the module has a
    ``per_sample_metrics(batch, prefix)`` method returning, for each metric its ``validation_step`` logs, one value
    per sample whose batch-size-weighted mean is what it logs (:class:`~lit_asyncfl.models.ClassificationModule`
    has one). The held-out samples of
    all clients are concatenated into batches of ``batch_size`` and each sample's values are summed into its
    client's: one forward pass per large batch whatever the number of clients. **Otherwise** each client's samples
    go through Lightning's evaluation loop (:func:`~lit_asyncfl.loops.run_evaluation`, the module's own
    ``validation_step``) on their own: exact for any metric, one loop per client.

    Args:
        module: The user's module (a private copy is evaluated).
        shards: The clients' *training* shards (the data the held-out samples are read from: the same tensors or
            dataset).
        held_out: Each client's held-out sample indices.
        prepare: Turns stored inputs into model inputs (the data module's ``prepare_inputs``; no augmentation).
        batch_size: Samples per evaluation batch.
        device: Where the evaluation runs.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> x, y = torch.randn(12, 4), torch.arange(12) % 2
        >>> train, held = hold_out([np.arange(6), np.arange(6, 12)], 0.5, seed=0)
        >>> evaluator = ClientEvaluator(LogisticRegression(input_dim=4, num_classes=2), ClientShards(x, y, train),
        ...                             held, lambda v: v, batch_size=512, device=torch.device("cpu"))
        >>> values = evaluator.evaluate(evaluator.workspace.flat.read(), np.array([0, 1]))
        >>> sorted(values), values["val_acc"].shape
        (['val_acc', 'val_loss'], (2,))
    """

    def __init__(
        self,
        module: L.LightningModule,
        shards: ClientShards | DatasetShards,
        held_out: Sequence[np.ndarray],
        prepare: Any,
        batch_size: int,
        device: torch.device,
    ) -> None:
        self.workspace = ModelWorkspace(module, device)
        self.module = self.workspace.module
        self.shards = shards
        self.held_out = [np.asarray(h, dtype=np.int64) for h in held_out]
        self.sizes = np.array([len(h) for h in self.held_out], dtype=np.int64)
        self.prepare = prepare
        self.batch_size = batch_size
        self.device = device
        self.decomposes = callable(getattr(self.module, "per_sample_metrics", None))

    # -- data ---------------------------------------------------------------------------------------------------
    def _batch(self, idx: np.ndarray) -> Any:
        shards = self.shards
        if isinstance(shards, ClientShards):
            where = torch.as_tensor(idx, device=shards.device)
            inputs = shards.inputs[where]
            return [inputs if shards.transform is None else self.prepare(inputs), shards.targets[where]]
        collate = shards.collate_fn if shards.collate_fn is not None else default_collate
        batch = collate([shards.dataset[int(i)] for i in idx])
        if shards.transform is not None:
            batch = [self.prepare(batch[0]), *batch[1:]]
        return batch

    def _chunks(self, idx: np.ndarray) -> Iterator[Any]:
        for start in range(0, len(idx), self.batch_size):
            yield self._batch(idx[start : start + self.batch_size])

    def _transfer(self, batch: Any) -> Any:
        module = self.module
        batch = module.on_before_batch_transfer(batch, 0)
        batch = module.transfer_batch_to_device(batch, module.device, 0)
        return module.on_after_batch_transfer(batch, 0)

    def _sample_metrics(self, batch: Any) -> dict[str, Tensor]:
        return self.module.per_sample_metrics(batch, "val")

    # -- evaluation ---------------------------------------------------------------------------------------------
    def check_decomposes(self, client: int, monitor: str | None) -> bool:
        """Whether the per-sample metrics agree with what ``validation_step`` logs on ``client``'s held-out samples
        (the monitored metric among them, every per-sample metric within float32 rounding of the logged one); if
        not, evaluation falls back to one evaluation loop per client from then on. Checked once, at the first
        per-client evaluation, on the weights loaded."""
        if not self.decomposes:
            return False
        try:
            batched = {name: float(v[0]) for name, v in self._batched(np.array([client])).items()}
        except NotImplementedError:  # e.g. a ClassificationModule with its own loss() and no sample_loss()
            self.decomposes = False
            return False
        logged = run_evaluation(self.module, [list(self._chunks(self.held_out[client]))], "val")[0]
        self.decomposes = (monitor is None or monitor in batched) and all(
            name in logged and math.isclose(value, logged[name], rel_tol=1e-5, abs_tol=1e-6)
            for name, value in batched.items()
        )
        return self.decomposes

    def evaluate(self, weights: Tensor, clients: np.ndarray) -> dict[str, np.ndarray]:
        """Each metric's value on each of ``clients`` (in that order) for the global ``weights``."""
        self.workspace.flat.load(weights)
        return self._batched(clients) if self.decomposes else self._per_client(clients)

    @torch.no_grad()
    def _batched(self, clients: np.ndarray) -> dict[str, np.ndarray]:
        module = self.module
        idx = np.concatenate([self.held_out[c] for c in clients])
        owner = torch.as_tensor(np.repeat(np.arange(len(clients)), self.sizes[clients]), device=self.device)
        sums: dict[str, Tensor] = {}
        was_training = module.training
        module.eval()
        try:
            for start in range(0, len(idx), self.batch_size):
                batch = self._transfer(self._batch(idx[start : start + self.batch_size]))
                who = owner[start : start + self.batch_size]
                for name, values in self._sample_metrics(batch).items():
                    if name not in sums:
                        sums[name] = torch.zeros(len(clients), dtype=torch.float64, device=self.device)
                    sums[name].index_add_(0, who, values.detach().reshape(-1).double())
        finally:
            module.train(was_training)
        counts = self.sizes[clients].astype(np.float64)
        return {name: total.cpu().numpy() / counts for name, total in sums.items()}

    def _per_client(self, clients: np.ndarray) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for position, client in enumerate(clients):
            for name, value in self._evaluate_one(int(client)).items():
                if name not in out:
                    out[name] = np.full(len(clients), np.nan)
                out[name][position] = value
        return out

    def _evaluate_one(self, client: int) -> dict[str, float]:
        """The metrics of the loaded weights on one client's held-out samples."""
        if self.decomposes:
            return {name: float(v[0]) for name, v in self._batched(np.array([client])).items()}
        batches = list(self._chunks(self.held_out[client]))
        return run_evaluation(self.module, [batches], "val")[0]

    def evaluate_each(self, weights_of: Any, clients: np.ndarray) -> dict[str, np.ndarray]:
        """Each metric on each of ``clients`` for that client's own weights ``weights_of(client)`` (e.g. its
        personal model), one client at a time."""
        out: dict[str, np.ndarray] = {}
        for position, client in enumerate(clients):
            self.workspace.flat.load(weights_of(int(client)))
            for name, value in self._evaluate_one(int(client)).items():
                if name not in out:
                    out[name] = np.full(len(clients), np.nan)
                out[name][position] = value
        return out

    def personalized(
        self, engine: Any, weights: Tensor, clients: np.ndarray, steps: int, seed: int, version: int, now: float
    ) -> dict[str, np.ndarray]:
        """Each metric on each of ``clients`` after ``steps`` local fine-tuning steps from ``weights``, trained by
        ``engine`` (a :class:`~lit_asyncfl.engines.LocalTrainer` without client callbacks) exactly as it trains a
        job: the client's own training batches, drawn from the seed :func:`personalization_seed` gives."""
        out: dict[str, np.ndarray] = {}
        shards = engine.shards
        for position, client in enumerate(clients):
            client = int(client)
            job = personalization_job(client, steps, seed, version, now, shards, engine.batch_size)
            with generators_kept(self.device):
                tuned = engine.train(job, weights).weights
            self.workspace.flat.load(tuned)
            for name, value in self._evaluate_one(client).items():
                if name not in out:
                    out[name] = np.full(len(clients), np.nan)
                out[name][position] = value
        return out


def personalization_seed(seed: int, version: int, client: int) -> int:
    """The seed of a client's fine-tuning job at an evaluation of ``version`` (its batch order, dropout)."""
    return derive_seed(seed, 0x9E25, version, client)


def personalization_job(
    client: int, steps: int, seed: int, version: int, now: float, shards: Any, batch_size: int
) -> ClientJob:
    """The job of ``steps`` fine-tuning steps of ``client`` (epochs begun: as many as the steps need)."""
    per_epoch = max(1, steps_per_epoch(shards.num_samples(client), batch_size, shards.drop_last))
    return ClientJob(
        job_id=-1,
        client=client,
        base_version=version,
        dispatch_time=now,
        timing=JobTiming(0.0, 0.0, 0.0),
        seed=personalization_seed(seed, version, client),
        local_epochs=-(-steps // per_epoch),
        num_steps=steps,
        local_steps=steps,
    )
