"""Server callbacks and aggregators."""

from lit_asyncfl.server.adaptive_optimizer import AdaptiveServerOptimizer, ServerMomentum
from lit_asyncfl.server.aggregators import (
    Aggregator,
    DataSizeWeight,
    DeltaAverage,
    Mixing,
    ModelAverage,
    StalenessWeight,
)
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.calibration import CalibratedDeltaAverage
from lit_asyncfl.server.data_fraction import DataFractionWeight
from lit_asyncfl.server.distillation import DistillationCorrection
from lit_asyncfl.server.dynamic_weight import DynamicStalenessWeight
from lit_asyncfl.server.feddyn import DynamicCorrection
from lit_asyncfl.server.gradient_history import GradientHistory
from lit_asyncfl.server.gradient_stability import GradientStability
from lit_asyncfl.server.grouped import GroupedDeltaStep
from lit_asyncfl.server.history_weights import HistoryAwareWeight
from lit_asyncfl.server.norm_amplification import NormAmplification
from lit_asyncfl.server.norm_bound import UpdateNormBound
from lit_asyncfl.server.privacy import DeltaClipping, GaussianAggregateNoise
from lit_asyncfl.server.similarity_weight import SimilarityStalenessWeight
from lit_asyncfl.server.sliding_window import SlidingWindowAverage
from lit_asyncfl.server.stale_aware import StaleAwareAverage
from lit_asyncfl.server.staleness_bound import StalenessBound
from lit_asyncfl.server.staleness_decay import StalenessDecay
from lit_asyncfl.server.two_stage import TwoStageWeightedStep
from lit_asyncfl.server.update_cache import ClientUpdateCache

__all__ = [
    "AdaptiveServerOptimizer",
    "Aggregator",
    "CalibratedDeltaAverage",
    "ClientUpdateCache",
    "DataFractionWeight",
    "DataSizeWeight",
    "DeltaAverage",
    "DeltaClipping",
    "DistillationCorrection",
    "DynamicCorrection",
    "DynamicStalenessWeight",
    "GaussianAggregateNoise",
    "GradientHistory",
    "GradientStability",
    "GroupedDeltaStep",
    "HistoryAwareWeight",
    "Mixing",
    "ModelAverage",
    "NormAmplification",
    "ServerCallback",
    "ServerMomentum",
    "SimilarityStalenessWeight",
    "SlidingWindowAverage",
    "StaleAwareAverage",
    "StalenessBound",
    "StalenessDecay",
    "StalenessWeight",
    "TwoStageWeightedStep",
    "UpdateNormBound",
]
