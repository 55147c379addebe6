"""Staleness functions (:mod:`lit_asyncfl.functional.staleness`) against hand-computed values."""

from __future__ import annotations

import math

import pytest

from lit_asyncfl.functional import (
    constant_staleness,
    exponential_staleness,
    hinge_staleness,
    polynomial_staleness,
    staleness_weight,
)


@pytest.mark.parametrize(
    ("fn", "staleness", "kwargs", "expected"),
    [
        pytest.param(constant_staleness, 0, {}, 1.0, id="constant-0"),
        pytest.param(constant_staleness, 50, {}, 1.0, id="constant-50"),
        pytest.param(polynomial_staleness, 0, {"a": 0.5}, 1.0, id="poly-0"),
        pytest.param(polynomial_staleness, 3, {"a": 0.5}, 0.5, id="poly-3-half"),  # 4^-0.5
        pytest.param(polynomial_staleness, 7, {"a": 1.0}, 0.125, id="poly-7-one"),  # 8^-1
        pytest.param(polynomial_staleness, 1, {"a": 2.0}, 0.25, id="poly-1-two"),  # 2^-2
        pytest.param(hinge_staleness, 4, {"a": 10, "b": 4}, 1.0, id="hinge-at-b"),
        pytest.param(hinge_staleness, 5, {"a": 10, "b": 4}, 1 / 11, id="hinge-b+1"),  # 1/(10*1+1)
        pytest.param(hinge_staleness, 9, {"a": 2, "b": 4}, 1 / 11, id="hinge-b+5"),  # 1/(2*5+1)
        pytest.param(exponential_staleness, 0, {"a": 0.5}, 1.0, id="exp-0"),
        pytest.param(exponential_staleness, 4, {"a": 0.5}, math.exp(-2.0), id="exp-4"),
    ],
)
def test_staleness_functions_match_hand_values(fn, staleness, kwargs, expected):
    assert fn(staleness, **kwargs) == pytest.approx(expected, rel=1e-12)


def test_staleness_weight_dispatches_by_name_and_rejects_unknown():
    assert staleness_weight("hinge", 6, a=10, b=4) == pytest.approx(1 / 21)
    with pytest.raises(ValueError, match=r"unknown staleness function 'linear'.*allowed"):
        staleness_weight("linear", 1, a=0.5, b=4)


def test_negative_staleness_is_an_error():
    with pytest.raises(ValueError, match="staleness must be >= 0, got -1"):
        polynomial_staleness(-1)
