"""FedCompass: a whole run replayed by hand from the recorded uploads, refused settings."""

from __future__ import annotations

import pytest
import torch
from builders import compass_run, make_update
from conftest import make_trainer

from lit_asyncfl.algorithms import FedCompass
from lit_asyncfl.core.server import Server
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server.grouped import GroupedDeltaStep


def test_fedcompass_run_replayed_from_the_recorded_uploads(tmp_path):
    trainer, log = compass_run(tmp_path, max_versions=14)
    n, alpha, a = 6, 0.9, 0.5
    sizes = [len(v["jobs"]) for v in log.versions]
    firsts = [v for v in log.versions if min(v["jobs"]) < n]  # the first jobs have ids 0..n-1
    assert len(firsts) == n and all(len(v["jobs"]) == 1 for v in firsts)  # a first update is aggregated alone
    assert max(sizes) > 1  # groups of clients did arrive together
    weights = log.versions[0]["before"].clone()
    for v in log.versions:
        assert torch.equal(v["before"], weights) or torch.allclose(v["before"], weights, atol=1e-6)
        step = torch.zeros_like(weights)
        for job_id in v["jobs"]:
            u = log.uploads[job_id]
            tau = v["version"] - u["job"].base_version
            step += alpha * (tau + 1) ** (-a) / n * (u["weights"] - u["base"])
        weights = v["before"] + step
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6)
    sched = trainer.algorithm.scheduler
    assert all(s > 0 for s in sched.speed.values()) and len(sched.speed) == n


def test_fedcompass_refuses_local_epochs_it_would_ignore(tmp_path):
    trainer = make_trainer(tmp_path, FedCompass(q_min=2, q_max=4), num_clients=6, max_versions=2, local_epochs=3)
    with pytest.raises(ValueError, match=r"local_epochs=3 would be ignored: leave local_epochs at 1 and set q_min"):
        trainer.fit(LeNet5(lr=0.05), DigitsDataModule())


@pytest.mark.parametrize("latest_per_client", [True, False])
def test_fedcompass_aggregates_one_update_per_client_its_newest_as_appfl(latest_per_client):
    assert FedCompass().aggregator.latest_per_client  # APPFL's buffers are keyed by client
    agg = GroupedDeltaStep(alpha=1.0, staleness_exponent=0.0, latest_per_client=latest_per_client)
    server = Server(torch.zeros(1), agg, [], num_clients=2)
    server.on_fit_start()
    # Client 0: two late updates (jobs 1 and 3), then its update to group 7 (job 5); client 1 in group 7 (job 4).
    for job_id, client, key, delta in [(1, 0, "general", 1.0), (3, 0, "general", 2.0), (4, 1, "7", 8.0)]:
        agg.route(job_id, key)
        server.receive(make_update(client, [delta], [0.0], job_id=job_id))
    agg.release("general", "7", server=server)
    assert server.flush()
    if latest_per_client:  # job 3 supersedes job 1: (2 + 8) / N
        assert server.weights.item() == pytest.approx((2.0 + 8.0) / 2)
        assert server.stats.discarded == 1 and server.stats.reasons == {"superseded": 1}
        assert server.stats.aggregated == 2
    else:
        assert server.weights.item() == pytest.approx((1.0 + 2.0 + 8.0) / 2)
        assert server.stats.discarded == 0 and server.stats.aggregated == 3
    # A late update and the same client's update to the group aggregated with it: the group's (newer) one only.
    agg.route(6, "general")
    server.receive(make_update(0, [4.0], [0.0], base_version=1, job_id=6))
    agg.route(9, "8")
    server.receive(make_update(0, [16.0], [0.0], base_version=1, job_id=9))
    agg.release("general", "8", server=server)
    before = server.weights.item()
    assert server.flush()
    expected = 16.0 if latest_per_client else 20.0
    assert server.weights.item() == pytest.approx(before + expected / 2)
