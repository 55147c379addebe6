"""Buffered concurrency (lit_asyncfl.schedulers.buffered_concurrency): buffered clients hold their place, stragglers
restart from the new model, refused settings."""

from __future__ import annotations

import pytest
from conftest import run

from lit_asyncfl.algorithms import PORT
from lit_asyncfl.schedulers import BufferedConcurrency


def test_buffered_concurrency_refuses_fewer_selected_than_the_buffer(tmp_path):
    with pytest.raises(ValueError, match=r"concurrency=3 selects 3 clients, fewer than the aggregator's buffer_size=4"):
        run(tmp_path, PORT(buffer_size=4, concurrency=3), max_versions=2)


class CheckedBufferedConcurrency(BufferedConcurrency):
    """Checks, after every processed arrival, who is selected and what happened to the stragglers."""

    def on_fit_start(self, sim):
        self.checked = self.restarted = 0
        super().on_fit_start(sim)

    def on_update(self, sim, job, aggregated):
        before = {j.job_id: j.client for j in sim.in_flight.values()}
        super().on_update(sim, job, aggregated)
        selected = sim.num_training + len(sim.server.aggregator.buffer)
        assert selected == self.count, (selected, self.count)  # buffered clients keep their place, no more
        abandoned = [c for j, c in before.items() if j not in sim.in_flight]
        for client in abandoned:  # each straggler pulled the new model at once
            (restart,) = [j for j in sim.in_flight.values() if j.client == client]
            assert restart.base_version == sim.server.version and restart.dispatch_time == sim.now
        self.restarted += len(abandoned)
        self.checked += 1


def test_buffered_clients_hold_their_place_and_stragglers_restart_from_the_new_model(tmp_path):
    algorithm = PORT(buffer_size=3, concurrency=6, staleness_bound=1)
    algorithm.scheduler = sched = CheckedBufferedConcurrency(6, max_staleness=1)
    run(tmp_path, algorithm, num_clients=10, max_versions=14, data_kwargs={"partition": "dirichlet"})
    assert sched.checked > 14 * 3 - 1 and sched.restarted == sched.abandoned > 0
