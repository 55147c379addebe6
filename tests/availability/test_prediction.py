"""The availability predictor fed only by what the server observed (lit_asyncfl.availability.prediction) and the
selection of the devices about to leave first."""

from __future__ import annotations

import numpy as np

from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.schedulers.deadline_rounds import AvailabilityPrioritySelection


def test_session_predictor_learns_only_from_what_it_observed():
    p = SessionPredictor()
    p.reset(3)
    p.observe(0.0, np.array([True, True, False]))
    p.observe(10.0, np.array([True, False, True]))  # 0 stayed 10 s, 1 left (5 s counted), 2 came back
    p.observe(30.0, np.array([True, True, True]))  # 0 stayed 20 s more, 2 stayed 20 s
    p.observe_offline(2, 34.0)  # 2's job was lost at 34: 4 s more, one end
    assert p.ends.tolist() == [0, 1, 1] and p.exposure.tolist() == [30.0, 5.0, 24.0]
    assert p.rate(0) == 0.0 and p.rate(1) == 0.2 and p.rate(2) == 1 / 24
    assert p.stays_online(0, 1e6) == 1.0  # never seen leaving: predicted to stay
    again = SessionPredictor()
    again.load_state_dict(p.state_dict())
    assert again.rate(2) == p.rate(2) and again.seen_at.tolist() == p.seen_at.tolist()


def test_ips_selects_the_devices_about_to_leave_first_then_at_random():
    p = SessionPredictor()
    p.reset(6)
    p.observe(0.0, np.ones(6, bool))
    p.observe(20.0, np.array([False, False, True, True, True, True]))  # 0 and 1 left once, ~10 s online: 0.1/s
    p.observe(40.0, np.ones(6, bool))
    sel = AvailabilityPrioritySelection(p)
    for seed in range(5):
        picked = sel.select(np.arange(6), 3, np.zeros(6), 5.0, np.random.default_rng(seed)).tolist()
        assert {0, 1} <= set(picked) and len(picked) == 3
    # a round window long enough that they would not last it: no priority, a random pick
    counts = np.zeros(6)
    for seed in range(60):
        counts[sel.select(np.arange(6), 2, np.zeros(6), 100.0, np.random.default_rng(seed))] += 1
    assert counts.min() > 0
