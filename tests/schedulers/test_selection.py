"""Client selection (lit_asyncfl.schedulers.selection): utility selection explores, then prefers large losses; Oort
penalises slow devices."""

from __future__ import annotations

import numpy as np

from lit_asyncfl.schedulers import OortSelection, UtilitySelection


def test_utility_selection_explores_then_prefers_large_losses_and_oort_penalises_slow_devices():
    sel = UtilitySelection()
    sel.on_fit_start(5)
    rng = np.random.default_rng(0)
    assert sorted(sel.select(np.arange(5), 3, np.zeros(5), 1.0, rng).tolist()) == sorted(
        sel.select(np.arange(5), 3, np.zeros(5), 1.0, np.random.default_rng(0)).tolist()
    )
    for client, (n, loss) in enumerate([(10, 1.0), (10, 9.0), (40, 1.0), (20, 4.0)]):
        sel.observe(client, n, loss)  # utilities 10, 30, 40, 40; client 4 unseen
    assert sel.select(np.arange(5), 3, np.zeros(5), 1.0, rng).tolist() == [2, 3, 4]
    assert sel.select(np.array([0, 1, 3]), 2, np.zeros(5), 1.0, rng).tolist() == [1, 3]
    oort = OortSelection(penalty=2.0)
    oort.on_fit_start(2)
    oort.observe(0, 10, 4.0)  # utility 20
    oort.observe(1, 10, 1.0)  # utility 10
    latency = np.array([40.0, 5.0])  # device 0 is 4x slower than the preferred 10 s: 20 / 16 < 10
    assert oort.select(np.arange(2), 1, latency, 10.0, rng).tolist() == [1]
    plain = UtilitySelection()  # without the penalty, device 0's larger utility wins
    plain.on_fit_start(2)
    plain.observe(0, 10, 4.0)
    plain.observe(1, 10, 1.0)
    assert plain.select(np.arange(2), 1, latency, 10.0, rng).tolist() == [0]
