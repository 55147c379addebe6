"""Reinforcement-learning agents used by algorithms (ASFL's soft actor-critic with discrete actions)."""

from lit_asyncfl.rl.sac import DiscreteSAC, ReplayBuffer

__all__ = ["DiscreteSAC", "ReplayBuffer"]
