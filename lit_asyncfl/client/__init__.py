"""Client side: local training engines and client callbacks."""

from lit_asyncfl.client.callbacks import ClientCallback, LearningRateDecay, ProximalTerm
from lit_asyncfl.client.trainer import LocalTrainer, SequentialExecutor

__all__ = ["ClientCallback", "LearningRateDecay", "LocalTrainer", "ProximalTerm", "SequentialExecutor"]
