"""The adaptive server optimizer (lit_asyncfl.server.adaptive_optimizer, FADAS) on a tiny server."""

from __future__ import annotations

import pytest
import torch
from builders import make_update

from lit_asyncfl.core.server import Server
from lit_asyncfl.functional.adaptive import amsgrad_direction
from lit_asyncfl.server import (
    AdaptiveServerOptimizer,
    DeltaAverage,
)


def test_adaptive_optimizer_commits_its_moments_only_when_the_step_is_applied():
    opt = AdaptiveServerOptimizer(server_lr=0.1, delay_threshold=1)
    server = Server(torch.zeros(2), DeltaAverage(1), [opt], num_clients=2)
    server.on_fit_start()
    server.version = 3
    assert server.receive(make_update(0, [0.5, -0.2], [0.0, 0.0], base_version=0))  # staleness 3 > 1
    assert opt.steps == 1 and opt.last_lr == pytest.approx(0.1 / 3)
    expected = amsgrad_direction(torch.tensor([0.5, -0.2]), *[torch.zeros(2)] * 3, 1).direction * (0.1 / 3)
    assert torch.allclose(server.weights, expected)
    before = opt.state_dict()
    huge = make_update(1, [3e38, 0.0], [-3e38, 0.0], base_version=1)  # a finite upload whose delta overflows
    assert not server.receive(huge) and server.stats.reasons["non_finite_aggregate"] == 1
    assert opt.steps == 1 and torch.equal(opt.first_moment, before["first_moment"])  # learned nothing
