"""Reinforcement-learning agents used by algorithms (ASFL's soft actor-critic with discrete actions)."""

from lit_asyncfl.rl.controllers import STATE_FEATURES, FixedAction, RoundController, SACController
from lit_asyncfl.rl.sac import DiscreteSAC, ReplayBuffer

__all__ = ["STATE_FEATURES", "DiscreteSAC", "FixedAction", "ReplayBuffer", "RoundController", "SACController"]
