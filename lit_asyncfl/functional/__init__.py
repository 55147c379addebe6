"""Pure functions: every formula of the library lives here once, and algorithms compose them."""

from lit_asyncfl.functional.adaptive import AdaptiveStep
from lit_asyncfl.functional.aggregation import mix, weighted_average
from lit_asyncfl.functional.privacy import clip_delta, gaussian_noise, rdp_epsilon
from lit_asyncfl.functional.staleness import (
    STALENESS_FUNCTIONS,
    constant_staleness,
    exponential_staleness,
    hinge_staleness,
    polynomial_staleness,
    staleness_weight,
)

__all__ = [
    "STALENESS_FUNCTIONS",
    "AdaptiveStep",
    "clip_delta",
    "constant_staleness",
    "exponential_staleness",
    "gaussian_noise",
    "hinge_staleness",
    "mix",
    "polynomial_staleness",
    "rdp_epsilon",
    "staleness_weight",
    "weighted_average",
]
