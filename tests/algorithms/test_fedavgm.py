"""FedAvgM: an asynchronous run replayed by hand from the recorded buffers."""

from __future__ import annotations

import torch
from conftest import global_weights, make_trainer

from lit_asyncfl.algorithms import FedAvgM
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server.base import ServerCallback


class _Recorder(ServerCallback):
    """A server callback (inserted before ServerMomentum) that records each applied aggregation."""

    def __init__(self, record) -> None:
        self.record, self.pending = record, None

    @property
    def state_key(self) -> str:
        return "review-recorder"

    def transform_aggregate(self, server, step, updates):
        self.pending = (server.weights, [(u.weights, u.base_weights) for u in updates])
        return step

    def on_aggregated(self, server, updates):
        self.record.append((*self.pending, server.weights))


def test_fedavgm_asynchronous_run_replayed_from_the_recorded_buffers(tmp_path):
    """Buffered variant: Delta_t = the unweighted mean of the buffer's w_i - w_{o(i)}, v = beta v + Delta_t,
    w += eta v (the buffered arrivals may be stale: each delta is against its own start model)."""
    lr, beta, m = 0.7, 0.6, 3
    record: list = []
    algo = FedAvgM(server_lr=lr, momentum=beta, asynchronous=True, buffer_size=m, concurrency=4)
    algo.server_callbacks.insert(0, _Recorder(record))
    trainer = make_trainer(tmp_path, algo, num_clients=8, max_versions=4)
    trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule())
    v = None
    stale = 0
    for before, uploads, after in record:
        assert len(uploads) == m
        stale += sum(not torch.equal(base, before) for _, base in uploads)
        delta = sum(w - base for w, base in uploads) / m
        v = delta if v is None else beta * v + delta
        assert torch.allclose(after, before + lr * v, rtol=1e-5, atol=1e-6)
    assert len(record) == 4 and stale > 0  # stale arrivals were part of the replay
    assert torch.equal(global_weights(trainer), record[-1][2])
