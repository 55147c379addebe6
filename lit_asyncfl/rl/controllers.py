"""Round controllers: who chooses ASFL's per-round action (number of picked devices ``M_k``, lag tolerance ``tau_k``).

:class:`FixedAction` is a constant choice (SAFA's ``M = 5, tau = 2``; ``num_picked=None`` waits for every device, as
synchronous FedCS and Oort do). :class:`SACController` lets a :class:`~lit_asyncfl.rl.sac.DiscreteSAC` agent choose
from the round state, learning across episodes (``train=True``, used by ``scripts/train_asfl.py``) or acting with a
saved policy (``policy=path``).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lit_asyncfl.checks import check_bool, check_int, check_number, check_path
from lit_asyncfl.rl.sac import BATCH_SIZE, LR, TARGET_ENTROPY_RATIO, DiscreteSAC

POLICY_FORMAT = "lit_asyncfl.asfl_policy.v1"

#: Names of the state features, in order (ASFL Sec. 4: global loss, latency ratio, objective so far, mean deprecated
#: devices per round, mean version variance).
STATE_FEATURES = ("loss", "latency_ratio", "objective", "mean_deprecated", "mean_version_variance")


class RoundController:
    """Base class of round controllers."""

    def setup(self, num_selected: int) -> None:
        """Called once the scheduler knows ``S`` (the number of devices selected per round)."""

    def on_episode_start(self) -> None:
        """A federated run (an episode) starts."""

    def act(self, state: Sequence[float]) -> tuple[int | None, int]:
        """``(M_k, tau_k)`` for the round starting in ``state`` (``M_k = None``: every device training)."""
        raise NotImplementedError

    def feedback(self, reward: float, next_state: Sequence[float], done: bool) -> dict[str, float] | None:
        """The reward of the last action and the state it led to; may learn (returns learning statistics)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What a run's checkpoint must hold to resume this controller exactly."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""


def _is_count(value: Any, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


class FixedAction(RoundController):
    """The same ``(M, tau)`` every round.

    Args:
        num_picked: Updates aggregated per round ``M`` (``None``: every device training, i.e. synchronous rounds).
        lag_tolerance: Largest staleness ``tau`` a device still training may have after an aggregation.

    Example:
        >>> FixedAction(num_picked=5, lag_tolerance=2).act([0.0] * 5)
        (5, 2)
    """

    def __init__(self, num_picked: int | None = 5, lag_tolerance: int = 2) -> None:
        check_int("num_picked", num_picked, 1, optional=True)
        check_int("lag_tolerance", lag_tolerance, 0)
        self.num_picked = num_picked
        self.lag_tolerance = lag_tolerance

    def act(self, state: Sequence[float]) -> tuple[int | None, int]:
        return self.num_picked, self.lag_tolerance


class SACController(RoundController):
    """A discrete soft actor-critic choosing ``(M_k, tau_k)`` each round (ASFL Alg. 1).

    With ``train=True`` the agent samples actions, stores every transition and takes ``updates_per_round`` gradient
    steps per round; the agent persists across runs, so one controller trained over many runs (episodes) learns a
    policy, saved with :meth:`save`. With ``train=False`` it acts from the loaded ``policy`` (greedily by default).

    Args:
        picked_choices: The values ``M_k`` may take (``None``: ``1..S``).
        tolerance_choices: The values ``tau_k`` may take.
        policy: A policy file saved by :meth:`save` to start from (``None``: random initial networks).
        train: Learn while acting (episode training) instead of only acting.
        greedy: Take the most probable action instead of sampling (only when not training).
        updates_per_round: Gradient steps after each round while training.
        hidden: Width of the actor's two hidden layers (ASFL: 128; the critics use ``hidden, hidden // 2``).
        lr, batch_size, target_entropy_ratio: The agent's (:class:`~lit_asyncfl.rl.sac.DiscreteSAC`'s arguments, see
            there).
        seed: Seed of the agent (initial networks, action and replay sampling).

    Example:
        >>> c = SACController(picked_choices=[2, 4], tolerance_choices=[1, 2], train=True, seed=0)
        >>> c.setup(num_selected=4)
        >>> m, tau = c.act([0.5, 0.0, 0.0, 0.0, 0.0])
        >>> m in (2, 4) and tau in (1, 2)
        True
    """

    def __init__(
        self,
        picked_choices: Sequence[int] | None = None,
        tolerance_choices: Sequence[int] = (1, 2, 3, 4),
        policy: str | None = None,
        train: bool = False,
        greedy: bool = True,
        updates_per_round: int = 4,
        lr: float = LR,
        batch_size: int = BATCH_SIZE,
        hidden: int = 128,
        target_entropy_ratio: float = TARGET_ENTROPY_RATIO,
        seed: int = 0,
    ) -> None:
        if picked_choices is not None and (not picked_choices or not all(_is_count(m, 1) for m in picked_choices)):
            raise ValueError(f"picked_choices must be integers >= 1, got {picked_choices!r}")
        if not tolerance_choices or not all(_is_count(t, 0) for t in tolerance_choices):
            raise ValueError(f"tolerance_choices must be integers >= 0, got {tolerance_choices!r}")
        check_bool("train", train)
        check_bool("greedy", greedy)
        check_int("updates_per_round", updates_per_round, 0)
        check_number("lr", lr, 0, open_min=True)
        check_int("batch_size", batch_size, 1)
        check_int("hidden", hidden, 2)
        check_number("target_entropy_ratio", target_entropy_ratio, 0, 1)
        check_int("seed", seed, 0, maximum=2**32 - 1)
        check_path("policy", policy, optional=True)
        if policy is not None and not Path(policy).is_file():
            raise ValueError(f"policy file {policy!r} does not exist (train one with scripts/train_asfl.py)")
        self.picked_choices = None if picked_choices is None else [int(m) for m in picked_choices]
        self.tolerance_choices = [int(t) for t in tolerance_choices]
        self.policy = policy
        self.train = train
        self.greedy = greedy
        self.updates_per_round = updates_per_round
        self.lr = lr
        self.batch_size = batch_size
        self.hidden = hidden
        self.target_entropy_ratio = target_entropy_ratio
        self.seed = seed
        self._agent: DiscreteSAC | None = None
        self._last: tuple[list[float], tuple[int, ...]] | None = None

    @property
    def agent(self) -> DiscreteSAC:
        """The soft actor-critic (built by :meth:`setup`)."""
        if self._agent is None:
            raise RuntimeError("SACController.setup() was not called")
        return self._agent

    @property
    def is_set_up(self) -> bool:
        """Whether :meth:`setup` has built the agent."""
        return self._agent is not None

    def setup(self, num_selected: int) -> None:
        if self.picked_choices is None:
            self.picked_choices = list(range(1, num_selected + 1))
        if self._agent is not None:  # keep learning across runs
            return
        self._agent = DiscreteSAC(
            state_dim=len(STATE_FEATURES),
            action_sizes=(len(self.picked_choices), len(self.tolerance_choices)),
            actor_hidden=(self.hidden, self.hidden),
            critic_hidden=(self.hidden, self.hidden // 2),
            lr=self.lr,
            batch_size=self.batch_size,
            target_entropy_ratio=self.target_entropy_ratio,
            seed=self.seed,
        )
        if self.policy is not None:
            self.load(self.policy)
        elif not self.train:
            warnings.warn(
                "SACController without a policy acts from an untrained agent; train one with scripts/train_asfl.py "
                "and pass it as policy=..., or use FixedAction(num_picked, lag_tolerance)",
                UserWarning,
                stacklevel=2,
            )

    def on_episode_start(self) -> None:
        self._last = None

    def act(self, state: Sequence[float]) -> tuple[int | None, int]:
        assert self.picked_choices is not None
        i, j = self.agent.act(state, greedy=self.greedy and not self.train)
        self._last = ([float(x) for x in state], (i, j))
        return self.picked_choices[i], self.tolerance_choices[j]

    def feedback(self, reward: float, next_state: Sequence[float], done: bool) -> dict[str, float] | None:
        if not self.train or self._last is None:
            return None
        state, action = self._last
        self.agent.observe(state, action, reward, next_state, done)
        stats = None
        for _ in range(self.updates_per_round):
            stats = self.agent.update() or stats
        return stats

    def save(self, path: str | Path, episodes: int | None = None) -> None:
        """Save the policy with the choices it was trained for (and everything to continue training), and how many
        episodes it was trained for, if given. Written atomically."""
        state = {
            "format": POLICY_FORMAT,
            "episodes": episodes,
            "picked_choices": self.picked_choices,
            "tolerance_choices": self.tolerance_choices,
            "agent": self.agent.state_dict(),
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(path)

    def load(self, path: str | Path) -> None:
        """Load a policy written by :meth:`save`; its action choices must be this controller's."""
        state = torch.load(path, weights_only=True)
        if not isinstance(state, dict) or state.get("format") != POLICY_FORMAT:
            raise ValueError(f"{path} is not an ASFL policy file (expected format {POLICY_FORMAT})")
        theirs = (list(state["picked_choices"]), list(state["tolerance_choices"]))
        if theirs != (self.picked_choices, self.tolerance_choices):
            raise ValueError(
                f"policy {path} chooses M from {theirs[0]} and tau from {theirs[1]}; this controller from "
                f"{self.picked_choices} and {self.tolerance_choices}"
            )
        self.agent.load_state_dict(state["agent"])

    def state_dict(self) -> dict[str, Any]:
        """For a run's checkpoint: the pending transition and, when acting is random or learning, the agent's state
        (networks, optimizers, random streams; not the replay buffer). Greedy inference needs neither."""
        if not self.train and self.greedy:
            return {}
        last = None if self._last is None else {"state": self._last[0], "action": list(self._last[1])}
        return {"agent": self.agent.state_dict(), "last": last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "agent" in state:
            self.agent.load_state_dict(state["agent"])
        last = state.get("last")
        self._last = (
            None if last is None else ([float(x) for x in last["state"]], tuple(int(a) for a in last["action"]))
        )
