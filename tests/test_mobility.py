"""Mobile edge devices (lit_asyncfl.mobility): they stay in the area, move at most their speed and get bandwidth by
distance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_asyncfl.mobility import MobileEdgeDevices


def test_mobile_devices_stay_in_the_area_move_at_most_speed_and_get_bandwidth_by_distance():
    net = MobileEdgeDevices(num_stations=9, area=900.0, speed=50.0)
    assert net.stations.shape == (9, 2) and net.coverage == pytest.approx(150 * math.sqrt(2))
    rng = np.random.default_rng(0)
    pos = net.initial_positions(500, rng)
    for _ in range(20):
        moved = net.move(pos, rng)
        assert np.all((moved >= 0) & (moved <= 900.0))
        assert np.all(np.linalg.norm(moved - pos, axis=1) <= 50.0 + 1e-9)  # a reflection only shortens the move
        pos = moved
    b = net.bandwidths(np.array([[150.0, 150.0], [150.0 + 100.0, 150.0], [300.0, 300.0]]))
    d0 = net.coverage * 0.125 / 0.3
    assert b.tolist() == pytest.approx([0.3, 0.3 * d0 / 100.0, 0.125])
