"""The data-fraction weight (lit_asyncfl.server.data_fraction, ASO-Fed) on a tiny server by hand."""

from __future__ import annotations

import torch
from builders import make_update

from lit_asyncfl.core.server import Server
from lit_asyncfl.server import DeltaAverage
from lit_asyncfl.server.data_fraction import DataFractionWeight


def test_data_fraction_step_on_a_tiny_server_by_hand():
    weight = DataFractionWeight()
    server = Server(torch.zeros(2), DeltaAverage(buffer_size=1, server_lr=1.0), [weight], num_clients=3)
    server.on_fit_start()
    server.receive(make_update(0, [2.0, 0.0], [0.0, 0.0], num_samples=10))  # n = 10: a full step
    assert torch.allclose(server.weights, torch.tensor([2.0, 0.0]))
    server.receive(make_update(1, [0.0, 4.0], [0.0, 0.0], num_samples=30))  # n = 40: 30/40 of the delta
    assert torch.allclose(server.weights, torch.tensor([2.0, 3.0]))
    server.receive(make_update(0, [3.0, 3.0], [2.0, 0.0], base_version=1, num_samples=10))  # n stays 40
    assert torch.allclose(server.weights, torch.tensor([2.25, 3.75]))
    assert weight.state_dict() == {"samples": {0: 10, 1: 30}} and weight.total == 40
    restored = DataFractionWeight()
    restored.load_state_dict(weight.state_dict())
    assert restored.total == 40
