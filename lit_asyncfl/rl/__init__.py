"""Reinforcement-learning agents used by algorithms (ASFL's soft actor-critic with discrete actions, FedASMU's
time-slot selection)."""

from lit_asyncfl.rl.controllers import STATE_FEATURES, FixedAction, RoundController, SACController
from lit_asyncfl.rl.sac import DiscreteSAC, ReplayBuffer
from lit_asyncfl.rl.time_slots import SlotPolicy, TimeSlotSelector

__all__ = [
    "STATE_FEATURES",
    "DiscreteSAC",
    "FixedAction",
    "ReplayBuffer",
    "RoundController",
    "SACController",
    "SlotPolicy",
    "TimeSlotSelector",
]
