"""Markov on-off availability (lit_asyncfl.availability.markov): the closed-form fraction of time online."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_asyncfl.availability import MarkovOnOff


def test_markov_on_off_spends_the_closed_form_fraction_of_time_online():
    a = MarkovOnOff(mean_on=100.0, mean_off=300.0)
    a.setup(200, seed=1)
    assert a.online_fraction(2e5) == pytest.approx(100 / (100 + 300), abs=0.01)
    assert a.stationary_fraction() == pytest.approx(0.25)
    b = MarkovOnOff(mean_on=100.0, mean_off=300.0, spread=0.8)
    b.setup(3000, seed=2)
    on, off = b._on, b._off  # the per-device means drawn; their closed form: mean of on / (on + off)
    assert np.mean(on) == pytest.approx(100.0, rel=0.06) and np.mean(off) == pytest.approx(300.0, rel=0.06)
    closed_form = float(np.mean(on / (on + off)))
    assert b.online(5e4).mean() == pytest.approx(closed_form, abs=3 * math.sqrt(0.25 / 3000))  # stationary now
