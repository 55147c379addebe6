r"""Client callbacks that adapt a client's job to its own history: ASO-Fed's delay-adaptive step size and decayed
correction, FedSA's participation-scaled learning rate.

Each keeps per-client state across jobs (in the callback, checkpointed through :meth:`state_dict`), learned in
``on_train_end`` only (a job that raises leaves no trace). They declare
:attr:`~lit_asyncfl.client_callbacks.ClientCallback.carries_state`: under a
:class:`~lit_asyncfl.executors.RayExecutor` a job carries its client's state to the worker and brings what it
learned back, committed when its update is consumed; the cohort engine refuses them at fit start (use
``engine="fast"``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check_choice, check_fraction, check_number
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.functional.asofed import asofed_correction, asofed_step_size, running_mean
from lit_asyncfl.functional.fedsa import FREQUENCIES, fedsa_learning_rate

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.fast import FastEngine


def _scale_lr(trainer: FastEngine, factor: float) -> None:
    for group in trainer.optimizer.param_groups:
        group["lr"] *= factor
    trainer.job_info["lr"] = float(trainer.optimizer.param_groups[0]["lr"])


# Defaults (ASO-Fed's and FedSA's), which their presets repeat by name.
LOG_BASE = math.e
BETA = 0.5
FREQUENCY = "share"


class DelayAdaptiveStepSize(ClientCallback):
    r"""ASO-Fed's dynamic step size: the job's learning rate times :math:`r_k = \max(1, \log_b \bar d_k)`.

    :math:`\bar d_k` is the mean, over the client's jobs including this one, of the number of global versions
    between its consecutive downloads (``job.base_version`` minus the previous job's; version 0 before the first
    job, as FedOpt's re-implementation), so clients that come back rarely take larger steps
    (:func:`~lit_asyncfl.functional.asofed.asofed_step_size`). The factor is recorded in the update's
    ``info["step_size_factor"]``.

    Args:
        log_base: Base :math:`b > 1` of the logarithm (:math:`e`; FedOpt's re-implementation uses 10).

    Example:
        >>> cb = DelayAdaptiveStepSize()
        >>> cb.factor(client=3, base_version=20)  # first job: mean delay 20 versions
        (2.995732273553991, 20.0)
    """

    carries_state = True  # the mean delay is learned across the client's jobs: a job carries its client's
    client_state_attributes = ("last_version", "mean_delay", "jobs")

    def __init__(self, log_base: float = LOG_BASE) -> None:
        check_number("log_base", log_base, 1, open_min=True)
        self.log_base = log_base
        self.last_version: dict[int, int] = {}
        self.mean_delay: dict[int, float] = {}
        self.jobs: dict[int, int] = {}
        self._pending: tuple[int, int, float] | None = None

    def on_fit_start(self, num_clients: int) -> None:
        self.last_version, self.mean_delay, self.jobs, self._pending = {}, {}, {}, None

    def factor(self, client: int, base_version: int) -> tuple[float, float]:
        """:math:`(r_k, \\bar d_k)` of a job of ``client`` starting from ``base_version``."""
        delay = base_version - self.last_version.get(client, 0)
        mean = running_mean(self.mean_delay.get(client, 0.0), self.jobs.get(client, 0), float(delay))
        return asofed_step_size(max(mean, 0.0), self.log_base), mean

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        r, mean = self.factor(job.client, job.base_version)
        self._pending = (job.client, job.base_version, mean)
        _scale_lr(trainer, r)
        trainer.job_info["step_size_factor"] = r

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        assert self._pending is not None and self._pending[0] == job.client
        client, version, mean = self._pending
        self.last_version[client] = version
        self.mean_delay[client] = mean
        self.jobs[client] = self.jobs.get(client, 0) + 1
        self._pending = None

    def on_job_dropped(self, job: ClientJob, reason: str) -> None:
        self._pending = None

    def state_dict(self) -> dict[str, Any]:
        return {"last_version": dict(self.last_version), "mean_delay": dict(self.mean_delay), "jobs": dict(self.jobs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_version = {int(k): int(v) for k, v in state["last_version"].items()}
        self.mean_delay = {int(k): float(v) for k, v in state["mean_delay"].items()}
        self.jobs = {int(k): int(v) for k, v in state["jobs"].items()}


class DecayedCorrection(ClientCallback):
    r"""ASO-Fed's decayed correction of what a client uploads (once per job, on its pseudo-gradient).

    With :math:`\nabla s_k = w_g - w_k` the job's pseudo-gradient (start model minus trained model, over the
    parameters), the client uploads :math:`w_g - \nabla\zeta_k` (its delta is :math:`-\nabla\zeta_k`) where

    .. math:: \nabla\zeta_k = \nabla s_k - \nabla s_k^{pre} + h_k^{pre}, \qquad
        h_k = \beta h_k^{pre} + (1 - \beta) \nabla s_k^{pre}

    (:func:`~lit_asyncfl.functional.asofed.asofed_correction`); :math:`\nabla s_k^{pre}` and :math:`h_k` are kept
    per client (zero before its first job). Floating buffers (BatchNorm statistics) are uploaded as trained. A job
    whose weights are not finite (it diverged) is uploaded as trained, for the server to refuse, and teaches the
    client's state nothing (``update.info["client_state"]`` says so): kept, a NaN :math:`h_k` would make every later
    upload of the client NaN.

    Memory: two model-sized vectors per client that has trained.

    Args:
        beta: Decay coefficient :math:`\beta \in [0, 1]`.

    Example:
        >>> DecayedCorrection(beta=0.5).beta
        0.5
    """

    carries_state = True  # h_k and the previous pseudo-gradient are kept across the client's jobs
    client_state_attributes = ("h", "prev_s_grad")

    def __init__(self, beta: float = BETA) -> None:
        check_fraction("beta", beta)
        self.beta = beta
        self.h: dict[int, Tensor] = {}
        self.prev_s_grad: dict[int, Tensor] = {}

    def on_fit_start(self, num_clients: int) -> None:
        self.h, self.prev_s_grad = {}, {}

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        n = trainer.flat.param_numel
        base = update.base_weights
        s_grad = base[:n] - update.weights[:n]
        if not bool(torch.isfinite(s_grad).all()):  # a diverged job: uploaded as trained (the server refuses it)
            update.info["client_state"] = "not learned: non-finite weights"
            return
        prev_s, prev_h = self.prev_s_grad.get(job.client), self.h.get(job.client)
        zeta, h = asofed_correction(
            s_grad,
            None if prev_s is None else prev_s.to(s_grad.device),
            None if prev_h is None else prev_h.to(s_grad.device),
            self.beta,
        )
        weights = update.weights.clone()
        weights[:n] = base[:n] - zeta
        update.weights = weights
        self.h[job.client] = h.detach().cpu().clone()
        self.prev_s_grad[job.client] = s_grad.detach().cpu().clone()

    def state_dict(self) -> dict[str, Any]:
        return {"h": {k: v.clone() for k, v in self.h.items()}, "prev_s_grad": dict(self.prev_s_grad)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.h = {int(k): v.clone() for k, v in state["h"].items()}
        self.prev_s_grad = {int(k): v.clone() for k, v in state["prev_s_grad"].items()}


class ParticipationLearningRate(ClientCallback):
    r"""FedSA's per-client learning rate :math:`\eta_i = \eta / (N f_i)`, :math:`f_i` the client's participation.

    :math:`c_i` counts the client's jobs completed before this one, :math:`C` those of all clients
    (:func:`~lit_asyncfl.functional.fedsa.fedsa_learning_rate`):

    * ``frequency="share"`` (default): :math:`f_i = \max(1/N, c_i/C)`, the client's share of all updates, so
      :math:`\eta_i = \eta \min(1, \bar c / c_i)` with :math:`\bar c = C/N`: :math:`\eta` for a client that has
      not completed a job yet (or before any job completed) and for one at or below the mean count, less for one
      above it, never more than :math:`\eta`. :math:`c_i` and :math:`C` are taken when the job is dispatched (the
      updates the server had then: the rate travels with the model, and jobs are trained at their arrival events,
      when later updates may have arrived). With ``base_lr=None``, :math:`\eta` is the module's configured
      learning rate.
    * ``frequency="count"`` (the Flower re-implementation): :math:`f_i = \max(1, c_i)`. With ``base_lr=None``,
      :math:`\eta = N \cdot` the module's configured learning rate, so the rate is the configured one divided by
      :math:`\max(1, c_i)`.

    A number ``base_lr`` sets :math:`\eta` itself (the job's rate is then computed from it whatever
    ``configure_optimizers`` set). :math:`C` is the sum of the checkpointed counts (so a resumed run has it too).

    Args:
        base_lr: :math:`\eta > 0`, or ``None``.
        frequency: ``"share"`` or ``"count"``: the reading of :math:`f_i`.

    Example:
        >>> cb = ParticipationLearningRate()
        >>> cb.frequency, cb.participations.get(4, 0), cb.total
        ('share', 0, 0)
    """

    carries_state = True  # the participation counts are kept across the clients' jobs
    asks_server = False  # (request_step only records the counts at each dispatch)

    def __init__(self, base_lr: float | None = None, frequency: str = FREQUENCY) -> None:
        check_number("base_lr", base_lr, 0, open_min=True, optional=True)
        check_choice("frequency", frequency, FREQUENCIES)
        self.base_lr = base_lr
        self.frequency = frequency
        self.num_clients = 1
        self.participations: dict[int, int] = {}
        self.total = 0  # C = sum of the counts
        self.dispatched: dict[int, tuple[int, int]] = {}  # job id -> (c_i, C) at its dispatch ("share")

    def on_fit_start(self, num_clients: int) -> None:
        self.num_clients = num_clients
        self.participations, self.total, self.dispatched = {}, 0, {}

    def request_step(self, job: ClientJob) -> int | None:
        if self.frequency == "share":  # at dispatch: what the server knows when it sends the rate with the model
            self.dispatched[job.job_id] = (self.participations.get(job.client, 0), self.total)
        return None  # no mid-training request

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        if self.frequency == "share":
            if job.job_id not in self.dispatched:
                raise RuntimeError(f"ParticipationLearningRate did not see the dispatch of job {job.job_id}")
            count, total = self.dispatched[job.job_id]
            for group in trainer.optimizer.param_groups:
                eta = group["lr"] if self.base_lr is None else self.base_lr
                group["lr"] = fedsa_learning_rate(eta, self.num_clients, count, total, "share")
        else:
            count = self.participations.get(job.client, 0)
            for group in trainer.optimizer.param_groups:
                if self.base_lr is None:  # eta = N * lr: eta / (N max(1, c)) = lr / max(1, c), without the rounding
                    group["lr"] = group["lr"] / max(1, count)
                else:
                    group["lr"] = fedsa_learning_rate(self.base_lr, self.num_clients, count)
        trainer.job_info["lr"] = float(trainer.optimizer.param_groups[0]["lr"])

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        self.dispatched.pop(job.job_id, None)
        self.participations[job.client] = self.participations.get(job.client, 0) + 1
        self.total += 1

    def on_job_dropped(self, job: ClientJob, reason: str) -> None:
        self.dispatched.pop(job.job_id, None)

    def job_state(self, job: ClientJob) -> tuple[int, int | None, tuple[int, int] | None]:
        """:math:`N`, :math:`c_i` and the job's counts at dispatch (``"share"``)."""
        return self.num_clients, self.participations.get(job.client), self.dispatched.get(job.job_id)

    def load_job_state(self, job: ClientJob, state: tuple[int, int | None, tuple[int, int] | None]) -> None:
        self.num_clients, count, dispatched = state
        self.participations = {} if count is None else {job.client: count}
        self.dispatched = {} if dispatched is None else {job.job_id: dispatched}
        self.total = 0  # (not read by a job: "share" reads its counts at dispatch)

    def job_result(self, job: ClientJob) -> int:
        return self.participations[job.client]

    def commit_job_result(self, job: ClientJob, result: int) -> None:
        self.dispatched.pop(job.job_id, None)
        self.total += result - self.participations.get(job.client, 0)
        self.participations[job.client] = result

    def state_dict(self) -> dict[str, Any]:
        return {
            "participations": dict(self.participations),
            "dispatched": {job_id: list(pair) for job_id, pair in self.dispatched.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.participations = {int(k): int(v) for k, v in state["participations"].items()}
        self.total = sum(self.participations.values())
        self.dispatched = {int(k): (int(c), int(t)) for k, (c, t) in state.get("dispatched", {}).items()}


__all__ = ["DecayedCorrection", "DelayAdaptiveStepSize", "ParticipationLearningRate"]
