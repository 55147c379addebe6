"""FedFa's sliding-window aggregator (lit_asyncfl.server.sliding_window) on a tiny server by hand."""

from __future__ import annotations

import pytest
import torch
from builders import make_update

from lit_asyncfl.core.server import Server
from lit_asyncfl.server import (
    SlidingWindowAverage,
)
from lit_asyncfl.server.base import ServerCallback


def test_sliding_window_aggregator_waits_for_k_models_then_moves_at_every_arrival():
    agg = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), agg, [], num_clients=3)
    server.on_fit_start()
    assert not server.receive(make_update(0, [2.0], [0.0])) and server.version == 0  # warm-up
    assert server.receive(make_update(1, [4.0], [0.0])) and server.weights.item() == pytest.approx(3.0)
    assert server.receive(make_update(2, [10.0], [3.0], 1)) and server.weights.item() == pytest.approx(7.0)
    assert server.stats.aggregated == 3 and len(agg.window) == 2


class PoisonFirstStep(ServerCallback):
    """Makes the first aggregated step non-finite, so that the server refuses it."""

    def __init__(self) -> None:
        self.calls = 0

    def transform_aggregate(self, server, step, updates):
        self.calls += 1
        return step * float("inf") if self.calls == 1 else step


def test_a_refused_fedfa_model_never_enters_the_window():
    agg = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), agg, [PoisonFirstStep()], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0], [0.0]))
    assert not server.receive(make_update(1, [4.0], [0.0])) and server.stats.reasons["non_finite_aggregate"] == 2
    assert len(agg.window) == 0
    assert not server.receive(make_update(2, [6.0], [0.0])) and server.version == 0  # warm-up again
    assert server.receive(make_update(3, [10.0], [0.0])) and server.weights.item() == pytest.approx(8.0)
