"""Client callbacks: hooks into each client job's local training (``Algorithm.client_callbacks``).

The base class and the generic ones (:class:`ClientCallback`, :class:`ProximalTerm`, :class:`LearningRateDecay`),
staleness-aware learning rates and corrections (ASO-Fed, FedSA), callbacks with per-client state (MOON, FedDyn,
Ditto's personal model) and FedASMU's fresh-model merge, local differential privacy, gradient clipping (Lightning's
``gradient_clip_val``).
"""

from lit_asyncfl.client_callbacks.base import ClientCallback, LearningRateDecay, ProximalTerm
from lit_asyncfl.client_callbacks.client_state import DynamicRegularizer, ModelContrastive
from lit_asyncfl.client_callbacks.clipping import GradientClipping
from lit_asyncfl.client_callbacks.fresh_merge import FreshModelMerge
from lit_asyncfl.client_callbacks.personal import PersonalModel
from lit_asyncfl.client_callbacks.privacy import LocalGaussianNoise
from lit_asyncfl.client_callbacks.staleness import DecayedCorrection, DelayAdaptiveStepSize, ParticipationLearningRate

__all__ = [
    "ClientCallback",
    "DecayedCorrection",
    "DelayAdaptiveStepSize",
    "DynamicRegularizer",
    "FreshModelMerge",
    "GradientClipping",
    "LearningRateDecay",
    "LocalGaussianNoise",
    "ModelContrastive",
    "ParticipationLearningRate",
    "PersonalModel",
    "ProximalTerm",
]
