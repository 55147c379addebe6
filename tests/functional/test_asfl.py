"""ASFL's formulas (lit_asyncfl.functional.asfl): latency, bandwidth by distance, lag tolerance, objective and
reward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_asyncfl.functional.asfl import (
    arrival_latency,
    bandwidth_from_distance,
    computation_latency,
    deprecated_devices,
    device_utility,
    distribution_latency,
    latency_objective,
    round_latency_limit,
    round_reward,
    staleness_decayed,
    upload_latency,
)


def test_round_latency_from_its_parts_by_hand():
    """A round of the paper's Fig. 6 kind: S = 4 selected, 1 deprecated, G = 12.5, b_s = 1250."""
    dist = distribution_latency(4, 1, model_size=12.5, server_bandwidth=1250.0)
    assert dist == pytest.approx(0.05)
    fresh = computation_latency(work=20.0, local_epochs=5, capability=0.5) + upload_latency(12.5, bandwidth=0.25)
    assert fresh == pytest.approx(200.0 + 50.0)
    # an asynchronous device that needed 300 s last round, when the round's slowest picked arrival was 120 s
    assert arrival_latency(True, 300.0, 120.0, dist, fresh) == pytest.approx(300.0 - 120.0 - 0.05)
    assert arrival_latency(True, 100.0, 120.0, dist, fresh) == 0.0  # already done: arrives at once
    assert arrival_latency(False, 300.0, 120.0, dist, fresh) == pytest.approx(250.0)


def test_bandwidth_falls_inversely_with_distance_within_the_papers_range():
    d = np.array([10.0, 420.0, 600.0, 800.0, 1000.0, 3000.0])
    b = bandwidth_from_distance(d, radius=1000.0)
    assert b.max() <= 0.3 and b.min() >= 0.125 and np.all(np.diff(b) <= 0)
    assert b[2] * 600.0 == pytest.approx(b[3] * 800.0)  # b * d constant between d0 and the radius


def test_utility_and_staleness_decay_by_hand():
    assert device_utility(50, [0.25, 0.25]) == pytest.approx(50 * 0.5)
    w = staleness_decayed(torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0]), staleness=3, decay=0.9)
    assert torch.allclose(w, torch.tensor([2 * 0.729, 1 - 0.729]))
    assert torch.equal(staleness_decayed(torch.tensor([5.0]), torch.tensor([1.0]), staleness=0), torch.tensor([5.0]))


def test_forced_synchronisation_hits_exactly_the_devices_beyond_the_lag_tolerance():
    versions = {3: 10, 4: 9, 5: 8, 6: 7, 7: 5}
    assert deprecated_devices(10, versions, lag_tolerance=2) == [6, 7]  # staleness 3 and 5 exceed 2
    assert deprecated_devices(10, versions, lag_tolerance=0) == [4, 5, 6, 7]
    assert deprecated_devices(10, versions, lag_tolerance=5) == []  # staleness 5 is tolerated
    with pytest.raises(ValueError, match="lag_tolerance"):
        deprecated_devices(10, versions, lag_tolerance=-1)


def test_objective_on_both_sides_of_the_latency_limit():
    # Task I preferences (alpha, beta) = (0.1, 0.5), T_max = 2000
    inside = latency_objective(0.7, total_latency=1600.0, max_latency=2000.0, alpha_pref=0.1, beta_pref=0.5)
    assert inside == pytest.approx(0.7 * 1.25**0.1)
    at_limit = latency_objective(0.7, total_latency=2000.0, max_latency=2000.0, alpha_pref=0.1, beta_pref=0.5)
    assert at_limit == pytest.approx(0.7)
    beyond = latency_objective(0.7, total_latency=2500.0, max_latency=2000.0, alpha_pref=0.1, beta_pref=0.5)
    assert beyond == pytest.approx(0.7 * 0.8**0.5)


def test_round_reward_uses_the_average_latency_left_per_round():
    # K = 4 rounds, T_max = 1000: 300 s spent in rounds 1-2, so round 3's limit is 700 / 2 = 350 s
    limit = round_latency_limit(1000.0, spent_before=300.0, rounds_total=4, round_index=3)
    assert limit == pytest.approx(350.0)
    assert round_reward(0.6, 175.0, limit, alpha_pref=0.07, beta_pref=0.09) == pytest.approx(0.6 * 2**0.07)
    assert round_reward(0.6, 700.0, limit, alpha_pref=0.07, beta_pref=0.09) == pytest.approx(0.6 * 0.5**0.09)
    spent = round_latency_limit(1000.0, spent_before=1500.0, rounds_total=4, round_index=4)
    assert spent == pytest.approx(1e-3) and round_reward(0.6, 100.0, spent, 0.07, 0.09) < 0.3


# -- soft actor-critic -----------------------------------------------------------------------------------------------
