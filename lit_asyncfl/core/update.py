"""What travels between the server and a client: a job going out, an update coming back."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from torch import Tensor


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

    Args:
        job_id: Unique id, in dispatch order.
        client: Client index.
        base_version: Global version ``o`` of the model the client starts from.
        dispatch_time: Virtual time of the dispatch.
        timing: Simulated durations; the update arrives at ``dispatch_time + timing.total``.
        seed: Seed of the job's local randomness (batch order, dropout), derived from the run seed, the client and
            the job id so that it does not depend on the order in which jobs are computed.
        local_epochs: Number of local epochs ``E``.
    """

    job_id: int
    client: int
    base_version: int
    dispatch_time: float
    timing: JobTiming
    seed: int
    local_epochs: int

    @property
    def arrival_time(self) -> float:
        """Virtual time at which the update reaches the server."""
        return self.dispatch_time + self.timing.total

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
    """

    job: ClientJob
    weights: Tensor
    base_weights: Tensor
    num_samples: int
    num_steps: int
    train_loss: float
    staleness: int = -1
    info: dict[str, Any] = field(default_factory=dict)

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
        }

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ClientUpdate:
        """Inverse of :meth:`state_dict`."""
        return cls(**{**state, "job": ClientJob.from_state_dict(state["job"])})
