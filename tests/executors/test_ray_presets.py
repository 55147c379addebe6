"""Every preset on Ray gives the sequential executor's weights bit for bit (CPU), its jobs trained on the workers:
per-client state travels with the jobs (MOON, FedDyn, ASO-Fed, FedSA) and jobs that ask the server mid-training
(FedASMU) train in two parts; checkpoints resume exactly across executors.

One local Ray with two CPUs for the module; workers are reused from run to run. Small runs (16 clients, a few
versions, a logistic regression where the preset allows): the whole file takes about a minute on two cores.
"""

from __future__ import annotations

import os

import pytest
import torch

ray = pytest.importorskip("ray", reason="the Ray executor needs the ray extra: pip install 'lit-asyncfl[ray]'")

from conftest import global_weights, make_trainer  # noqa: E402

from lit_asyncfl.algorithms import PRESETS  # noqa: E402
from lit_asyncfl.client_callbacks import ClientCallback  # noqa: E402
from lit_asyncfl.data import DigitsDataModule  # noqa: E402
from lit_asyncfl.executors import RayExecutor, release_workers  # noqa: E402
from lit_asyncfl.mobility import MobileEdgeDevices  # noqa: E402
from lit_asyncfl.models import MLP, LogisticRegression  # noqa: E402
from lit_asyncfl.rl import FixedAction  # noqa: E402

#: Presets whose defaults do not fit 16 clients and a few versions (as in test_availability): FedCompass's jobs are
#: 20-100 steps, FedSA and PORT buffer more arrivals than 16 clients give in a few versions; ASFL's untrained SAC
#: agent takes 20 s (a fixed action tests the executor as well).
SMALL = {
    "asfl": {"controller": FixedAction(2, 1), "selected": 4},
    "fedcompass": {"q_min": 2, "q_max": 4},
    "fedsa": {"buffer_size": 4},
    "port": {"buffer_size": 2},
}

#: Presets whose client callbacks carry state or talk to the server mid-training (they trained in the simulation's
#: process before issue 30).
CARRYING = ("fedasmu", "fedasmu-da", "moon", "feddyn", "asofed", "fedsa")


@pytest.fixture(scope="module")
def local_ray():
    """Ray on this machine with two CPUs; the tests' module is importable on the workers."""
    if ray.is_initialized():  # pragma: no cover (another module's Ray)
        ray.shutdown()
    here = os.path.dirname(os.path.dirname(__file__))  # tests/: this module is executors.test_ray_presets
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )  # fmt: skip
    yield
    release_workers()
    ray.shutdown()


def fit(tmp_path, name, executor=None, ckpt_path=None, max_versions=4, **kwargs):
    """A small run of preset ``name`` (sequential unless an ``executor`` is given)."""
    algorithm = PRESETS[name](**SMALL.get(name, {}))
    semi = type(algorithm.scheduler).__name__ == "SemiAsyncRounds"
    if executor is not None:
        kwargs["executor"] = executor
    trainer = make_trainer(
        tmp_path, algorithm, num_clients=16, max_versions=max_versions, max_virtual_time=1e6,
        checkpoint_every_seconds=None, device_model=MobileEdgeDevices() if semi else None, **kwargs,
    )  # fmt: skip
    torch.manual_seed(0)
    model = MLP(input_dim=64, hidden_dims=(16,)) if name == "moon" else LogisticRegression(input_dim=64)
    trainer.fit(model, datamodule=DigitsDataModule(), ckpt_path=ckpt_path)
    return trainer


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_on_ray_gives_the_sequential_weights_with_its_jobs_on_the_workers(tmp_path, local_ray, name):
    sequential = fit(tmp_path / "seq", name)
    on_ray = fit(tmp_path / "ray", name, RayExecutor(num_workers=2))
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["versions"] == sequential.summary["versions"]
    assert on_ray.summary["updates_received"] == sequential.summary["updates_received"] > 0
    stats = on_ray.summary["executor"]
    assert stats["jobs_local"] == 0 and stats["jobs_remote"] >= on_ray.summary["updates_received"]


@pytest.mark.parametrize("name", ["fedasmu", "moon", "asofed"])
def test_training_locally_beside_a_worker_keeps_carried_state_and_two_part_jobs_exact(tmp_path, local_ray, name):
    sequential = fit(tmp_path / "seq", name)
    on_ray = fit(tmp_path / "ray", name, RayExecutor(num_workers=1, train_locally=True))
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["executor"]["jobs_local"] == 0


@pytest.mark.parametrize(("name", "first", "second"), [("fedasmu", "sequential", "ray"), ("moon", "ray", "sequential")])
def test_a_run_with_carried_state_resumes_exactly_across_executors(tmp_path, local_ray, name, first, second):
    def executor(kind):
        return RayExecutor(num_workers=2) if kind == "ray" else "sequential"

    full = fit(tmp_path / "full", name, max_versions=6)
    half = fit(tmp_path / "half", name, executor(first), max_versions=3)
    assert half.simulator.in_flight  # jobs in flight at the checkpoint: resubmitted at the resume
    ckpt = next((tmp_path / "half").rglob("last.ckpt"))
    resumed = fit(tmp_path / "resumed", name, executor(second), max_versions=6, ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))


@pytest.mark.parametrize("where", ["parked", "elsewhere"])
def test_a_job_parked_at_its_request_while_another_trains_ends_as_if_trained_whole(where):
    """Parts on a _JobRunner (the first, another job trained whole on the same runner, the merge with the server's
    answer computed once: on the parked job's own engine, or on another runner from the job's state at its request
    and put in place of the merge where the job is parked; then the rest) give the engine's one-go training: the same
    weights and update info, and what FedASMU's merge learned, handed back at the merge."""
    from lit_asyncfl.core.update import ClientJob, JobTiming
    from lit_asyncfl.executors.factory import make_local_trainer
    from lit_asyncfl.executors.ray.worker import _JobRunner

    merge = PRESETS["fedasmu"]().client_callbacks[0]
    merge.on_fit_start(4)
    dm = DigitsDataModule()
    dm.prepare_data(), dm.setup("fit")
    shards = dm.client_shards(4, 0, torch.device("cpu"))
    model = LogisticRegression(input_dim=64)
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    fresh = (start + 0.01, 3)

    def engine(callbacks):
        return make_local_trainer("fast", model, shards, 10, callbacks, False, False, torch.device("cpu"))

    def job(job_id, client):
        made = ClientJob(job_id=job_id, client=client, base_version=0, dispatch_time=0.0, seed=job_id + 7,
                         timing=JobTiming(1.0, 1.0, 1.0), local_epochs=2, num_steps=8)  # fmt: skip
        made.request_step = merge.request_step(made)
        return made

    first, second = job(0, 1), job(1, 2)
    states = [merge.job_state(first)], [merge.job_state(second)]
    runner = _JobRunner(engine([merge]))
    point = runner.first_part(first, start, states[0])
    other, _ = runner.train(second, start, states[1])
    computed = []
    if where == "parked":
        learned = runner.merge(first, fresh)
        parted, results = runner.resume(first)
    else:
        elsewhere = _JobRunner(engine([merge]))
        elsewhere.train(second, start, states[1])  # (its engine holds another job's weights: the point replaces them)
        learned, merged = elsewhere.learn_merge(first, point, states[0], fresh)
        parked = runner.parked[first.job_id][0].callbacks[0]
        parked.on_fresh_model = lambda *args: computed.append(args)  # (computed once: never again where it is parked)
        parted, results = runner.resume(first, merged)
    assert learned[0] is not None and merge.controls(1) == (merge.gamma0, merge.upsilon0)  # not learned here
    again, _ = runner.train(second, start, states[1])
    assert results == [None] and not runner.parked and not computed
    whole = engine([merge]).train(first, start, fresh)  # the sequential way (learns: the run's own callback)
    assert torch.equal(parted.weights, whole.weights) and parted.info["beta"] == whole.info["beta"]
    assert list(parted.info) == list(whole.info) and torch.equal(parted.info["merge_jump"], whole.info["merge_jump"])
    assert merge.controls(1) == learned[0][0]
    assert torch.equal(other.weights, engine([merge]).train(second, start, None).weights)
    assert torch.equal(again.weights, other.weights)


def test_jobs_that_must_stay_in_this_process_are_named_at_fit_start(tmp_path, local_ray, caplog):
    class CountsJobs(ClientCallback):  # state across jobs, not declared: its jobs cannot leave
        def __init__(self):
            self.jobs = 0

        def on_train_end(self, trainer, job, update):
            self.jobs += 1

    algorithm = PRESETS["fedasync"]()
    algorithm.client_callbacks.append(CountsJobs())
    trainer = make_trainer(tmp_path / "a", algorithm, max_versions=2, executor=RayExecutor(num_workers=1))
    with caplog.at_level("WARNING", logger="lit_asyncfl"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert "CountsJobs" in caplog.text and "declare neither runs_on_workers nor carries_state" in caplog.text
    assert trainer.summary["executor"]["jobs_remote"] == 0 < trainer.summary["executor"]["jobs_local"]
    caplog.clear()
    executor = RayExecutor(num_workers=1)  # an engine that cannot split a job at its request (as "lightning")
    with caplog.at_level("WARNING", logger="lit_asyncfl"):
        executor.start(lambda device: WholeJobsOnly(), torch.device("cpu"), PRESETS["fedasmu"]().client_callbacks)
    executor.stop()
    assert "FreshModelMerge that ask the server mid-training: with WholeJobsOnly they train whole" in caplog.text


class WholeJobsOnly:
    """A stand-in engine without ``train_parts``."""

    def __init__(self) -> None:
        self.device, self.callbacks = torch.device("cpu"), []
