"""FedASMU's adaptive local model adjustment: merge the fresh global model into the local model mid-training."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check, check_finite, check_number
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.functional.aggregation import mix
from lit_asyncfl.functional.fedasmu import CONTROL_LR, fedasmu_beta, fedasmu_beta_grads, fedasmu_phi
from lit_asyncfl.rl.time_slots import TimeSlotSelector

# Default initial controls and mu_beta (not given in the paper; tuned on the digits setup, see FedASMU).
MU_BETA = 1.0
GAMMA0 = 3.0
UPSILON0 = 0.5

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.fast import FastEngine


def _loss(module: Any, batch: Any) -> Tensor:
    out = module.training_step(batch, 0)
    return out["loss"] if isinstance(out, dict) else out


def _get_rng(device: torch.device) -> tuple[Tensor, Tensor | None]:
    return torch.random.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng(device: torch.device, state: tuple[Tensor, Tensor | None]) -> None:
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class FreshModelMerge(ClientCallback):
    r"""Request the global model mid-training and merge it with a learned weight (FedASMU, Formulas 5-9).

    At dispatch the :class:`~lit_asyncfl.rl.TimeSlotSelector` picks a slot ``l*``; after that
    fraction of the local steps the device asks the server for the current global model :math:`w_g`. When it is
    newer (:math:`g > o`):

    .. math::
        \phi = \frac{\gamma_i}{\sqrt{g}}\left(1 - \frac{\upsilon_i}{\sqrt{g - o + 1}}\right), \quad
        \beta = \frac{\mu_\beta \phi}{1 + \mu_\beta \phi}, \quad w_a = (1 - \beta) w_b + \beta w_g

    then :math:`\gamma_i, \upsilon_i` take one gradient step on the local loss (hyper-gradient through
    :math:`\beta`, using the gradient at :math:`w_a` on the last mini-batch), and the reward
    :math:`R = F_i(w_b) - F_i(w_a)` on that mini-batch goes to the selector. Training continues from :math:`w_a`;
    the optimizer keeps its state (e.g. momentum) across the merge. Both losses are computed in training mode
    with the same random state, and the extra forward passes change neither the weights (BatchNorm statistics
    included) nor the random stream. The merge jump :math:`w_a - w_b` is recorded in ``update.info`` so that
    the server can tell local training from merging.

    What the merge teaches (:math:`\gamma_i, \upsilon_i` and the slot policy's reward) is learned at the merge, i.e.
    at the job's request event, under every executor: :meth:`on_fresh_model` keeps it, and once every callback's
    ``on_fresh_model`` returned the executor takes it (:meth:`merge_result`) and learns it
    (:meth:`commit_merge_result`; on Ray the merge is computed once, on the job's worker or in the simulation's
    process from the job's state at its request, and the rest trains on the worker): later dispatches read it. A
    job that raises after its merge keeps what the merge taught and fails at its arrival event (dropped there, or
    the run stops there); one that raises before or in its merge (a later callback's ``on_fresh_model`` included),
    or whose merge gives non-finite values, teaches nothing. A job to which the server had nothing newer teaches
    nothing either (its slot plan is forgotten).

    Args:
        mu_beta: :math:`\mu_\beta`.
        gamma0: Initial :math:`\gamma_i` of every device.
        upsilon0: Initial :math:`\upsilon_i` of every device.
        lr_gamma: Learning rate :math:`\eta_\gamma`.
        lr_upsilon: Learning rate :math:`\eta_\upsilon`.
        selector: The time-slot selector (default: ``TimeSlotSelector()``).

    Example:
        >>> merge = FreshModelMerge(gamma0=3.0)
        >>> merge.controls(3)
        (3.0, 0.5)
    """

    def __init__(
        self,
        mu_beta: float = MU_BETA,
        gamma0: float = GAMMA0,
        upsilon0: float = UPSILON0,
        lr_gamma: float = CONTROL_LR,
        lr_upsilon: float = CONTROL_LR,
        selector: TimeSlotSelector | None = None,
    ) -> None:
        check_number("mu_beta", mu_beta, 0, open_min=True)
        check_number("gamma0", gamma0, 0, open_min=True)
        check_finite("upsilon0", upsilon0)
        check_number("lr_gamma", lr_gamma, 0)
        check_number("lr_upsilon", lr_upsilon, 0)
        check(
            selector is None or isinstance(selector, TimeSlotSelector),
            f"selector must be a TimeSlotSelector or None, got {selector!r}",
        )
        self.mu_beta = mu_beta
        self.gamma0 = gamma0
        self.upsilon0 = upsilon0
        self.lr_gamma = lr_gamma
        self.lr_upsilon = lr_upsilon
        self.selector = selector if selector is not None else TimeSlotSelector()
        self._controls: dict[int, tuple[float, float]] = {}
        #: On a worker's copy: what a job's merge taught, until :meth:`merge_result` hands it back.
        self._merged: dict[int, tuple[tuple[float, float], float] | None] = {}

    def controls(self, client: int) -> tuple[float, float]:
        """Current :math:`(\\gamma_i, \\upsilon_i)` of a device."""
        return self._controls.get(client, (self.gamma0, self.upsilon0))

    def on_fit_start(self, num_clients: int) -> None:
        self._controls = {}
        self.selector.on_fit_start()

    def request_step(self, job: ClientJob) -> int | None:
        slot = self.selector.choose(job.client, job.job_id, job.seed)
        return max(1, round(slot * job.num_steps / self.selector.num_slots))

    def on_fresh_model(
        self, trainer: FastEngine, job: ClientJob, fresh_weights: Tensor, fresh_version: int, batch: Any
    ) -> None:
        module, flat = trainer.module, trainer.flat
        gamma, upsilon = self.controls(job.client)
        beta = fedasmu_beta(fedasmu_phi(gamma, upsilon, fresh_version, job.base_version), self.mu_beta)
        before = flat.read()
        merged = mix(before, fresh_weights, beta)
        # Both losses see the same randomness (dropout masks), and the extra forward passes leave no trace:
        # the generator state and the weights (BatchNorm statistics included) are restored afterwards.
        rng_state = _get_rng(flat.flat.device)
        with torch.no_grad():
            loss_before = float(_loss(module, batch))
            flat.flat.copy_(merged)
        _set_rng(flat.flat.device, rng_state)
        loss_after = _loss(module, batch)
        trainable = [p for p in flat.params if p.requires_grad]
        grads = torch.autograd.grad(loss_after, trainable, allow_unused=True)
        _set_rng(flat.flat.device, rng_state)
        with torch.no_grad():
            flat.flat.copy_(merged)
        direction = dict(zip(map(id, flat.params), flat.param_views(fresh_weights - before)))
        inner = sum(float((g * direction[id(p)]).sum()) for g, p in zip(grads, trainable) if g is not None)
        d_gamma, d_upsilon = fedasmu_beta_grads(gamma, upsilon, fresh_version, job.base_version, self.mu_beta, inner)
        controls = (gamma - self.lr_gamma * d_gamma, upsilon - self.lr_upsilon * d_upsilon)
        reward = loss_before - float(loss_after.detach())
        learned: tuple[tuple[float, float], float] | None = (controls, reward)
        if not all(math.isfinite(v) for v in (*controls, reward)):
            learned = None  # a diverged job (NaN/inf loss) teaches the controls and the slot policy nothing
            trainer.job_info["fresh_merge_learning"] = "skipped: non-finite"
        trainer.job_info.update(beta=beta, reward=reward, fresh_version=fresh_version, merge_jump=merged - before)
        # handed back by merge_result, once every callback's on_fresh_model returned, and learned by
        # commit_merge_result at the job's request event (by the executor, under every executor): a job whose merge
        # a later callback's on_fresh_model fails teaches nothing; one that raises after its merge keeps it
        self._merged[job.job_id] = learned

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        """A job without a merge (the server had nothing newer at its request) teaches nothing: its slot plan is
        forgotten (a merged job's was learned at the merge). A merge no executor took (the engine used on its own)
        is learned now."""
        if self._on_worker:
            return
        if job.job_id in self._merged:
            self.commit_merge_result(job, self._merged.pop(job.job_id))
        else:
            self.selector.forget(job.job_id)

    #: A worker's copy (:meth:`load_job_state` was called): what a merge learns is handed back, not learned here.
    _on_worker = False
    carries_state = True  # gamma_i, upsilon_i travel with the job; the slot policy learns here, from what comes back
    learns_from_job_result = False  # (learned at the merge: a Ray run lets the rest train on until the arrival)
    #: (reads the weights, the batch and the generators; changes the weights and job_info; the module's training_step,
    #: called twice, must leave no other trace: else set it False on the instance, see docs/ray.md)
    merges_from_request_state = True

    def job_state(self, job: ClientJob) -> tuple[float, float]:
        r""":math:`(\gamma_i, \upsilon_i)` of the job's client."""
        return self.controls(job.client)

    def load_job_state(self, job: ClientJob, state: tuple[float, float]) -> None:
        self._on_worker, self._controls, self._merged = True, {job.client: state}, {}

    def merge_result(self, job: ClientJob) -> tuple[tuple[float, float], float] | None:
        """The controls and reward the job's merge learned (``None``: nothing to learn)."""
        return self._merged.pop(job.job_id, None)

    def commit_merge_result(self, job: ClientJob, result: tuple[tuple[float, float], float] | None) -> None:
        if result is None:  # no newer model at the request (or non-finite values): nothing to learn from
            self.selector.forget(job.job_id)
            return
        self._controls[job.client], reward = result
        self.selector.reward(job.job_id, reward)

    def job_result(self, job: ClientJob) -> None:
        """Nothing: what a job teaches is learned at its merge (:meth:`merge_result`)."""
        return None

    def commit_job_result(self, job: ClientJob, result: None) -> None:
        self.selector.forget(job.job_id)  # (a merged job's plan is gone already)

    def on_job_dropped(self, job: ClientJob, reason: str) -> None:
        self._merged.pop(job.job_id, None)  # (a merge that a later callback failed: it teaches nothing)
        self.selector.forget(job.job_id)

    def state_dict(self) -> dict[str, Any]:
        return {
            "controls": {c: list(v) for c, v in self._controls.items()},
            "selector": self.selector.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._controls = {int(c): (float(v[0]), float(v[1])) for c, v in state["controls"].items()}
        self.selector.load_state_dict(state["selector"])
