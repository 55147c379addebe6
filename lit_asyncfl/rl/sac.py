"""Soft actor-critic with discrete actions (SACD, Christodoulou 2019), as ASFL uses it (Alg. 1, Eq. 9-12).

The action is a tuple of discrete choices (ASFL: the number of picked devices ``M_k`` and the lag tolerance
``tau_k``): the actor has one softmax head per choice over a shared trunk, so the joint policy is their product;
the twin critics and their targets output one Q-value per joint action.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Defaults that the ASFL controller (SACController) repeats by name.
LR = 3e-4
BATCH_SIZE = 64
TARGET_ENTROPY_RATIO = 0.5


def mlp(sizes: Sequence[int]) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def soft_update(target: nn.Module, source: nn.Module, delta: float) -> None:
    r"""Polyak averaging (Eq. 12): :math:`\phi' \leftarrow \delta \phi + (1 - \delta) \phi'`.

    Example:
        >>> a, b = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
        >>> _ = a.weight.data.fill_(1.0), b.weight.data.fill_(0.0)
        >>> soft_update(b, a, delta=0.25); b.weight.item()
        0.25
    """
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.mul_(1.0 - delta).add_(s, alpha=delta)


class ReplayBuffer:
    """A ring buffer of transitions ``(state, action index, reward, next state, done)`` with uniform sampling.

    Args:
        capacity: Transitions kept (the oldest are overwritten; ASFL: 5,000).
        state_dim: Size of a state vector.
    """

    def __init__(self, capacity: int, state_dim: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.states = np.zeros((capacity, state_dim), dtype=np.float32)
        self.next_states = np.zeros((capacity, state_dim), dtype=np.float32)
        self.actions = np.zeros(capacity, dtype=np.int64)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.dones = np.zeros(capacity, dtype=np.float32)
        self.size = 0
        self._next = 0

    def add(self, state: Sequence[float], action: int, reward: float, next_state: Sequence[float], done: bool) -> None:
        i = self._next
        self.states[i], self.actions[i], self.rewards[i] = state, action, reward
        self.next_states[i], self.dones[i] = next_state, float(done)
        self._next = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> tuple[Tensor, ...]:
        idx = rng.integers(0, self.size, size=batch_size)
        return tuple(
            torch.from_numpy(a[idx]) for a in (self.states, self.actions, self.rewards, self.next_states, self.dones)
        )


class DiscreteSAC:
    r"""Soft actor-critic over a tuple of discrete choices, with a learned temperature.

    Critic targets (Eq. 11): :math:`\hat Q = r + \gamma (1 - d) \sum_a \pi(a|s') [\min_v Q_{\phi'_v}(s', a) -
    \alpha \log \pi(a|s')]`; critic loss :math:`\frac12 (Q_{\phi_v}(s, a) - \hat Q)^2` (Eq. 10); actor loss
    :math:`\sum_a \pi(a|s) [\alpha \log \pi(a|s) - \min_v Q_{\phi_v}(s, a)]`; temperature loss
    :math:`-\log\alpha \sum_a \pi(a|s) [\log \pi(a|s) + \bar H]` with target entropy :math:`\bar H` =
    ``target_entropy_ratio`` :math:`\times \log |A|`; soft target updates with :math:`\delta` (Eq. 12).

    Args:
        state_dim: Size of the state (ASFL: 5).
        action_sizes: Number of choices of each action component (ASFL: choices of ``M_k`` and of ``tau_k``).
        actor_hidden: Hidden sizes of the actor trunk (ASFL: 128, 128).
        critic_hidden: Hidden sizes of each critic (ASFL: 128, 64).
        gamma: Discount :math:`\gamma` (0.99).
        delta: Soft-update rate :math:`\delta` of the target critics (0.01).
        lr: Adam learning rate of actor, critics and temperature (the paper's 1e-6 learns very slowly; 3e-4 is the
            usual SAC value).
        batch_size: Transitions per update.
        buffer_size: Replay capacity (5,000).
        init_temperature: Initial :math:`\alpha` (1).
        target_entropy_ratio: Target entropy as a fraction of the maximum :math:`\log |A|` (SACD uses 0.98, which
            keeps the policy close to uniform; 0.5 lets it commit).
        seed: Seed of the networks' initialisation, the action sampling and the replay sampling.

    Example:
        >>> agent = DiscreteSAC(state_dim=2, action_sizes=(3, 2), seed=0)
        >>> action = agent.act([0.5, 0.1])
        >>> len(action), 0 <= action[0] < 3 and 0 <= action[1] < 2
        (2, True)
    """

    def __init__(
        self,
        state_dim: int,
        action_sizes: Sequence[int],
        actor_hidden: Sequence[int] = (128, 128),
        critic_hidden: Sequence[int] = (128, 64),
        gamma: float = 0.99,
        delta: float = 0.01,
        lr: float = LR,
        batch_size: int = BATCH_SIZE,
        buffer_size: int = 5000,
        init_temperature: float = 1.0,
        target_entropy_ratio: float = TARGET_ENTROPY_RATIO,
        seed: int = 0,
    ) -> None:
        if state_dim < 1:
            raise ValueError(f"state_dim must be >= 1, got {state_dim}")
        if not action_sizes or any(n < 1 for n in action_sizes):
            raise ValueError(f"action_sizes must be positive counts, got {list(action_sizes)}")
        if not 0 <= gamma <= 1 or not 0 < delta <= 1:
            raise ValueError(f"need gamma in [0, 1] and delta in (0, 1], got gamma={gamma}, delta={delta}")
        if not 0 <= target_entropy_ratio < 1 or init_temperature <= 0:
            raise ValueError(
                f"need target_entropy_ratio in [0, 1) and init_temperature > 0, got {target_entropy_ratio}, "
                f"{init_temperature}"
            )
        self.state_dim = state_dim
        self.action_sizes = tuple(int(n) for n in action_sizes)
        self.num_actions = math.prod(self.action_sizes)
        self.gamma, self.delta, self.batch_size = gamma, delta, batch_size
        self.target_entropy = target_entropy_ratio * math.log(self.num_actions)
        init = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=init)))
            self.trunk = mlp([state_dim, *actor_hidden])
            self.heads = nn.ModuleList(nn.Linear(actor_hidden[-1], n) for n in self.action_sizes)
            self.critics = nn.ModuleList(mlp([state_dim, *critic_hidden, self.num_actions]) for _ in range(2))
            self.target_critics = nn.ModuleList(mlp([state_dim, *critic_hidden, self.num_actions]) for _ in range(2))
        self.target_critics.load_state_dict(self.critics.state_dict())
        self.log_alpha = torch.tensor(math.log(init_temperature), requires_grad=True)
        actor_params = [*self.trunk.parameters(), *self.heads.parameters()]
        self.actor_opt = torch.optim.Adam(actor_params, lr=lr)
        self.critic_opt = torch.optim.Adam(self.critics.parameters(), lr=lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=lr)
        self.buffer = ReplayBuffer(buffer_size, state_dim)
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.rng = np.random.default_rng(seed + 2)
        self.updates = 0

    # -- policy -------------------------------------------------------------------------------------------------------
    @property
    def alpha(self) -> float:
        """The temperature :math:`\\alpha`."""
        return float(self.log_alpha.detach().exp())

    def joint_log_probs(self, states: Tensor) -> Tensor:
        """``log pi(a|s)`` of every joint action, shape ``(batch, |A|)`` (product of the heads' softmaxes)."""
        hidden = torch.relu(self.trunk(states))
        joint = None
        for head in self.heads:
            logp = F.log_softmax(head(hidden), dim=-1)
            joint = logp if joint is None else (joint[:, :, None] + logp[:, None, :]).flatten(1)
        assert joint is not None
        return joint

    def encode(self, action: Sequence[int]) -> int:
        """Joint action index of a tuple of choices (row-major)."""
        return int(np.ravel_multi_index(tuple(int(a) for a in action), self.action_sizes))

    def decode(self, index: int) -> tuple[int, ...]:
        """Tuple of choices of a joint action index."""
        return tuple(int(i) for i in np.unravel_index(index, self.action_sizes))

    def act(self, state: Sequence[float], greedy: bool = False) -> tuple[int, ...]:
        """Sample an action (or take the most probable one with ``greedy=True``)."""
        with torch.no_grad():
            logp = self.joint_log_probs(torch.as_tensor(state, dtype=torch.float32).view(1, -1))[0]
        if greedy:
            return self.decode(int(torch.argmax(logp)))
        return self.decode(int(torch.multinomial(logp.exp(), 1, generator=self.generator)))

    def probabilities(self, state: Sequence[float]) -> Tensor:
        """The joint policy at ``state``, shape ``action_sizes``."""
        with torch.no_grad():
            logp = self.joint_log_probs(torch.as_tensor(state, dtype=torch.float32).view(1, -1))[0]
        return logp.exp().view(self.action_sizes)

    # -- learning -----------------------------------------------------------------------------------------------------
    def observe(
        self, state: Sequence[float], action: Sequence[int], reward: float, next_state: Sequence[float], done: bool
    ) -> None:
        """Store a transition in the replay buffer."""
        self.buffer.add(state, self.encode(action), reward, next_state, done)

    def update(self) -> dict[str, float] | None:
        """One gradient step of critics, actor and temperature, then the soft target update (``None`` while the
        buffer holds fewer than ``batch_size`` transitions)."""
        if self.buffer.size < self.batch_size:
            return None
        states, actions, rewards, next_states, dones = self.buffer.sample(self.batch_size, self.rng)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            next_logp = self.joint_log_probs(next_states)
            next_q = torch.min(self.target_critics[0](next_states), self.target_critics[1](next_states))
            next_v = (next_logp.exp() * (next_q - alpha * next_logp)).sum(dim=1)
            target = rewards + self.gamma * (1.0 - dones) * next_v
        q_taken = [critic(states).gather(1, actions[:, None]).squeeze(1) for critic in self.critics]
        critic_loss = sum(0.5 * F.mse_loss(q, target) for q in q_taken)
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()

        logp = self.joint_log_probs(states)
        probs = logp.exp()
        with torch.no_grad():
            q_min = torch.min(self.critics[0](states), self.critics[1](states))
        actor_loss = (probs * (alpha * logp - q_min)).sum(dim=1).mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()

        gap = (probs.detach() * (logp.detach() + self.target_entropy)).sum(dim=1)  # target entropy - entropy
        alpha_loss = -(self.log_alpha * gap).mean()
        self.alpha_opt.zero_grad()
        alpha_loss.backward()
        self.alpha_opt.step()

        for target_critic, critic in zip(self.target_critics, self.critics):
            soft_update(target_critic, critic, self.delta)
        self.updates += 1
        return {
            "critic_loss": float(critic_loss.detach()),
            "actor_loss": float(actor_loss.detach()),
            "alpha": self.alpha,
            "entropy": float(-(probs * logp).sum(dim=1).mean().detach()),
        }

    # -- persistence --------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Networks, optimizers, temperature and random streams (the replay buffer is not included)."""
        return {
            "action_sizes": self.action_sizes,
            "state_dim": self.state_dim,
            "trunk": self.trunk.state_dict(),
            "heads": self.heads.state_dict(),
            "critics": self.critics.state_dict(),
            "target_critics": self.target_critics.state_dict(),
            "log_alpha": self.log_alpha.detach().clone(),
            "actor_opt": self.actor_opt.state_dict(),
            "critic_opt": self.critic_opt.state_dict(),
            "alpha_opt": self.alpha_opt.state_dict(),
            "generator": self.generator.get_state(),
            "rng": self.rng.bit_generator.state,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if tuple(state["action_sizes"]) != self.action_sizes or state["state_dim"] != self.state_dim:
            raise ValueError(
                f"policy for state_dim={state['state_dim']}, actions {tuple(state['action_sizes'])} does not fit "
                f"this agent (state_dim={self.state_dim}, actions {self.action_sizes})"
            )
        self.trunk.load_state_dict(state["trunk"])
        self.heads.load_state_dict(state["heads"])
        self.critics.load_state_dict(state["critics"])
        self.target_critics.load_state_dict(state["target_critics"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.generator.set_state(state["generator"])
        self.rng.bit_generator.state = state["rng"]
        self.updates = state["updates"]

    def save(self, path: str | Path) -> None:
        """Save the policy (and everything to continue training) to ``path``."""
        torch.save(self.state_dict(), path)

    def load(self, path: str | Path) -> None:
        """Load a policy saved by :meth:`save` (``weights_only``: tensors and plain containers only)."""
        self.load_state_dict(torch.load(path, weights_only=True))
