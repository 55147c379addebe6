"""CA2FL's calibrated aggregator (lit_asyncfl.server.calibration) on a tiny server by hand: refused steps, memory
warning, the callbacks' weights; every stateful aggregator forgets the previous fit."""

from __future__ import annotations

import warnings

import pytest
import torch
from builders import DoubleClientZero, make_update

from lit_asyncfl.core.server import Server
from lit_asyncfl.server import (
    AdaptiveServerOptimizer,
    CalibratedDeltaAverage,
    DeltaAverage,
    SlidingWindowAverage,
)


def test_calibrated_aggregator_by_hand_on_a_tiny_server():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=0.5)
    server = Server(torch.zeros(1), agg, [], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0], [0.0]))
    server.receive(make_update(1, [4.0], [0.0]))
    # round 1: h_1 = 0, v = (2 + 4) / 2 = 3, x = 0 + 0.5 * 3; then h_2 = (2 + 4) / 4 = 1.5
    assert server.weights.item() == pytest.approx(1.5) and agg.cache_mean.item() == pytest.approx(1.5)
    server.receive(make_update(0, [2.5], [1.5], base_version=1))  # Delta = 1, residual 1 - 2 = -1
    server.receive(make_update(2, [3.5], [1.5], base_version=1))  # Delta = 2, residual 2 - 0 = 2
    # round 2: v = 1.5 + (-1 + 2) / 2 = 2, x = 1.5 + 0.5 * 2 = 2.5; h_3 = (1 + 4 + 2) / 4
    assert server.weights.item() == pytest.approx(2.5) and agg.cache_mean.item() == pytest.approx(7 / 4)


def test_a_refused_ca2fl_step_teaches_the_cache_nothing():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=1.0)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [1.0, 1.0], [0.0, 0.0]))
    # a finite upload whose delta overflows: the aggregate is refused, both updates counted as rejected
    assert not server.receive(make_update(1, [3e38, 0.0], [-3e38, 0.0]))
    assert server.stats.reasons["non_finite_aggregate"] == 2 and server.version == 0
    assert len(agg.cache) == 0 and agg.cache_mean is None  # nothing of the refused buffer was cached
    server.receive(make_update(2, [1.0, 3.0], [0.0, 0.0]))
    assert server.receive(make_update(3, [3.0, 1.0], [0.0, 0.0]))
    # h_1 = 0 (the refused buffer left no trace): v = ((1, 3) + (3, 1)) / 2 = (2, 2); h_2 = (4, 4) / 4
    assert torch.allclose(server.weights, torch.tensor([2.0, 2.0])) and torch.allclose(agg.cache_mean, torch.ones(2))
    server.receive(make_update(0, [3.0, 2.0], [2.0, 2.0], base_version=1))  # Delta (1, 0), residual (1, 0) - 0
    assert server.receive(make_update(2, [2.0, 2.0], [2.0, 2.0], base_version=1))  # Delta 0, residual -(1, 3)
    # v = h_2 + ((1, 0) - (1, 3)) / 2 = (1, 1) + (0, -1.5)
    assert torch.allclose(server.weights, torch.tensor([3.0, 1.5]))


def test_a_federation_whose_full_cache_is_huge_is_warned_naming_the_figure():
    small = Server(torch.zeros(1000), CalibratedDeltaAverage(cache_dtype="float16"), [], num_clients=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small.on_fit_start()  # 2 MB: silent
    # 3,000,000 clients x 1,000 parameters x 4 bytes = 11.2 GiB (nothing is allocated before clients upload)
    huge = Server(torch.zeros(1000), CalibratedDeltaAverage(), [], num_clients=3_000_000)
    with pytest.warns(UserWarning, match=r"num_clients=3000000 x 1000 parameters in float32 take up to 11.2 GiB"):
        huge.on_fit_start()


def test_a_new_fit_forgets_the_previous_runs_window_cache_and_moments():
    window, calibrated, opt = SlidingWindowAverage(window_size=1), CalibratedDeltaAverage(1), AdaptiveServerOptimizer()
    for agg, callbacks in ((window, []), (calibrated, []), (DeltaAverage(1), [opt])):
        server = Server(torch.zeros(1), agg, callbacks, num_clients=2)
        server.on_fit_start()
        assert server.receive(make_update(0, [1.0], [0.0]))
        server.on_fit_start()
    assert len(window.window) == 0 and len(calibrated.cache) == 0 and calibrated.cache_mean is None
    assert opt.steps == 0 and opt.first_moment is None


def test_calibration_and_window_use_the_callbacks_weights():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=1.0)
    server = Server(torch.zeros(1), agg, [DoubleClientZero()], num_clients=2)
    server.on_fit_start()
    server.receive(make_update(0, [1.0], [0.0]))
    server.receive(make_update(1, [3.0], [0.0]))
    # p_0 Delta_0 = 2, p_1 Delta_1 = 3: v = 5 / 2; cached (2, 3), h = 5 / 2
    assert server.weights.item() == pytest.approx(2.5) and agg.cache_mean.item() == pytest.approx(2.5)
    window = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), window, [DoubleClientZero()], num_clients=2)
    server.on_fit_start()
    server.receive(make_update(0, [1.0], [0.0]))
    server.receive(make_update(1, [4.0], [0.0]))
    assert server.weights.item() == pytest.approx((2 * 1.0 + 4.0) / 3)
