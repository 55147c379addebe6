"""Per-job numbers of local steps: every engine and executor runs the steps a scheduler assigned, and virtual time
follows them."""

from __future__ import annotations

import math

import pytest
import torch
from builders import compass_run
from conftest import global_weights, run

from lit_asyncfl.algorithms import FedCompass
from lit_asyncfl.client.ray_executor import ray_available
from lit_asyncfl.core.simulator import samples_before_step
from lit_asyncfl.schedulers.compass import CompassScheduler


def test_jobs_run_their_own_steps_and_virtual_time_follows_them(tmp_path):
    trainer, log = compass_run(tmp_path)
    sim = trainer.simulator
    steps = {u["steps"] for u in log.uploads.values()}
    assert len(steps) > 2 and min(steps) >= 2 and max(steps) <= 7  # different numbers of steps were assigned
    for u in log.uploads.values():
        job = u["job"]
        assert u["steps"] == job.num_steps == job.local_steps  # the engine ran exactly the assigned steps
        n = int(sim.num_samples[job.client])
        per_epoch = -(-n // sim.batch_size)
        assert job.local_epochs == -(-job.local_steps // per_epoch)
        # UniformRatio: compute time = time per sample x samples the steps process
        expected = sim.profiles.time_per_sample[job.client] * samples_before_step(n, sim.batch_size, job.local_steps)
        assert math.isclose(job.timing.compute, expected, rel_tol=1e-9)


@pytest.mark.parametrize("engine", ["lightning", "cohort"])
def test_every_engine_runs_the_assigned_steps_as_the_fast_one(tmp_path, engine):
    fast, log_fast = compass_run(tmp_path / "fast", max_versions=6)
    other, log_other = compass_run(tmp_path / engine, max_versions=6, engine=engine)
    assert log_fast.uploads.keys() == log_other.uploads.keys()
    for job_id, u in log_fast.uploads.items():
        v = log_other.uploads[job_id]
        assert v["steps"] == u["steps"] == u["job"].local_steps
        assert torch.allclose(u["weights"], v["weights"], atol=1e-5), job_id
    assert torch.allclose(global_weights(fast), global_weights(other), atol=1e-5)


@pytest.mark.skipif(not ray_available(), reason="ray is not installed")
def test_the_ray_executor_ships_the_job_steps(tmp_path):
    fast, log_fast = compass_run(tmp_path / "seq", max_versions=5)
    ray, log_ray = compass_run(tmp_path / "ray", max_versions=5, executor="ray")
    assert {k: u["steps"] for k, u in log_ray.uploads.items()} == {k: u["steps"] for k, u in log_fast.uploads.items()}
    assert torch.equal(global_weights(fast), global_weights(ray))


def test_a_bad_number_of_steps_is_refused_naming_it(tmp_path):
    class Bad(CompassScheduler):
        def on_fit_start(self, sim):
            sim.dispatch(0, local_steps=0)

    algo = FedCompass()
    algo.scheduler = Bad()
    with pytest.raises(ValueError, match="local_steps must be >= 1, got 0"):
        run(tmp_path, algo, num_clients=4, max_versions=2)
