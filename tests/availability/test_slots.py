"""Slotted availability (lit_asyncfl.availability.slots): Diurnal follows its sinusoid and averages to its mean."""

from __future__ import annotations

import math

import pytest

from lit_asyncfl.availability import Diurnal


def test_diurnal_availability_follows_its_sinusoid_and_averages_to_its_mean():
    a = Diurnal(mean=0.5, amplitude=0.4, day=240.0, slot=10.0, phase_spread=0.0)
    a.setup(4000, seed=3)
    tolerance = 4 * math.sqrt(0.25 / 4000)
    for slot in range(48):  # two days, every slot: the fraction online is p(t) at the slot's midpoint
        t = slot * 10.0 + 5.0
        expected = 0.5 + 0.4 * math.sin(2 * math.pi * t / 240.0)
        assert a.online(t).mean() == pytest.approx(expected, abs=tolerance)
    spread = Diurnal(mean=0.3, amplitude=0.3, day=240.0, slot=10.0, phase_spread=1.0)
    spread.setup(300, seed=4)
    assert spread.online_fraction(240.0 * 200) == pytest.approx(0.3, abs=0.01)
    assert spread.online(1234.0).mean() == pytest.approx(0.3, abs=0.1)  # phases spread: no common night
