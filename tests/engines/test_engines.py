"""Local-training engines: same job, same weights; kernel and thread choice; the engine argument."""

from __future__ import annotations

import importlib.metadata
import random

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import make_job, one_client_trainer
from conftest import global_weights, make_trainer, run
from lightning.fabric.utilities import registry

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedADT, FedASMU, FedAsync, FedProx
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.client.callbacks import LearningRateDecay, ProximalTerm
from lit_asyncfl.client.cohort import CohortTrainer
from lit_asyncfl.client.engines import build_executor
from lit_asyncfl.client.fast_engine import LocalTrainer
from lit_asyncfl.client.fresh_merge import FreshModelMerge
from lit_asyncfl.client.kernels import (
    ONEDNN_AUTO_MAX_BATCH,
    ONEDNN_AUTO_MAX_ELEMENTS,
    choose_onednn,
    largest_conv_input,
)
from lit_asyncfl.client.lightning_engine import LightningLocalTrainer
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import ClientShards, DigitsDataModule
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.engines.base import generator_state, restore_generators
from lit_asyncfl.models import ClassificationModule, LeNet5
from lit_asyncfl.models.resnet import ResNet20

ENGINES = {"fast": LocalTrainer, "lightning": LightningLocalTrainer}  # the per-client engines


@pytest.fixture(autouse=True)
def _restore_threads_and_kernels():
    """One thread (as the engines default to; 2 threads on a shared 2-core machine ran these tests 10x slower)."""
    threads, onednn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = onednn


class DropoutNet(L.LightningModule):
    """Dropout (draws from the default generator) and a per-epoch scheduler: exactness needs the same RNG use."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.Dropout(0.3))
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x):
        return self.head(torch.relu(self.net(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.5)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


@pytest.fixture(scope="module")
def shards():
    """Dirichlet shards: unequal sizes."""
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    dm.setup("fit")
    return dm.client_shards(12, seed=0)


def job(client: int, epochs: int, seed: int = 7) -> ClientJob:
    return ClientJob(client, client, 0, 0.0, JobTiming(0, 0, 0), seed, epochs)


def raw_sgd(model: torch.nn.Module, shards, client: int, epochs: int, seed: int, lr: float) -> torch.Tensor:
    """An independent plain-PyTorch reference: the same batches (same generator use), plain SGD."""
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for x, y in shards.batches(client, 10, generator):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


@pytest.mark.parametrize("engine", ["fast", "lightning"])
@pytest.mark.parametrize("epochs", [1, 3])
def test_engines_match_a_raw_pytorch_loop_bit_for_bit(engine, epochs, shards):
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    trainer = ENGINES[engine](model, shards, 10)
    start = trainer.flat.read()
    for client in (0, 5):  # unequal shard sizes
        reference = LeNet5(lr=0.05)
        reference.load_state_dict(model.state_dict())
        expected = raw_sgd(reference, shards, client, epochs, seed=11, lr=0.05)
        update = trainer.train(job(client, epochs, seed=11), start)
        assert not torch.equal(update.weights, start)
        assert torch.equal(update.weights, expected)
        assert update.num_steps == epochs * -(-shards.num_samples(client) // 10)


@pytest.mark.parametrize("epochs", [1, 3])
def test_fast_and_lightning_agree_with_dropout_momentum_and_a_scheduler(epochs, shards):
    torch.manual_seed(0)
    model = DropoutNet()
    fast, lightning = LocalTrainer(model, shards, 10), LightningLocalTrainer(model, shards, 10)
    start = fast.flat.read()
    for client in (1, 2, 3):
        a, b = fast.train(job(client, epochs), start), lightning.train(job(client, epochs), start)
        assert torch.equal(a.weights, b.weights)
        assert a.num_steps == b.num_steps and a.train_loss == b.train_loss and a.info == b.info
    # dropout is really drawn from the job's seed: another seed, other weights
    assert not torch.equal(fast.train(job(3, epochs, seed=8), start).weights, a.weights)


def test_client_callbacks_and_a_fresh_model_behave_the_same_under_lightning(shards):
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    results = {}
    for name, cls in ENGINES.items():
        merge = FreshModelMerge()
        merge.on_fit_start(12)
        trainer = cls(model, shards, 10, callbacks=[ProximalTerm(mu=0.1), merge])
        start = trainer.flat.read()
        fresh = start + 0.01 * torch.randn(start.shape, generator=torch.Generator().manual_seed(1))
        j = job(4, 2)
        j.request_step = 3
        merge.request_step(j)  # registers the job with the slot selector, as a dispatch does
        results[name] = (trainer.train(j, start, fresh=(fresh, 5)), merge.controls(4))
    (a, ca), (b, cb) = results["fast"], results["lightning"]
    assert "beta" in a.info and 0 < a.info["beta"] < 1
    assert torch.equal(a.weights, b.weights) and a.info["beta"] == b.info["beta"] and ca == cb


class TrainerNeedingModule(DropoutNet):
    """Uses what only a real Trainer provides: ``self.trainer`` and its own Lightning callback."""

    def __init__(self):
        super().__init__()
        self.epochs_seen: list[int] = []

    def training_step(self, batch, batch_idx):
        self.epochs_seen.append(self.trainer.current_epoch)
        return super().training_step(batch, batch_idx)

    def configure_callbacks(self):
        module = self

        class CountEpochs(L.Callback):
            def on_train_epoch_end(self, trainer, pl_module):
                module.ends = getattr(module, "ends", 0) + 1

        return [CountEpochs()]


def test_the_lightning_engine_runs_modules_that_need_a_trainer(shards):
    engine = LightningLocalTrainer(TrainerNeedingModule(), shards, 10)
    update = engine.train(job(0, 3), engine.flat.read())
    steps_per_epoch = -(-shards.num_samples(0) // 10)
    assert engine.module.epochs_seen == [e for e in range(3) for _ in range(steps_per_epoch)]
    assert engine.module.ends == 3 and update.num_steps == 3 * steps_per_epoch
    assert registry.entry_points is importlib.metadata.entry_points  # the entry-point cache is not left behind
    fast = LocalTrainer(TrainerNeedingModule(), shards, 10)  # self.trainer: the fast engine's stand-in
    fast.train(job(0, 3), fast.flat.read())
    assert fast.module.epochs_seen == engine.module.epochs_seen


@pytest.mark.parametrize("algorithm", [FedAsync, FedProx, FedASMU, FedADT], ids=lambda a: a.__name__)
def test_a_full_run_is_the_same_with_either_engine(algorithm, tmp_path):
    weights = [
        global_weights(run(tmp_path / engine, algorithm(), model_seed=0, max_versions=6, engine=engine))
        for engine in ("fast", "lightning", "fast")
    ]
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[0], weights[2])


def test_unknown_engine_and_bad_onednn_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown engine 'slow'; allowed: \['fast', 'lightning', 'cohort'\]"):
        make_trainer(tmp_path, "fedasync", max_versions=1, engine="slow")
    with pytest.raises(ValueError, match="onednn must be True, False or None, got 'no'"):
        make_trainer(tmp_path, "fedasync", max_versions=1, onednn="no")


def test_the_cli_exposes_the_engine_and_kernel_choice(tmp_path):
    cli = FederatedCLI(
        args=[
            "--config",
            "configs/quickstart.yaml",
            "--trainer.engine=lightning",
            "--trainer.onednn=false",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    assert isinstance(cli.trainer, FederatedTrainer)
    assert cli.trainer.engine == "lightning" and cli.trainer.onednn is False


def test_largest_conv_input_of_lenet_on_digits_is_computed_without_side_effects(shards):
    model = DropoutNet()  # no convolution
    assert largest_conv_input(model, next(shards.batches(0, 10, torch.Generator()))) is None
    lenet = LeNet5()
    before = torch.nn.utils.parameters_to_vector(lenet.parameters()).clone()
    rng = torch.random.get_rng_state()
    batch = [torch.zeros(10, 1, 8, 8), torch.zeros(10, dtype=torch.long)]
    # conv1 sees 10 x 1 x 8 x 8 = 640; padded by 2 it keeps 8x8, pooled to 4x4: conv2 sees 10 x 6 x 4 x 4 = 960
    assert largest_conv_input(lenet, batch) == torch.Size([10, 6, 4, 4])
    assert torch.equal(torch.random.get_rng_state(), rng) and lenet.training
    assert torch.equal(torch.nn.utils.parameters_to_vector(lenet.parameters()), before)


def test_onednn_is_switched_off_only_for_small_convolutions_unless_the_user_chooses():
    cpu = torch.device("cpu")
    lenet, batch = LeNet5(), [torch.zeros(10, 1, 8, 8), torch.zeros(10, dtype=torch.long)]
    assert choose_onednn(None, lenet, batch, cpu) is False
    assert choose_onednn(True, lenet, batch, cpu) is True
    assert choose_onednn(None, lenet, batch, torch.device("meta")) is None  # not the CPU: unchanged
    cifar = LeNet5(in_channels=3, input_size=32)
    big = [torch.zeros(10, 3, 32, 32), torch.zeros(10, dtype=torch.long)]
    assert 10 * 3 * 32 * 32 > ONEDNN_AUTO_MAX_ELEMENTS and choose_onednn(None, cifar, big, cpu) is None
    many = [torch.zeros(ONEDNN_AUTO_MAX_BATCH + 1, 1, 8, 8), torch.zeros(ONEDNN_AUTO_MAX_BATCH + 1, dtype=torch.long)]
    assert choose_onednn(None, lenet, many, cpu) is None  # small inputs, but a batch large enough for oneDNN
    few = [torch.zeros(ONEDNN_AUTO_MAX_BATCH, 1, 8, 8), torch.zeros(ONEDNN_AUTO_MAX_BATCH, dtype=torch.long)]
    assert choose_onednn(None, lenet, few, cpu) is False
    assert choose_onednn(None, DropoutNet(), [torch.zeros(10, 64)], cpu) is None


class EpochCountingLeNet(LeNet5):
    """Reads ``self.trainer.current_epoch`` in ``training_step`` (which a job's stand-in offers) and counts its steps
    in its own state."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx) * (1.0 + 0.0 * self.trainer.current_epoch)


class Raises(LeNet5):
    def training_step(self, batch, batch_idx):
        raise RuntimeError("the module's own error")


def test_the_onednn_probe_runs_on_a_copy_with_a_stand_in_trainer_and_falls_back_when_the_step_raises(shards):
    cpu = torch.device("cpu")
    batch = [torch.zeros(10, 1, 8, 8), torch.zeros(10, dtype=torch.long)]
    model = EpochCountingLeNet()
    assert choose_onednn(None, model, batch, cpu) is False  # as LeNet5's: small convolutions
    assert model.steps == 0 and model._trainer is None  # the module itself untouched
    assert choose_onednn(None, Raises(), batch, cpu) is None  # the automatic default: left as it is
    assert choose_onednn(False, Raises(), batch, cpu) is False  # the user's choice, not probed
    # Both engines build (the probe at construction) and the fast engine's module counts exactly its job's steps.
    fast = build_executor("fast", EpochCountingLeNet(), shards, 10).trainer
    assert fast.onednn is False and fast.module.steps == 0
    update = fast.train(job(0, 2), fast.flat.read())
    assert fast.module.steps == update.num_steps == 2 * -(-shards.num_samples(0) // 10)
    assert build_executor("cohort", EpochCountingLeNet(lr=0.05), shards, 10).trainer.single_job_onednn is False


@pytest.mark.parametrize("engine", ["fast", "cohort"])
def test_a_training_step_reading_the_trainers_epoch_fits(engine, tmp_path):
    trainer = run(tmp_path, FedAsync(concurrency=4), model=EpochCountingLeNet(lr=0.05), max_versions=2, engine=engine)
    assert trainer.summary["versions"] == 2 and trainer.history[-1]["version"] == 2


class RecordsKernel(LeNet5):
    def training_step(self, batch, batch_idx):
        self.flags = [*getattr(self, "flags", []), torch.backends.mkldnn.enabled]
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("onednn", [None, True, False])
def test_the_engine_applies_the_kernel_choice_during_training_only(onednn, shards):
    torch.backends.mkldnn.enabled = True
    executor = build_executor("fast", RecordsKernel(), shards, 10, onednn=onednn)
    expected = False if onednn is None else onednn  # digits batches of 10: small convolutions
    assert executor.trainer.onednn is expected
    executor.submit(job(0, 1), executor.trainer.flat.read())
    executor.result(0)
    assert set(executor.trainer.module.flags) == {expected}
    assert torch.backends.mkldnn.enabled is True


class RecordsKernelAndBatching(LeNet5):
    def training_step(self, batch, batch_idx):
        batched = torch._C._functorch.is_batchedtensor(batch[0])  # under the cohort's vmap, or a job alone
        self.flags = [*getattr(self, "flags", []), (batched, torch.backends.mkldnn.enabled)]
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("onednn", [None, True, False])
def test_the_cohort_runs_steps_of_one_job_with_the_fast_engines_kernel_choice(onednn, shards):
    """Batched steps keep oneDNN on unless the user chose (its channels-last grouped convolutions); steps run one
    job at a time take the fast engine's choice (automatic: off for these small convolutions)."""
    torch.backends.mkldnn.enabled = True
    executor = build_executor("cohort", RecordsKernelAndBatching(), shards, 10, onednn=onednn)
    engine = executor.trainer
    assert engine.single_job_onednn is (False if onednn is None else onednn)
    engine.module.flags = []
    engine.train_many([job(c, 1, seed=c) for c in range(6)], [engine.flat.read()] * 6)
    by_kind = {batched: {flag for b, flag in engine.module.flags if b == batched} for batched in (True, False)}
    assert by_kind == {True: {True if onednn is None else onednn}, False: {False if onednn is None else onednn}}
    assert torch.backends.mkldnn.enabled is True


def test_onednn_changes_fast_results_only_in_the_last_bits_and_runs_stay_deterministic(tmp_path):
    weights = {
        flag: [
            global_weights(run(tmp_path / f"{flag}{i}", "fedasync", model_seed=0, max_versions=10, onednn=flag))
            for i in range(2)
        ]
        for flag in (True, False)
    }
    for flag in (True, False):
        assert torch.equal(weights[flag][0], weights[flag][1])
    assert torch.allclose(weights[True][0], weights[False][0], rtol=0, atol=1e-5)


def test_one_thread_by_default_and_the_users_count_otherwise(tmp_path):
    torch.set_num_threads(2)
    run(tmp_path / "a", "fedasync", max_versions=1)
    assert torch.get_num_threads() == 1
    run(tmp_path / "b", "fedasync", max_versions=1, num_threads=2)
    assert torch.get_num_threads() == 2


# -- the cohort engine ---------------------------------------------------------------------------------------------


def double_shards(shards):
    """The same clients with float64 inputs: the cohort's batched kernels then agree with fast to ~1e-15."""
    indices = [i.numpy() for i in shards.indices]
    return ClientShards(shards.inputs.double(), shards.targets, indices)


@pytest.mark.parametrize("min_batched", [1, 4, 100], ids=["all-batched", "small-groups-alone", "none-batched"])
@pytest.mark.parametrize("epochs", [1, 3])
def test_the_cohort_engine_trains_unequal_shards_like_the_fast_engine(epochs, min_batched, shards):
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    fast, cohort = LocalTrainer(model, shards, 10), CohortTrainer(model, shards, 10)
    assert cohort.min_batched == 4  # the default: steps shared by fewer jobs run one job at a time, without vmap
    cohort.min_batched = min_batched
    start = fast.flat.read()
    other_start = start + 0.01  # jobs of one cohort may start from different global versions
    clients = [0, 1, 2, 3, 5, 7]
    sizes = {shards.num_samples(c) for c in clients}
    assert len(sizes) == len(clients) and any(n % 10 for n in sizes)  # unequal shards, partial last batches
    jobs = [job(c, epochs, seed=20 + c) for c in clients]
    starts = [start if k % 2 else other_start for k in range(len(jobs))]
    updates = cohort.train_many(jobs, starts)
    for j, w0, update in zip(jobs, starts, updates):
        expected = fast.train(j, w0)
        assert update.job is j and update.num_steps == expected.num_steps == epochs * -(
            -shards.num_samples(j.client) // 10
        )
        assert not torch.equal(update.weights, w0)
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=1e-6)
        assert update.train_loss == pytest.approx(expected.train_loss, abs=1e-6)


def test_in_float64_the_cohort_engine_matches_fast_to_rounding(shards):
    shards64 = double_shards(shards)
    torch.manual_seed(0)
    model = LeNet5(lr=0.05).double()
    fast, cohort = LocalTrainer(model, shards64, 10), CohortTrainer(model, shards64, 10)
    start = fast.flat.read()
    jobs = [job(c, 4, seed=30 + c) for c in range(6)]
    for update, j in zip(cohort.train_many(jobs, [start] * len(jobs)), jobs):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-12)


def test_the_cohort_engine_applies_the_proximal_term_weight_decay_and_lr_decay(shards):
    shards64 = double_shards(shards)
    torch.manual_seed(0)
    model = LeNet5(lr=0.05, weight_decay=0.01).double()
    callbacks = [ProximalTerm(mu=0.5), LearningRateDecay(0.9)]
    fast, cohort = LocalTrainer(model, shards64, 10, callbacks), CohortTrainer(model, shards64, 10, callbacks)
    start = fast.flat.read()
    jobs = [ClientJob(c, c, c, 0.0, JobTiming(0, 0, 0), 40 + c, 2) for c in range(4)]  # base versions 0..3
    plain = CohortTrainer(model, shards64, 10).train_many(jobs, [start] * 4)
    for update, j, p in zip(cohort.train_many(jobs, [start] * 4), jobs, plain):
        expected = fast.train(j, start)
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=1e-12)
        assert update.info["lr"] == pytest.approx(0.05 * 0.9**j.base_version)
        assert (update.weights - p.weights).abs().max() > 1e-4  # the terms really act


@pytest.mark.parametrize("algorithm", [FedAsync, FedProx], ids=lambda a: a.__name__)
def test_a_full_run_with_the_cohort_engine_equals_the_fast_run_within_tolerance(algorithm, tmp_path):
    def go(engine, name):
        return run(
            tmp_path / name,
            algorithm(concurrency=5) if algorithm is FedAsync else algorithm(),
            model_seed=0,
            max_versions=12,
            engine=engine,
        )

    fast, cohort, again = go("fast", "f"), go("cohort", "c"), go("cohort", "c2")
    assert max(cohort.simulator.executor.cohort_sizes) > 1 or algorithm is FedProx  # jobs really batched
    torch.testing.assert_close(global_weights(cohort), global_weights(fast), rtol=0, atol=1e-5)
    assert torch.equal(global_weights(cohort), global_weights(again))  # deterministic
    assert [r["version"] for r in cohort.history] == [r["version"] for r in fast.history]


def test_cohort_updates_are_consumed_in_virtual_time_order(tmp_path):
    device_model = UniformResponse(low=0.0, high=100.0)  # arrival order unrelated to dispatch order
    seen = {}
    for engine in ("fast", "cohort"):
        trainer = run(
            tmp_path / engine,
            FedAsync(concurrency=6),
            max_versions=15,
            device_model=device_model,
            engine=engine,
            model_seed=0,
        )
        seen[engine] = [(r["version"], r["virtual_time"]) for r in trainer.history]
        if engine == "cohort":
            assert max(trainer.simulator.executor.cohort_sizes) >= 3
    assert seen["fast"] == seen["cohort"]


def test_batch_norm_and_unsupported_training_set_ups_are_refused_with_the_way_out(shards, tmp_path):
    with pytest.raises(ValueError, match=r"BatchNorm layers .*norm='group'"):
        CohortTrainer(ResNet20(in_channels=1), shards, 10)
    CohortTrainer(ResNet20(in_channels=1, norm="group"), shards, 10)  # the GroupNorm variant is supported
    with pytest.raises(ValueError, match="one parameter group and no learning-rate scheduler"):
        CohortTrainer(DropoutNet(), shards, 10)
    with pytest.raises(ValueError, match="cannot run the client callback FreshModelMerge"):
        CohortTrainer(LeNet5(), shards, 10, callbacks=[FreshModelMerge()])
    with pytest.raises(ValueError, match="cannot run the client callback FreshModelMerge"):
        run(tmp_path, FedASMU(), max_versions=1, engine="cohort")


def test_a_group_norm_model_trains_under_the_cohort_engine_like_fast(shards):
    torch.manual_seed(0)
    model = ResNet20(in_channels=1, norm="group", groups=4)
    fast, cohort = LocalTrainer(model, shards, 10), CohortTrainer(model, shards, 10)
    start = fast.flat.read()
    jobs = [job(c, 1, seed=50 + c) for c in (0, 1)]
    for update, j in zip(cohort.train_many(jobs, [start, start]), jobs):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-5)


def test_a_cohort_run_resumes_from_a_midway_checkpoint_within_tolerance(tmp_path):
    def algorithm():
        return FedAsync(concurrency=5)

    full = run(tmp_path / "full", algorithm(), max_versions=8, engine="cohort")
    stop_at = 0.47 * full.simulator.now + 0.123
    first = run(tmp_path / "first", algorithm(), max_virtual_time=stop_at, engine="cohort")
    assert 0 < first.simulator.server.version < 8 and first.simulator.in_flight
    resumed = make_trainer(tmp_path / "resumed", algorithm(), max_versions=8, engine="cohort")
    resumed.fit(
        LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(next((tmp_path / "first").rglob("last.ckpt")))
    )
    torch.testing.assert_close(global_weights(resumed), global_weights(full), rtol=0, atol=1e-5)
    assert resumed.simulator.server.stats == full.simulator.server.stats
    assert resumed.simulator.now == full.simulator.now


class ManualSGD(LeNet5):
    """Manual optimization, which only the lightning engine runs."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        return loss


def test_the_lightning_engine_runs_manual_optimization_like_a_raw_loop(shards):
    torch.manual_seed(0)
    model = ManualSGD()
    engine = LightningLocalTrainer(model, shards, 10)
    update = engine.train(job(3, 2, seed=5), engine.flat.read())
    reference = LeNet5(lr=0.05)
    reference.load_state_dict(model.state_dict())
    assert torch.equal(update.weights, raw_sgd(reference, shards, 3, epochs=2, seed=5, lr=0.05))
    assert update.num_steps == 2 * -(-shards.num_samples(3) // 10)
    with pytest.raises(ValueError, match="manual optimization"):
        LocalTrainer(model, shards, 10)


class PlainDropout(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 10)
        )

    def training_step(self, batch, batch_idx):
        return F.cross_entropy(self.net(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_dropout_under_the_cohort_engine_is_deterministic_with_its_own_masks(shards):
    torch.manual_seed(0)
    cohort = CohortTrainer(PlainDropout(), shards, 10)
    start = cohort.flat.read()
    jobs = [job(c, 1, seed=60 + c) for c in range(4)]
    first, second = cohort.train_many(jobs, [start] * 4), cohort.train_many(jobs, [start] * 4)
    assert all(torch.equal(a.weights, b.weights) for a, b in zip(first, second))
    fast = LocalTrainer(PlainDropout(), shards, 10)  # other masks than the fast engine's (documented)
    assert not torch.equal(first[0].weights, fast.train(jobs[0], start).weights)


@pytest.mark.parametrize("make", [lambda: LeNet5(lr=0.05), PlainDropout], ids=["logging", "dropout"])
def test_cohort_plans_of_sample_indices_give_the_batches_path_bit_for_bit(make, shards):
    """Resident shards without a transform plan sample indices, gathered for all the jobs of a step at once, and
    seed the global generators for the last job only; an (identity) transform makes the cohort take the batches
    and seed every job in turn, as before: the same weights, losses and logged values, bit for bit (dropout masks,
    drawn after the seeding, included; unequal shards, so padded steps, and two epochs)."""
    indices = [i.numpy() for i in shards.indices]
    drawn = ClientShards(shards.inputs, shards.targets, indices, transform=lambda x, generator: x)
    assert shards.gathers and not drawn.gathers
    torch.manual_seed(0)
    model = make()
    gathered, batched = CohortTrainer(model, shards, 10), CohortTrainer(model, drawn, 10)
    start = gathered.flat.read()
    jobs = [job(c, 2, seed=70 + c) for c in range(6)]
    assert len({shards.num_samples(c) for c in range(6)}) > 1
    for a, b in zip(gathered.train_many(jobs, [start] * 6), batched.train_many(jobs, [start] * 6)):
        assert torch.equal(a.weights, b.weights) and not torch.equal(a.weights, start)
        assert a.train_loss == b.train_loss and a.metrics == b.metrics and a.num_steps == b.num_steps


def test_a_compiled_cohort_equals_the_eager_cohort(shards, monkeypatch):
    """torch.compile of the batched step (Inductor on the CPU): same updates within float32 rounding, for unequal
    shards and two epochs; a cohort of another size reuses the dynamic-shape compilation."""
    import torch._inductor.config

    from lit_asyncfl.models import MLP

    # compile in this thread: Inductor's worker pool would outlive the test (and trip the leaked-thread guard)
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    torch.manual_seed(0)
    model = MLP(input_dim=64, hidden_dims=(16,), lr=0.1)
    eager = CohortTrainer(model, shards, 10)
    compiled = CohortTrainer(model, shards, 10, compile=True)
    start = eager.flat.read()
    for clients in ([0, 1, 2, 3, 4, 5], [6, 7, 8]):
        jobs = [job(c, epochs=2, seed=11 + c) for c in clients]
        want = eager.train_many(jobs, [start] * len(jobs))
        got = compiled.train_many(jobs, [start] * len(jobs))
        for w, g in zip(want, got):
            assert g.num_steps == w.num_steps
            assert torch.allclose(g.weights, w.weights, atol=1e-6), float((g.weights - w.weights).abs().max())
            assert not torch.equal(g.weights, start)
            assert g.metrics.keys() == {"train_loss"}  # what MLP's training_step logs, split per job
            assert g.metrics["train_loss"] == pytest.approx(w.metrics["train_loss"], rel=1e-5)


def test_compile_cohort_needs_the_cohort_engine(tmp_path):
    with pytest.raises(ValueError, match="compile_cohort=True needs engine='cohort', got engine='fast'"):
        make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=1, compile_cohort=True)


class _ModeRecorder(ClassificationModule):
    """Records, at every training step, whether each submodule is in training mode; its training_step puts the
    dropout in evaluation mode (as a careless user might), so the next job must find it in training mode again."""

    def __init__(self) -> None:
        super().__init__(num_classes=2, lr=0.1)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Dropout(0.5), torch.nn.Linear(4, 2))
        self.modes: list[bool] = []

    def training_step(self, batch, batch_idx):
        self.modes.append(all(m.training for m in self.modules()))
        loss = super().training_step(batch, batch_idx)
        self.net[1].eval()
        return loss


class _TrainCounter(_ModeRecorder):
    """Overrides ``train`` (which may do more than set flags): it must be called at every job's start."""

    calls = 0

    def train(self, mode: bool = True):
        type(self).calls += 1
        return super().train(mode)


def test_every_job_starts_in_training_mode_and_an_overridden_train_runs_every_job():
    x, y = torch.randn(6, 3), torch.tensor([0, 1] * 3)
    for cls in (_ModeRecorder, _TrainCounter):
        trainer = one_client_trainer(cls(), [], x, y, batch_size=6)
        calls = _TrainCounter.calls
        for job_id in range(3):
            trainer.train(make_job(job_id), trainer.flat.read().clone())
        assert trainer.module.modes == [True, True, True]
        if cls is _TrainCounter:
            assert _TrainCounter.calls - calls == 3


def test_the_saved_generators_come_back_exactly_numpy_gauss_cache_included():
    np.random.seed(3)
    np.random.standard_normal()  # the legacy generator now holds a cached second Gaussian
    state = generator_state(torch.device("cpu"))
    expected = np.random.standard_normal(3), np.random.rand(2), random.random(), torch.rand(2)
    np.random.seed(9), random.seed(9), torch.manual_seed(9)
    np.random.standard_normal(5)
    restore_generators(torch.device("cpu"), state)
    again = np.random.standard_normal(3), np.random.rand(2), random.random(), torch.rand(2)
    assert np.array_equal(expected[0], again[0]) and np.array_equal(expected[1], again[1])
    assert expected[2] == again[2] and torch.equal(expected[3], again[3])
