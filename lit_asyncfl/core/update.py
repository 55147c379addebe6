"""What travels between the server and a client: a job going out (with the seed derived for it), an update coming
back."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from torch import Tensor


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (e.g. run seed, client, job id), stable across platforms: a draw seeded by it
    does not depend on the order in which work is done (a job's :attr:`ClientJob.seed`, the streams of noise).

    Example:
        >>> derive_seed(0, 3, 7) == derive_seed(0, 3, 7) != derive_seed(0, 3, 8)
        True
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0]
    return int(state) & (2**63 - 1)


@dataclass(frozen=True)
class JobTiming:
    """Simulated durations of one client job, in virtual seconds.

    Args:
        download: Time to receive the global model.
        compute: Time of local training.
        upload: Time to send the update back.
    """

    download: float
    compute: float
    upload: float

    @property
    def total(self) -> float:
        """Download + compute + upload."""
        return self.download + self.compute + self.upload


@dataclass
class ClientJob:
    """One dispatch of a client: which model it starts from, when it left and when its update arrives.

    A job may pause once for a server interaction (FedASMU's fresh-model request): after ``request_step`` local
    steps, at :attr:`request_time`, the device asks for the global model current at that moment; its download
    (when newer) delays the arrival.

    Args:
        job_id: Unique id, in dispatch order.
        client: Client index.
        base_version: Global version ``o`` of the model the client starts from.
        dispatch_time: Virtual time of the dispatch.
        timing: Simulated durations of the job without any extra download.
        seed: Seed of the job's local randomness (batch order, dropout), derived from the run seed, the client and
            the job id so that it does not depend on the order in which jobs are computed.
        local_epochs: Number of local epochs ``E``.
        num_steps: Number of local optimizer steps planned (``E * ceil(n_i / batch_size)``, or ``local_steps``).
        local_steps: When the scheduler assigned the job its own number of local steps (FedCompass), the job stops
            after that many optimizer steps, mid-epoch if need be (``local_epochs`` is then the number of epochs
            begun, ``ceil(local_steps / steps_per_epoch)``); ``None``: ``local_epochs`` whole epochs.
        request_step: Local steps done before the server interaction, or ``None`` for none.
        request_fraction: Fraction of the compute time spent before the interaction.
        fresh_version: Version of the fresh model received at the interaction (``None``: none newer).
        arrival_time: Virtual time at which the update reaches the server (set by the simulator).
        drop_time: Virtual time at which the job is lost before its update arrives (its device goes offline or
            crashes; ``inf``: never), planned by the simulator at dispatch.
        drop_reason: Why it is lost at ``drop_time`` (``"offline"`` or ``"crash"``; ``""``: it is not).
    """

    job_id: int
    client: int
    base_version: int
    dispatch_time: float
    timing: JobTiming
    seed: int
    local_epochs: int
    num_steps: int = 0
    local_steps: int | None = None
    request_step: int | None = None
    request_fraction: float = 0.0
    fresh_version: int | None = None
    arrival_time: float = math.nan
    drop_time: float = math.inf
    drop_reason: str = ""

    @property
    def request_time(self) -> float:
        """Virtual time of the server interaction: download, then the compute before ``request_step``."""
        return self.dispatch_time + self.timing.download + self.timing.compute * self.request_fraction

    def state_dict(self) -> dict[str, Any]:
        """Plain state for checkpoints."""
        state = asdict(self)
        state["timing"] = asdict(self.timing)
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ClientJob:
        """Inverse of :meth:`state_dict`."""
        return cls(**{**state, "timing": JobTiming(**state["timing"])})


@dataclass
class ClientUpdate:
    """What a client uploads after local training.

    Args:
        job: The job this update answers.
        weights: The client's final model ``w_i`` as a flat vector.
        base_weights: The global model ``w_o`` the client started from (shared, never modified).
        num_samples: Size ``n_i`` of the client's shard.
        num_steps: Number of local optimizer steps.
        train_loss: Mean training loss over the local steps.
        staleness: ``t - o``, set by the server on arrival.
        info: Free-form extras written by client callbacks (e.g. merge statistics).
        metrics: What the module logged with ``self.log`` in ``training_step`` during the job, each value's mean
            over the job's steps (weighted by batch size) or its metric object's value at the job's end.
        batches_tracked: Batches each BatchNorm layer of the module counted during the job (its
            ``num_batches_tracked`` increments, ``int64``), or ``None`` for a module without BatchNorm statistics.
    """

    job: ClientJob
    weights: Tensor
    base_weights: Tensor
    num_samples: int
    num_steps: int
    train_loss: float
    staleness: int = -1
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    batches_tracked: Tensor | None = None

    @property
    def client(self) -> int:
        """Client index."""
        return self.job.client

    @property
    def base_version(self) -> int:
        """Version ``o`` of the model the client trained from."""
        return self.job.base_version

    @property
    def delta(self) -> Tensor:
        r"""The client's change :math:`\Delta_i = w_i - w_o` (the negative pseudo-gradient)."""
        return self.weights - self.base_weights

    def state_dict(self) -> dict[str, Any]:
        """Plain state for checkpoints (``torch.save`` stores a shared ``base_weights`` once)."""
        return {
            "job": self.job.state_dict(),
            "weights": self.weights,
            "base_weights": self.base_weights,
            "num_samples": self.num_samples,
            "num_steps": self.num_steps,
            "train_loss": self.train_loss,
            "staleness": self.staleness,
            "info": dict(self.info),
            "metrics": dict(self.metrics),
            "batches_tracked": self.batches_tracked,
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ClientUpdate:
        """Inverse of :meth:`state_dict`."""
        return cls(**{**state, "job": ClientJob.from_state_dict(state["job"])})
