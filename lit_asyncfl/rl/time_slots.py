"""FedASMU's intelligent time-slot selection: when, during local training, to request the fresh global model."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lit_asyncfl.checks import check, check_fraction, check_int, check_number, check_path
from lit_asyncfl.functional.rl import epsilon_greedy, moving_baseline, q_learning_update

#: Q-learning actions on the slot: move one earlier, stay, move one later.
ACTIONS = (-1, 0, 1)
# Defaults of the selector (FedASMU's preset repeats them by name).
NUM_SLOTS = 5
EPSILON = 0.1
Q_LR = 0.1
DISCOUNT = 0.9
BASELINE_RATE = 0.1
RL_LR = 1e-3


class SlotPolicy(nn.Module):
    """The shared meta-policy: one LSTM and a linear layer emitting, for slots ``l = 1..L``, the probability of
    requesting after slot ``l`` given the decisions before it (Zoph and Le's controller, as in FedASMU).

    Args:
        hidden_size: LSTM hidden size.
    """

    def __init__(self, hidden_size: int = 16) -> None:
        super().__init__()
        self.lstm = nn.LSTMCell(2, hidden_size)
        self.head = nn.Linear(hidden_size, 2)
        self.hidden_size = hidden_size

    def log_probs(self, decisions: list[int]) -> Tensor:
        """Log-probabilities of ``decisions`` (0/1 per slot), each conditioned on the previous ones."""
        h = c = torch.zeros(1, self.hidden_size)
        x = torch.zeros(1, 2)
        out = []
        for d in decisions:
            h, c = self.lstm(x, (h, c))
            out.append(torch.log_softmax(self.head(h), dim=-1)[0, d])
            x = torch.nn.functional.one_hot(torch.tensor([d]), 2).float()
        return torch.stack(out)

    @torch.no_grad()
    def sample(self, num_slots: int, uniforms: np.ndarray) -> list[int]:
        """Sample one decision per slot with the given uniform draws (so the caller owns the randomness)."""
        h = c = torch.zeros(1, self.hidden_size)
        x = torch.zeros(1, 2)
        decisions = []
        for u in uniforms[:num_slots]:
            h, c = self.lstm(x, (h, c))
            p_request = float(torch.softmax(self.head(h), dim=-1)[0, 1])
            d = int(u < p_request)
            decisions.append(d)
            x = torch.nn.functional.one_hot(torch.tensor([d]), 2).float()
        return decisions


def first_request(decisions: list[int]) -> int:
    """The slot ``l*``: the first ``l`` (1-based) whose decision is 1, or ``L`` when none is.

    Example:
        >>> first_request([0, 1, 1]), first_request([0, 0, 0])
        (2, 3)
    """
    return next((i + 1 for i, d in enumerate(decisions) if d), len(decisions))


class TimeSlotSelector:
    r"""Chooses the slot ``l*`` after which a device requests the fresh global model, and learns from rewards.

    A device's first rewarded training uses the shared LSTM meta-policy (:class:`SlotPolicy`), updated by
    REINFORCE with a moving baseline:

    .. math:: \theta \leftarrow \theta + \eta_{RL} \sum_{l=1}^{L} \nabla_\theta \log P(f_l | f_{<l}; \theta)(R - b)

    Afterwards the device runs tabular Q-learning over states ``l*`` and actions {earlier, stay, later}
    (clipped to ``[1, L]``) with :math:`\epsilon`-greedy selection. The reward ``R`` is the local loss before
    minus after merging the fresh model, on the same mini-batch. The baseline is updated before the policy step
    (Alg. 2, lines 13-14).

    **Resolutions**: a slot is a fraction ``l / L`` of the job's local steps (FedASMU uses epochs; with one or two
    local epochs the choice would vanish); the meta-policy explores by sampling its own decisions, and
    :math:`\epsilon`-greedy applies to the Q-learning; a job without a reward (no newer global model at the request)
    updates nothing; the meta-policy starts from random weights drawn with ``init_seed`` unless ``policy_path``
    names a saved policy; each policy-gradient step is clipped to ``max_grad_norm`` (as in Zoph and Le's
    controller; unclipped steps on the small LSTM can jump straight into a deterministic policy that never
    receives a reward again).

    Args:
        num_slots: Number of slots ``L``.
        epsilon: Exploration rate of the Q-learning.
        q_lr: Q-learning rate :math:`\phi`.
        discount: Q-learning discount :math:`\psi`.
        baseline_rate: Baseline rate :math:`\rho`.
        rl_lr: Meta-policy learning rate :math:`\eta_{RL}`.
        hidden_size: LSTM hidden size.
        init_seed: Seed of the meta-policy's initial weights.
        policy_path: A policy saved by :meth:`save_policy` to start from.
        max_grad_norm: Clip the norm of each policy-gradient step (``None``: no clipping).

    Example:
        >>> sel = TimeSlotSelector(num_slots=4)
        >>> sel.on_fit_start()
        >>> 1 <= sel.choose(client=0, job_id=0, seed=7) <= 4
        True
    """

    def __init__(
        self,
        num_slots: int = NUM_SLOTS,
        epsilon: float = EPSILON,
        q_lr: float = Q_LR,
        discount: float = DISCOUNT,
        baseline_rate: float = BASELINE_RATE,
        rl_lr: float = RL_LR,
        hidden_size: int = 16,
        init_seed: int = 0,
        policy_path: str | None = None,
        max_grad_norm: float | None = 1.0,
    ) -> None:
        check_int("num_slots", num_slots, 1)
        check_fraction("epsilon", epsilon)
        check_fraction("q_lr", q_lr)
        check_fraction("discount", discount)
        check_fraction("baseline_rate", baseline_rate)
        check_number("rl_lr", rl_lr, 0)
        check_int("hidden_size", hidden_size, 1)
        check_int("init_seed", init_seed, 0, maximum=2**32 - 1)
        check_path("policy_path", policy_path, optional=True)
        check(policy_path is None or Path(policy_path).is_file(), f"policy_path file {policy_path!r} does not exist")
        check_number("max_grad_norm", max_grad_norm, 0, open_min=True, optional=True)
        self.num_slots = num_slots
        self.epsilon = epsilon
        self.q_lr = q_lr
        self.discount = discount
        self.baseline_rate = baseline_rate
        self.rl_lr = rl_lr
        self.hidden_size = hidden_size
        self.init_seed = init_seed
        self.policy_path = policy_path
        self.max_grad_norm = max_grad_norm
        self.on_fit_start()

    def on_fit_start(self) -> None:
        """Fresh meta-policy (or the saved one), empty Q-tables, zero baseline."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.init_seed)
            self.policy = SlotPolicy(self.hidden_size)
        if self.policy_path is not None:
            self.policy.load_state_dict(torch.load(self.policy_path, weights_only=True))
        self.q_tables: dict[int, np.ndarray] = {}
        self.slots: dict[int, int] = {}
        self.baseline = 0.0
        self.pending: dict[int, dict[str, Any]] = {}

    def choose(self, client: int, job_id: int, seed: int) -> int:
        """The slot for a new job of ``client`` (randomness from the job's ``seed``)."""
        rng = np.random.default_rng([seed, 0x5107])
        if client not in self.q_tables:
            decisions = self.policy.sample(self.num_slots, rng.random(self.num_slots))
            slot = first_request(decisions)
            self.pending[job_id] = {"client": client, "meta": decisions, "slot": slot}
            return slot
        state = self.slots[client]
        action = epsilon_greedy(self.q_tables[client][state - 1], self.epsilon, rng)
        slot = min(self.num_slots, max(1, state + ACTIONS[action]))
        self.pending[job_id] = {"client": client, "state": state, "action": action, "slot": slot}
        return slot

    def reward(self, job_id: int, reward: float) -> None:
        """Learn from the reward of a job's merge (baseline, then meta-policy or Q-table); a non-finite reward is
        refused (``ValueError``): it would make the policy, the tables and the baseline NaN for every device."""
        if not math.isfinite(reward):
            self.pending.pop(job_id, None)
            raise ValueError(f"the reward of job {job_id} is not finite ({reward}); forget() the job instead")
        plan = self.pending.pop(job_id)
        client = plan["client"]
        self.baseline = moving_baseline(self.baseline, reward, self.baseline_rate)
        if "meta" in plan:
            self._reinforce(plan["meta"], reward - self.baseline)
            self.q_tables[client] = np.zeros((self.num_slots, len(ACTIONS)))
        else:
            self.q_tables[client] = q_learning_update(
                self.q_tables[client],
                plan["state"] - 1,
                plan["action"],
                reward,
                plan["slot"] - 1,
                self.q_lr,
                self.discount,
            )
        self.slots[client] = plan["slot"]

    def forget(self, job_id: int) -> None:
        """Drop the plan of a job that got no reward."""
        self.pending.pop(job_id, None)

    def _reinforce(self, decisions: list[int], advantage: float) -> None:
        self.policy.zero_grad()
        self.policy.log_probs(decisions).sum().backward()
        if self.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
        with torch.no_grad():
            for p in self.policy.parameters():
                p.add_(p.grad, alpha=self.rl_lr * advantage)  # gradient *ascent* on expected reward

    def request_probabilities(self) -> list[float]:
        """Probability that the meta-policy requests at each slot ``l*`` (exact, by enumeration for small L)."""
        probs = [0.0] * self.num_slots
        with torch.no_grad():
            for bits in range(2**self.num_slots):
                decisions = [(bits >> i) & 1 for i in range(self.num_slots)]
                probs[first_request(decisions) - 1] += float(self.policy.log_probs(decisions).sum().exp())
        return probs

    def save_policy(self, path: str) -> None:
        """Save the meta-policy's weights (to start later runs from them with ``policy_path``)."""
        torch.save(self.policy.state_dict(), path)

    def state_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy.state_dict(),
            "q_tables": {c: torch.from_numpy(q.copy()) for c, q in self.q_tables.items()},
            "slots": dict(self.slots),
            "baseline": self.baseline,
            "pending": {j: dict(p) for j, p in self.pending.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.q_tables = {int(c): q.numpy().copy() for c, q in state["q_tables"].items()}
        self.slots = {int(c): int(s) for c, s in state["slots"].items()}
        self.baseline = float(state["baseline"])
        self.pending = {int(j): dict(p) for j, p in state["pending"].items()}
