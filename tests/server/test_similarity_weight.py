"""The similarity-and-staleness weight (lit_asyncfl.server.similarity_weight, PORT) on a tiny server by hand."""

from __future__ import annotations

import torch
from builders import cosine, make_update

from lit_asyncfl.core.server import Server
from lit_asyncfl.server import DataSizeWeight, ModelAverage, SimilarityStalenessWeight


def test_port_weights_on_a_tiny_server_by_hand():
    weight = SimilarityStalenessWeight(bound=2, similarity_weight=1.0, staleness_weight=3.0)
    server = Server(torch.zeros(2), ModelAverage(buffer_size=2), [DataSizeWeight(), weight], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0, 0.0], [0.0, 0.0], num_samples=10))
    server.receive(make_update(1, [0.0, 2.0], [0.0, 0.0], num_samples=30))
    # round 1: both fresh, similarity 1 and factor 1: p = n * (1 + 3) -> weights 10 : 30
    assert torch.allclose(server.weights, torch.tensor([0.5, 1.5]))
    assert torch.allclose(weight.last_step, torch.tensor([0.5, 1.5]))
    server.version = 3  # two more versions passed (as if other aggregations happened); the last step is kept
    w_t = server.weights
    a = make_update(2, [1.5, 1.5], [0.0, 0.0], base_version=0, num_samples=10)  # staleness 3: similarity counts
    b = make_update(3, [0.5, 3.5], [0.5, 1.5], base_version=2, num_samples=10)  # staleness 1: similarity 1
    server.receive(a)
    server.receive(b)
    sim_a = (1 + cosine(torch.tensor([0.5, 1.5]), torch.tensor([1.5, 1.5]) - w_t)) / 2
    p_a = 10 * (sim_a + 3 * 2 / (3 + 2))
    p_b = 10 * (1.0 + 3 * 2 / (1 + 2))
    expected = (p_a * torch.tensor([1.5, 1.5]) + p_b * torch.tensor([0.5, 3.5])) / (p_a + p_b)
    assert torch.allclose(server.weights, expected)
