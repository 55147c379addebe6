"""The cohort engine's padded steps: one batched call per local step whatever the clients' shard sizes, with the
``fast`` engine's results (smaller batches padded with zero-weight samples, finished jobs sitting out)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import global_weights, run
from torch import nn
from torch.utils.data import TensorDataset

from lit_asyncfl.algorithms import FedAvg
from lit_asyncfl.client_callbacks import LearningRateDecay, ProximalTerm
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import ClientShards, DatasetShards, DigitsDataModule
from lit_asyncfl.engines import CohortTrainer, LocalTrainer
from lit_asyncfl.engines.cohort import _CohortLogs
from lit_asyncfl.models import MLP, LeNet5

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shards():
    """Dirichlet shards: unequal sizes, so unequal numbers of steps and smaller last batches."""
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10)
    dm.setup("fit")
    return dm.client_shards(12, seed=0)


def double(shards: ClientShards) -> ClientShards:
    return ClientShards(shards.inputs.double(), shards.targets, [i.numpy() for i in shards.indices])


def job(client: int, epochs: int, seed: int, base_version: int = 0) -> ClientJob:
    return ClientJob(client, client, base_version, 0.0, JobTiming(0, 0, 0), seed, epochs)


def engines(model, shards, callbacks=(), min_batched=1):
    """The fast and cohort engines of ``model`` (the cohort batching every step, its calls counted) and the start
    weights."""
    fast, cohort = LocalTrainer(model, shards, 10, callbacks), CohortTrainer(model, shards, 10, callbacks)
    cohort.min_batched = min_batched
    return fast, cohort, CountCalls(cohort), fast.flat.read()


class CountCalls:
    """Counts the batched calls of a cohort engine and the jobs in each."""

    def __init__(self, cohort: CohortTrainer) -> None:
        self.sizes: list[int] = []
        for name in ("_step", "_padded_step"):
            setattr(cohort, name, self.wrap(getattr(cohort, name)))

    def wrap(self, step):
        def counted(params, *args):
            self.sizes.append(next(iter(params.values())).shape[0])
            return step(params, *args)

        return counted


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("epochs", [1, 2])
def test_unequal_shards_train_in_one_call_per_step_with_the_fast_engines_weights(epochs, dtype, shards):
    """In float64 the cohort equals fast to rounding (1e-12). In float32 the engines compute the same piecewise-linear
    function with sums in another order (~1e-7 apart), so they agree within 1e-6 until a step where a ReLU input or
    the gap between a max-pool window's two largest values is within that rounding of 0: there the kernels' rounding
    may pick the other side (another gradient mask), after which the job's path differs by ~1e-4 (here client 9 at
    its 16th step, a ReLU input of 6e-9 in fast's run; the smallest elsewhere is 2e-7). So in float32 every job is
    checked at 1e-6 up to the first step where fast's run comes within 1e-6 of such a switch (:func:`near_switch`,
    found independently of the cohort: the job is rerun with that many steps; most jobs never do and are checked
    whole), and the whole run only loosely (2e-3), against gross errors."""
    torch.manual_seed(0)
    model, data = (LeNet5(lr=0.05), shards) if dtype == torch.float32 else (LeNet5(lr=0.05).double(), double(shards))
    tolerance = 2e-3 if dtype == torch.float32 else 1e-12
    fast, cohort, calls, start = engines(model, data)  # every step batched, even those of a single job
    assert cohort.no_padding_because is None  # a mean-reduced cross-entropy: padding is exact
    clients = list(range(12))
    sizes = [shards.num_samples(c) for c in clients]
    steps = [-(-n // 10) for n in sizes]
    assert len(set(steps)) >= 3 and any(n % 10 for n in sizes)  # unequal steps and smaller last batches
    jobs = [job(c, epochs, seed=20 + c) for c in clients]
    starts = [start + 0.01 * (k % 3) for k in range(len(jobs))]  # jobs may start from different global versions
    updates = cohort.train_many(jobs, starts)
    # One call per local step of the longest job; the k-th call holds the jobs with more than k steps.
    total = [epochs * s for s in steps]
    if epochs == 1:
        assert calls.sizes == [sum(s > k for s in total) for k in range(max(total))]
    else:  # E > 1: jobs of unequal shards are at other epochs and batch indices: grouped by them (documented)
        assert len(calls.sizes) < sum(total)
    # Both convolutions and poolings, the three linear layers and the loss of every call of 2 jobs or more ran over
    # the jobs at once (cohort_kernels); a single job ran vmap's own rules.
    batched = sum(k > 1 for k in calls.sizes)
    assert cohort.batched.kernels.routed == {
        "conv2d": 2 * batched,
        "max_pool2d": 2 * batched,
        "linear": 3 * batched,
        "cross_entropy": batched,
    }
    for j, w0, update in zip(jobs, starts, updates):
        expected = fast.train(j, w0)
        assert update.job is j and update.num_steps == expected.num_steps == epochs * -(
            -shards.num_samples(j.client) // 10
        )
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=tolerance)
        losses = max(tolerance, 1e-6)  # the logged means are float32 (Lightning's), as under fast
        assert update.train_loss == pytest.approx(expected.train_loss, abs=losses)
        assert update.metrics["train_loss"] == pytest.approx(expected.metrics["train_loss"], abs=losses)
    if dtype == torch.float32:  # every job exact to rounding on its steps before any switch is within rounding
        cut = [replace(j, local_steps=near_switch(model, data, j, w0, 1e-6)) for j, w0 in zip(jobs, starts)]
        checked = [u.num_steps if j.local_steps is None else j.local_steps for j, u in zip(cut, updates)]
        assert sum(checked) > sum(u.num_steps for u in updates) / 2  # not vacuous: most steps are checked strictly
        for j, w0, update in zip(cut, starts, cohort.train_many(cut, starts)):
            torch.testing.assert_close(update.weights, fast.train(j, w0).weights, rtol=0, atol=1e-6)


def near_switch(model, shards, job, start, margin):
    """The first local step (0-based) of ``job`` under ``fast`` at which a ReLU input, or the gap between the two
    largest values of a max-pool window whose maximum is positive, is nonzero and within ``margin`` of 0 (where
    rounding may switch the gradient's path), or ``None`` when no step comes that close."""
    fast, close = LocalTrainer(model, shards, 10), []

    def relu(module, args):
        x = args[0].detach()
        close[-1] |= bool(((x != 0) & (x.abs() < margin)).any())

    def pool(module, args):
        x = args[0].detach()
        k = module.kernel_size * module.kernel_size  # LeNet5's square windows
        windows = F.unfold(x, module.kernel_size, stride=module.stride).view(*x.shape[:2], k, -1)
        top = windows.topk(2, dim=2).values
        gap = (top[:, :, 0] - top[:, :, 1])[top[:, :, 0] > 0]
        close[-1] |= bool(((gap != 0) & (gap < margin)).any())

    for m in fast.module.modules():
        if isinstance(m, (torch.nn.ReLU, torch.nn.MaxPool2d)):
            m.register_forward_pre_hook(relu if isinstance(m, torch.nn.ReLU) else pool)
    step = fast.module.training_step
    fast.module.training_step = lambda batch, i: close.append(False) or step(batch, i)
    fast.train(job, start)
    return close.index(True) if True in close else None


def test_padded_steps_in_float64_equal_fast_to_rounding_also_under_weight_decay_prox_and_lr_decay(shards):
    """Weight decay would change a finished job's weights if it did not sit out its cohort's remaining steps."""
    torch.manual_seed(0)
    callbacks = [ProximalTerm(mu=0.5), LearningRateDecay(0.9)]
    fast, cohort, calls, start = engines(LeNet5(lr=0.05, weight_decay=0.05).double(), double(shards), callbacks)
    assert cohort.no_padding_because is None
    jobs = [job(c, 1, seed=40 + c, base_version=c % 3) for c in range(12)]
    updates = cohort.train_many(jobs, [start] * len(jobs))
    assert len(calls.sizes) == max(u.num_steps for u in updates) and min(calls.sizes) < len(jobs)  # some sat out
    for update, j in zip(updates, jobs):
        expected = fast.train(j, start)
        assert update.num_steps == expected.num_steps
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=1e-12)


class SummedLoss(LeNet5):
    """A sum-reduced loss: padding with zero-weight samples would divide it by the wrong count."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y, reduction="sum") * 0.01


class CoupledLoss(LeNet5):
    """A loss that couples a batch's samples (centred logits): not a mean of per-sample terms."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        return F.cross_entropy(out - out.mean(0), y)


@pytest.mark.parametrize("module", [SummedLoss, CoupledLoss])
def test_a_loss_that_is_not_a_per_sample_mean_is_not_padded_and_still_matches_fast(module, shards):
    torch.manual_seed(0)
    fast, cohort, calls, start = engines(module(lr=0.05), shards)
    assert "not the mean of its per-sample values" in cohort.no_padding_because
    jobs = [job(c, 1, seed=60 + c) for c in range(8)]
    updates = cohort.train_many(jobs, [start] * len(jobs))
    assert len(calls.sizes) > max(u.num_steps for u in updates)  # grouped by batch shape instead
    for update, j in zip(updates, jobs):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-6)


class IgnoredLabel(LeNet5):
    """A mean-reduced loss ignoring one label: nll_loss divides by the samples whose target is not ignored (and a
    sample alone with that target has the loss 0/0), what zero-weight padding with 1/n weights does not give."""

    ignored, loss = 2, "cross_entropy"

    def training_step(self, batch, batch_idx):
        x, y = batch
        if self.loss == "nll_loss":
            loss = F.nll_loss(F.log_softmax(self(x), 1), y, ignore_index=self.ignored)
        else:
            loss = nn.CrossEntropyLoss(ignore_index=self.ignored)(self(x), y)  # F.cross_entropy inside
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_an_ignore_index_some_client_holds_is_not_padded_and_equals_fast(loss, shards, monkeypatch):
    """The ignored label is in client 0's data but not in the largest client's first batch (the batch the padding
    probe runs on, where it would pass): the data is searched, padding refused, and the jobs equal fast (float64)."""
    monkeypatch.setattr(IgnoredLabel, "loss", loss)
    torch.manual_seed(0)
    fast, cohort, calls, start = engines(IgnoredLabel(lr=0.05).double(), double(shards))
    assert IgnoredLabel.ignored not in cohort._probe_batch()[1]  # the probe's batch alone would not show it
    assert IgnoredLabel.ignored in shards.targets[shards.indices[0]]
    refusal = cohort.no_padding_because
    assert f"{loss} ignores the target 2 (ignore_index)" in refusal and "grouped by batch shape" in refusal
    jobs = [job(c, 1, seed=80 + c) for c in range(12)]
    updates = cohort.train_many(jobs, [start] * len(jobs))
    assert len(calls.sizes) > max(u.num_steps for u in updates)  # grouped by batch shape
    for update, j in zip(updates, jobs):
        expected = fast.train(j, start)
        torch.testing.assert_close(update.weights, expected.weights, rtol=0, atol=1e-12)
        assert update.metrics["train_loss"] == pytest.approx(expected.metrics["train_loss"], rel=1e-12)


def test_the_default_ignore_index_on_ordinary_labels_still_pads(shards):
    """ignore_index=-100 (the default) with labels 0-9: nothing to ignore, so padding stays on (one call a step)."""
    torch.manual_seed(0)
    _fast, cohort, calls, start = engines(LeNet5(lr=0.05).double(), double(shards))
    assert cohort.batched.ignore_indexes == {-100: "cross_entropy"}  # seen by the probe, not found in the data
    assert cohort.no_padding_because is None
    updates = cohort.train_many([job(c, 1, seed=c) for c in range(12)], [start] * 12)
    assert len(calls.sizes) == max(u.num_steps for u in updates)


def test_an_ignore_index_in_data_read_from_a_dataset_refuses_padding(shards):
    """Data read from a dataset at each draw cannot be searched at construction: padding is refused outright."""
    dataset = TensorDataset(shards.inputs, shards.targets)
    data = DatasetShards(dataset, [i.numpy() for i in shards.indices])
    cohort = CohortTrainer(LeNet5(lr=0.05), data, 10)
    assert "ignores the target -100" in cohort.no_padding_because
    assert "(DatasetShards) cannot be searched" in cohort.no_padding_because


def test_a_whole_padded_run_equals_fast_within_tolerance_and_is_deterministic(tmp_path):
    def go(engine, name):
        return run(
            tmp_path / name,
            FedAvg(clients_per_round=8),
            model_seed=0,
            max_versions=3,
            engine=engine,
            data_kwargs={"partition": "dirichlet", "alpha": 0.5},
        )

    fast, cohort, again = go("fast", "f"), go("cohort", "c"), go("cohort", "c2")
    assert cohort.simulator.executor.cohort_sizes == [8, 8, 8]  # a round's jobs in one cohort
    torch.testing.assert_close(global_weights(cohort), global_weights(fast), rtol=0, atol=1e-5)
    assert torch.equal(global_weights(cohort), global_weights(again))


class ConfiguredSGD(LeNet5):
    """LeNet-5 with any SGD settings."""

    def __init__(self, **sgd):
        super().__init__(lr=0.05)
        self.sgd = sgd

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, **self.sgd)


@pytest.mark.parametrize(
    "sgd",
    [
        {"momentum": 0.9},
        {"momentum": 0.5, "dampening": 0.3, "weight_decay": 0.01},
        {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    ],
    ids=["momentum", "dampening", "nesterov"],
)
@pytest.mark.parametrize("epochs", [1, 2])
def test_momentum_sgd_runs_as_batched_buffers_equal_to_fast(sgd, epochs, shards):
    """One momentum buffer per job, started at its first step; with two epochs jobs of unequal shards step in
    groups that are not the first rows (the gather/scatter path of the buffers)."""
    shards64 = double(shards)
    torch.manual_seed(0)
    fast, cohort, _, start = engines(ConfiguredSGD(**sgd).double(), shards64, min_batched=2)
    jobs = [job(c, epochs, seed=70 + c) for c in range(10)]
    plain = CohortTrainer(ConfiguredSGD().double(), shards64, 10).train_many(jobs, [start] * len(jobs))
    for update, j, p in zip(cohort.train_many(jobs, [start] * len(jobs)), jobs, plain):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-12)
        assert (update.weights - p.weights).abs().max() > 1e-4  # momentum really acts


def test_maximizing_sgd_is_refused_naming_the_fast_engine(shards):
    with pytest.raises(ValueError, match=r"got maximize=True; use engine='fast'"):
        CohortTrainer(ConfiguredSGD(maximize=True), shards, 10)


class ConfiguredAdam(LeNet5):
    """LeNet-5 with Adam or AdamW."""

    def __init__(self, optimizer=torch.optim.Adam, **settings):
        super().__init__(lr=0.01)
        self.optimizer, self.settings = optimizer, settings

    def configure_optimizers(self):
        return self.optimizer(self.parameters(), lr=0.01, **self.settings)


@pytest.mark.parametrize(
    ("optimizer", "settings"),
    [
        (torch.optim.Adam, {}),
        (torch.optim.Adam, {"weight_decay": 0.01, "betas": (0.8, 0.99), "eps": 1e-6}),
        (torch.optim.AdamW, {"weight_decay": 0.05}),
    ],
    ids=["adam", "adam-l2", "adamw"],
)
@pytest.mark.parametrize("epochs", [1, 2])
def test_adam_runs_as_batched_moments_equal_to_fast(optimizer, settings, epochs, shards):
    """Two moment estimates per job and the bias corrections of its own step count, with FedProx's term and the
    learning-rate decay of FedADT on top; in float64 equal to fast to rounding."""
    shards64 = double(shards)
    torch.manual_seed(0)
    callbacks = [ProximalTerm(mu=0.1), LearningRateDecay(0.9)]
    model = ConfiguredAdam(optimizer, **settings).double()
    fast, cohort, _, start = engines(model, shards64, callbacks, min_batched=2)
    jobs = [job(c, epochs, seed=80 + c, base_version=c % 3) for c in range(10)]
    sgd = CohortTrainer(ConfiguredSGD().double(), shards64, 10, callbacks).train_many(jobs, [start] * len(jobs))
    for update, j, s in zip(cohort.train_many(jobs, [start] * len(jobs)), jobs, sgd):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-12)
        assert (update.weights - s.weights).abs().max() > 1e-3  # not SGD


def test_amsgrad_is_refused_naming_the_fast_engine(shards):
    with pytest.raises(ValueError, match=r"Adam without amsgrad.*use engine='fast'"):
        CohortTrainer(ConfiguredAdam(amsgrad=True), shards, 10)


class _LogsManyWays(MLP):
    """Logs values that a job's ``JobLog`` reduces on its own path (plain calls, ``on_step``/``on_epoch``) and
    otherwise (``reduce_fx='max'``; a name logged as a constant after its first step, which Lightning allows: a
    change of options would raise there)."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("plain", loss * 3)
        self.log("flags", loss + 1, on_step=True, on_epoch=True)
        self.log("peak", loss, reduce_fx="max")
        self.log("switch", loss * 2 if batch_idx == 0 else 1.5)  # a constant: one value for every job of a step
        return loss


def test_what_jobs_log_is_reduced_as_by_each_jobs_own_joblog(shards, monkeypatch):
    """The plain calls of all the jobs of a step are reduced at once (float32 sums per job); the result is each
    job's own ``JobLog``'s, bit for bit (the cohort run again with every value handed to each job's ``JobLog``,
    as before), in batched steps and in the steps run one job at a time, with a name that leaves the batched sums
    mid-job; and it is the fast engine's within float32 rounding."""
    torch.manual_seed(0)
    model = _LogsManyWays(input_dim=64, hidden_dims=(16,), lr=0.1)
    fast, cohort, calls, start = engines(model, shards, min_batched=4)
    prefixes: list[bool] = []
    log = _CohortLogs.log
    monkeypatch.setattr(
        _CohortLogs, "log", lambda self, m, prefix, t, lg: (prefixes.append(prefix), log(self, m, prefix, t, lg))
    )
    # equal epochs (each step's jobs the first rows), then unequal ones (jobs at other rows, grouped by epoch)
    for jobs in ([job(c, 2, seed=30 + c) for c in range(12)], [job(c, 1 + c % 3, seed=30 + c) for c in range(12)]):
        with monkeypatch.context() as patch:
            batched = cohort.train_many(jobs, [start] * 12)
            assert min(calls.sizes) >= 4 and len(calls.sizes) < sum(u.num_steps for u in batched)  # some alone
            patch.setattr(_CohortLogs, "_batched", lambda self, name, value, count: False)
            own = cohort.train_many(jobs, [start] * 12)
        for a, b, j in zip(batched, own, jobs):
            assert torch.equal(a.weights, b.weights)
            assert a.metrics == b.metrics and a.metrics.keys() == {"train_loss", "plain", "flags", "peak", "switch"}
            assert a.metrics == pytest.approx(fast.train(j, start).metrics, rel=1e-5)
    assert True in prefixes and False in prefixes  # both ways of adding a step's sums ran


def test_what_jobs_log_is_summed_in_float32_whatever_the_default_dtype(shards, monkeypatch):
    """``JobLog`` sums in float32; the batched sums too, also where torch's default dtype is float64 (where they
    followed it: float64 sums on the first rows, an ``index_add_`` of float32 into float64 elsewhere)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model = _LogsManyWays(input_dim=64, hidden_dims=(16,), lr=0.1).float()
        _, cohort, _, start = engines(model, shards, min_batched=4)
        jobs = [job(c, 1 + c % 3, seed=30 + c) for c in range(12)]
        batched = cohort.train_many(jobs, [start] * 12)
        monkeypatch.setattr(_CohortLogs, "_batched", lambda self, name, value, count: False)
        own = cohort.train_many(jobs, [start] * 12)
    finally:
        torch.set_default_dtype(previous)
    for a, b in zip(batched, own):
        assert a.metrics == b.metrics


#: The batch indices the modules below ran ``training_step`` at (the engines train copies of a module).
STEPS_CALLED: list[int] = []


class _LogsTwice(MLP):
    """Logs one name twice in a step (from step ``from_step`` on): both values count in the job's mean under
    ``engine='fast'`` and in Lightning."""

    from_step = 0

    def training_step(self, batch, batch_idx):
        STEPS_CALLED.append(batch_idx)
        loss = super().training_step(batch, batch_idx)
        self.log("twice", loss)
        if batch_idx >= self.from_step:
            self.log("twice", loss * 100)
        return loss


def test_a_name_logged_twice_in_a_step_is_refused_naming_the_fast_engine(shards):
    """The batched step keeps one value per name and step, so a second call would silently replace the first:
    refused at construction where the probe's step logs it twice, raised (not redone) where a later step does."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"self.log\('twice', \.\.\.\) twice in one training_step.*engine='fast'"):
        CohortTrainer(_LogsTwice(input_dim=64, hidden_dims=(16,), lr=0.1), shards, 10)
    later = _LogsTwice(input_dim=64, hidden_dims=(16,), lr=0.1)
    later.from_step = 1
    STEPS_CALLED.clear()
    cohort = CohortTrainer(later, shards, 10)
    start = cohort.flat.read()
    jobs = [job(c, 1, seed=30 + c) for c in range(6)]
    with pytest.raises(ValueError, match=r"twice in one training_step.*engine='fast'"):
        cohort.train_many(jobs, [start] * 6)
    assert cohort.kernels_off_because is None and STEPS_CALLED.count(1) == 1  # raised, not redone


class _LogsWithBatchSize(MLP):
    """Passes ``batch_size`` (read from the batch) to ``self.log`` from step ``from_step`` on."""

    from_step = 0

    def training_step(self, batch, batch_idx):
        STEPS_CALLED.append(batch_idx)
        loss = super().training_step(batch, batch_idx)
        self.log("sized", loss, **({"batch_size": len(batch[1])} if batch_idx >= self.from_step else {}))
        return loss


def test_a_batch_size_read_from_the_batch_is_not_padded(shards):
    """A padded step runs ``training_step`` on single samples, where ``len(batch[1])`` is 1: a module passing
    ``batch_size`` is not padded (its jobs grouped by batch shape: the fast engine's logged means, within float32
    rounding), and one that first passes it at a later step is stopped there, naming the ways out (it logged
    means weighted by 1 instead of the batch sizes)."""
    torch.manual_seed(0)
    fast, cohort, _, start = engines(_LogsWithBatchSize(input_dim=64, hidden_dims=(16,), lr=0.1), shards, min_batched=2)
    assert "batch_size" in cohort.no_padding_because and "engine='fast'" in cohort.no_padding_because
    jobs = [job(c, 1, seed=30 + c) for c in range(12)]
    for update, j in zip(cohort.train_many(jobs, [start] * 12), jobs):
        assert update.metrics == pytest.approx(fast.train(j, start).metrics, rel=1e-5)
    later = _LogsWithBatchSize(input_dim=64, hidden_dims=(16,), lr=0.1)
    later.from_step = 1
    STEPS_CALLED.clear()
    _, cohort, _, start = engines(later, shards, min_batched=2)
    assert cohort.no_padding_because is None
    with pytest.raises(ValueError, match=r"log\('sized', \.\.\., batch_size=\.\.\.\) in a padded step.*engine='fast'"):
        cohort.train_many(jobs, [start] * 12)
    assert cohort.kernels_off_because is None and STEPS_CALLED.count(1) == 1  # raised, not redone


class ShiftedLabel(LeNet5):
    """A target computed from the batch (label 2 marked -1, ignored): the data holds no -1, the computed target
    does, and the largest client's first batch holds no 2 (the probe alone passes)."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), torch.where(y == 2, -1, y), ignore_index=-1)


def test_an_ignore_index_on_a_target_computed_from_the_batch_is_not_padded_and_equals_fast(shards):
    torch.manual_seed(0)
    fast, cohort, calls, start = engines(ShiftedLabel(lr=0.05).double(), double(shards))
    assert "ignores the target -1" in cohort.no_padding_because
    assert "computed from the batch" in cohort.no_padding_because
    jobs = [job(c, 1, seed=90 + c) for c in range(12)]
    updates = cohort.train_many(jobs, [start] * len(jobs))
    assert len(calls.sizes) > max(u.num_steps for u in updates)  # grouped by batch shape
    for update, j in zip(updates, jobs):
        torch.testing.assert_close(update.weights, fast.train(j, start).weights, rtol=0, atol=1e-12)
