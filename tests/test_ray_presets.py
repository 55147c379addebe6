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
    here = os.path.dirname(__file__)
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
