"""The engines and executors on a CUDA device: the same results as on the CPU, within the rounding of another
device's kernels (skipped where no GPU is visible; run on a lent GPU with ``pytest tests/test_cuda.py``)."""

from __future__ import annotations

import pytest
import torch
from conftest import make_trainer

from lit_asyncfl.algorithms import FedAsync, FedBuff
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import ClientShards, DigitsDataModule
from lit_asyncfl.engines import CohortTrainer, LocalTrainer
from lit_asyncfl.executors import build_executor
from lit_asyncfl.models import LeNet5

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def deterministic_cudnn():
    """cuDNN's deterministic kernels, no autotuning: bit-for-bit checks on the GPU hold on any card, not only where
    the default kernels happen to be deterministic (restored afterwards)."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.fixture(scope="module")
def shards() -> ClientShards:
    """Dirichlet shards: unequal sizes, so unequal numbers of steps and smaller last batches in a cohort."""
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    dm.setup("fit")
    return dm.client_shards(12, seed=0)


def jobs(n: int, epochs: int = 1) -> list[ClientJob]:
    """Jobs of clients ``0..n-1``, each with a seed of its own, all from version 0."""
    return [ClientJob(c, c, 0, 0.0, JobTiming(0, 0, 0), 1000 + c, epochs) for c in range(n)]


def updates(executor, start: torch.Tensor, todo: list[ClientJob]) -> list[torch.Tensor]:
    """Every job in flight at once (a cohort engine batches them), the updates' weights on the CPU."""
    for job in todo:
        executor.submit(job, start)
    return [executor.result(job.job_id).weights.cpu() for job in todo]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` in float64."""
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_the_fast_engine_on_cuda_trains_the_cpus_jobs(shards):
    """Same jobs, same start weights, same batch order: the GPU's kernels round otherwise (float32: ~1e-6 relative
    after a job's dozen steps), nothing else differs; a second pass on the GPU repeats the first bit for bit."""
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    cpu = build_executor("fast", model, shards, 10)
    gpu = build_executor("fast", model, shards, 10, device="cuda")
    start = cpu.trainer.flat.read()
    assert gpu.trainer.flat.read().device.type == "cuda" and gpu.trainer.shards.inputs.device.type == "cuda"
    on_cpu = updates(cpu, start, jobs(12, epochs=2))
    on_gpu = updates(gpu, start.cuda(), jobs(12, epochs=2))
    again = updates(gpu, start.cuda(), jobs(12, epochs=2))
    for a, b, c in zip(on_gpu, on_cpu, again, strict=True):
        assert relative(a, b) < 1e-4
        assert torch.equal(a, c)
    assert max(relative(a, start) for a in on_gpu) > 1e-2  # (the jobs did train)


def test_the_lightning_engine_on_cuda_trains_the_fast_engines_jobs(shards):
    """A ``lightning.Trainer`` per job on the GPU (the device ``"cuda"``, without an index, as ``accelerator="cuda"``
    gives it): the ``fast`` engine's updates on the same GPU, bit for bit, as on the CPU."""
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    fast = build_executor("fast", model, shards, 10, device="cuda")
    lightning = build_executor("lightning", model, shards, 10, device="cuda")
    start = fast.trainer.flat.read()
    for a, b in zip(updates(lightning, start, jobs(4)), updates(fast, start, jobs(4)), strict=True):
        assert torch.equal(a, b)


def test_the_cohort_engine_on_cuda_equals_fast_on_cuda_in_float64(shards):
    """Unequal shards in one batched call per step (padding, jobs sitting out) on the GPU: each job's update equals
    the ``fast`` engine's on the same GPU to float64 rounding, as on the CPU."""
    torch.manual_seed(0)
    model = LeNet5(lr=0.05).double()
    data = ClientShards(shards.inputs.double(), shards.targets, [i.numpy() for i in shards.indices]).to("cuda")
    fast, cohort = LocalTrainer(model, data, 10, device="cuda"), CohortTrainer(model, data, 10, device="cuda")
    cohort.min_batched = 1  # every step batched, even a lone job's
    start = fast.flat.read()
    todo = jobs(12, epochs=2)
    by_cohort = cohort.train_many(todo, [start] * len(todo))
    assert {u.weights.device.type for u in by_cohort} == {"cuda"}
    for job, update in zip(todo, by_cohort, strict=True):
        alone = fast.train(job, start)
        assert update.num_steps == alone.num_steps
        assert relative(update.weights, alone.weights) < 1e-12
        assert relative(update.weights, start) > 1e-2  # (the job did train)


@pytest.mark.parametrize("engine", ["fast", "cohort"])
def test_a_run_on_cuda_repeats_itself_and_follows_the_cpus(tmp_path, engine):
    """A whole FedBuff run on the GPU: the same seed gives the same weights bit for bit, and the run stays within
    float32 rounding of the CPU's (a few steps' worth of rounding after 8 versions)."""

    def final(accelerator: str, folder: str) -> torch.Tensor:
        trainer = make_trainer(
            tmp_path / folder, FedBuff(buffer_size=3, concurrency=5), max_versions=8, seed=0, engine=engine,
            accelerator=accelerator, checkpoint_every_seconds=None,
        )  # fmt: skip
        model = LeNet5(lr=0.05)
        trainer.fit(model, DigitsDataModule(partition="dirichlet", alpha=0.5))
        assert trainer.summary["updates_received"] >= 24
        assert trainer.simulator is not None
        assert trainer.simulator.server.weights.device.type == accelerator  # (the run did use the device asked)
        return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])

    first, second, cpu = final("cuda", "a"), final("cuda", "b"), final("cpu", "c")
    assert torch.equal(first, second)
    assert relative(first, cpu) < 1e-3


def test_ray_gpu_workers_give_the_sequential_gpu_runs_weights(tmp_path):
    """FedAsync on two Ray workers sharing the GPU: the same jobs as the sequential executor on the same GPU, so the
    same weights bit for bit (cuDNN's deterministic kernels, which the workers take over from this process: the
    module's fixture)."""
    ray = pytest.importorskip("ray")
    from lit_asyncfl.executors import RayExecutor

    if ray.is_initialized():  # (another test's Ray)
        ray.shutdown()
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    try:

        def final(executor, folder: str) -> torch.Tensor:
            extra = {} if executor is None else {"executor": executor}
            trainer = make_trainer(
                tmp_path / folder, FedAsync(concurrency=4), max_versions=12, seed=0, accelerator="cuda",
                checkpoint_every_seconds=None, **extra,
            )  # fmt: skip
            model = LeNet5(lr=0.05)
            trainer.fit(model, DigitsDataModule(partition="dirichlet", alpha=0.5))
            if executor is not None:  # every job trained on the GPU workers
                assert executor._worker_device == "cuda"
                stats = trainer.summary["executor"]
                assert stats["jobs_local"] == 0 and stats["jobs_remote"] >= trainer.summary["updates_received"] > 0
            return torch.cat([p.detach().flatten().cpu() for p in model.parameters()])

        sequential = final(None, "sequential")
        on_ray = final(RayExecutor(num_workers=2, num_gpus_per_worker=0.5), "ray")
        assert torch.equal(sequential, on_ray)
    finally:
        from lit_asyncfl.executors.ray import release_workers

        release_workers()
        ray.shutdown()
