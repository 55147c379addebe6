"""FedSA's formulas (lit_asyncfl.functional.fedsa) by hand: the running mean, the rate, the share reading."""

from __future__ import annotations

import pytest

from lit_asyncfl.functional.asofed import asofed_step_size, running_mean
from lit_asyncfl.functional.fedsa import fedsa_learning_rate, fedsa_participation


def test_running_mean_fedsa_rate_and_refused_inputs_by_hand():
    assert running_mean(0.0, 0, 7.0) == 7.0
    assert running_mean(7.0, 1, 1.0) == 4.0
    assert running_mean(4.0, 2, 10.0) == 6.0
    assert [fedsa_learning_rate(2.0, 20, c) for c in range(4)] == [0.1, 0.1, 0.05, 2.0 / 60]
    for call, message in [
        (lambda: asofed_step_size(-1.0), r"the mean delay must be >= 0, got -1.0"),
        (lambda: asofed_step_size(5.0, log_base=1.0), r"the logarithm's base must be > 1, got 1.0"),
        (lambda: running_mean(1.0, -1, 2.0), r"count must be >= 0, got -1"),
        (lambda: fedsa_learning_rate(0.0, 10, 1), r"FedSA's base learning rate must be > 0, got 0.0"),
        (lambda: fedsa_learning_rate(1.0, 0, 1), r"the number of clients must be >= 1, got 0"),
        (lambda: fedsa_learning_rate(1.0, 10, -1), r"participations must be >= 0, got -1"),
        (lambda: fedsa_learning_rate(1.0, 10, 1, 5, "mean"), r"unknown frequency 'mean'; allowed: \['share', "),
        (lambda: fedsa_learning_rate(1.0, 10, 3, None, "share"), r"needs the total updates C >= c_i = 3, got None"),
        (lambda: fedsa_participation(10, 3, 2, "share"), r"needs the total updates C >= c_i = 3, got 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


def test_fedsa_share_reading_by_hand():
    # N = 4 clients, C = 12 updates: mean count 3; eta_i = eta / (N f_i), f_i = max(1/N, c_i / C)
    assert [fedsa_participation(4, c, 12, "share") for c in (0, 1, 3, 6, 12)] == [0.25, 0.25, 0.25, 0.5, 1.0]
    assert [fedsa_learning_rate(0.2, 4, c, 12, "share") for c in (0, 1, 2, 3)] == [0.2] * 4  # capped at eta
    assert fedsa_learning_rate(0.2, 4, 6, 12, "share") == pytest.approx(0.1)  # twice the mean: half the rate
    assert fedsa_learning_rate(0.2, 4, 12, 12, "share") == pytest.approx(0.05)  # every update: eta / N
    assert fedsa_learning_rate(0.2, 4, 0, 0, "share") == 0.2  # before any update: the uniform share
    assert fedsa_learning_rate(0.2, 4, 1, 1, "share") == pytest.approx(0.05)  # the only update so far
    assert fedsa_learning_rate(0.2, 4, 8, 12, "share") == pytest.approx(0.2 * 12 / 32)
    # "count" ignores C: the Flower code's eta / (N max(1, c_i))
    assert fedsa_participation(4, 6, 12, "count") == 6 and fedsa_learning_rate(0.2, 4, 6, 12, "count") == 0.2 / 24
