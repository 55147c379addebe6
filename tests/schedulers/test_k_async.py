"""The K-async scheduler (lit_asyncfl.schedulers.k_async, FedHist): exactly the aggregated clients restart from the
new model."""

from __future__ import annotations

from conftest import make_trainer

from lit_asyncfl.algorithms import FedHist
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import UniformRatio
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server.base import ServerCallback


def test_k_async_restarts_exactly_the_aggregated_clients_from_the_new_model(tmp_path):
    rounds = []

    class Log(ServerCallback):
        def on_aggregated(self, server, updates):
            rounds.append((server.version, sorted(u.client for u in updates)))

    algo = FedHist(k=3, history_length=2)
    algo.server_callbacks.append(Log())
    trainer = make_trainer(tmp_path, algo, num_clients=8, max_versions=6, device_model=UniformRatio(5.0))
    trainer.fit(LeNet5(), datamodule=DigitsDataModule())
    sim = trainer.simulator
    assert all(len(c) == 3 for _, c in rounds) and sim.num_training == 8  # all train; each round took 3
    last_version, last_clients = rounds[-1]
    restarted = {j.client for j in sim.in_flight.values() if j.base_version == last_version}
    assert restarted == set(last_clients)  # only they got the new model; the others keep older ones
    assert {j.client for j in sim.in_flight.values()} == set(range(8))
