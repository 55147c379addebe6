"""Server callbacks and aggregators."""

from lit_asyncfl.server.aggregators import Aggregator, DeltaAverage, Mixing, ModelAverage
from lit_asyncfl.server.base import ServerCallback
from lit_asyncfl.server.distillation import DistillationCorrection
from lit_asyncfl.server.dynamic_weight import DynamicStalenessWeight
from lit_asyncfl.server.staleness_bound import StalenessBound
from lit_asyncfl.server.weights import DataSizeWeight, StalenessWeight

__all__ = [
    "Aggregator",
    "DataSizeWeight",
    "DeltaAverage",
    "DistillationCorrection",
    "DynamicStalenessWeight",
    "Mixing",
    "ModelAverage",
    "ServerCallback",
    "StalenessBound",
    "StalenessWeight",
]
