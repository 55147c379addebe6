"""What the cohort engine cannot batch is refused at fit start, naming the engine that runs it, before any client job
is dispatched (not by the first job, mid-run)."""

from __future__ import annotations

import pytest
import torch
from conftest import global_weights, run
from torchmetrics.aggregation import CatMetric
from torchmetrics.classification import MulticlassAccuracy

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.core.simulator import ClientJobError
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.engines import CohortEngine
from lit_asyncfl.engines.fast import FastEngine
from lit_asyncfl.executors import CohortExecutor
from lit_asyncfl.models import LeNet5

pytestmark = pytest.mark.usefixtures("one_thread")

METRIC = r"engine='cohort' cannot update a torchmetrics object in training_step .*use engine='fast'"
STEP_COUNT = r"self\.trainer\.num_training_batches differs .*use engine='fast'"


class UpdatesMetric(LeNet5):
    """A torchmetrics object updated in ``training_step`` (one state per job: cannot be batched)."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.train_losses = CatMetric()

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.train_losses.update(loss.detach())
        return loss


class LogsMetric(LeNet5):
    """A torchmetrics object called and logged as an object in ``training_step``."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.train_acc = MulticlassAccuracy(num_classes=10)

    def training_step(self, batch, batch_idx):
        self.train_acc(self(batch[0]), batch[1])
        self.log("train_acc", self.train_acc)
        return super().training_step(batch, batch_idx)


class ReadsStepCount(LeNet5):
    def training_step(self, batch, batch_idx):
        self.trainer.num_training_batches  # noqa: B018 (differs between the clients of one cohort)
        return super().training_step(batch, batch_idx)


class MetricInValidationOnly(LeNet5):
    """A torchmetrics object that only ``validation_step`` updates: nothing for the cohort engine to refuse."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.val_accuracy = MulticlassAccuracy(num_classes=10)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.val_accuracy.update(self(batch[0]), batch[1])


@pytest.fixture(scope="module")
def shards():
    dm = DigitsDataModule(batch_size=10)
    dm.setup("fit")
    return dm.client_shards(6, seed=0)


@pytest.mark.parametrize(
    ("module", "message"), [(UpdatesMetric, METRIC), (LogsMetric, METRIC), (ReadsStepCount, STEP_COUNT)]
)
def test_the_engine_refuses_at_construction(module, message, shards):
    with pytest.raises(ValueError, match=message):
        CohortEngine(module(), shards, 10)


@pytest.fixture
def dispatched(monkeypatch):
    """The jobs submitted to the cohort executor."""
    jobs = []
    submit = CohortExecutor.submit

    def recording(self, job, start_weights):
        jobs.append(job)
        submit(self, job, start_weights)

    monkeypatch.setattr(CohortExecutor, "submit", recording)
    return jobs


@pytest.mark.parametrize(
    ("module", "message"), [(UpdatesMetric, METRIC), (LogsMetric, METRIC), (ReadsStepCount, STEP_COUNT)]
)
def test_a_run_is_refused_at_fit_start_before_any_job_is_dispatched(module, message, tmp_path, dispatched):
    with pytest.raises(ValueError, match=message) as refused:
        run(tmp_path, FedAsync(concurrency=3), model=module(), max_versions=4, engine="cohort")
    assert not isinstance(refused.value, ClientJobError)  # not met by a client's job
    assert dispatched == []


def test_a_metric_in_validation_only_trains_and_the_probe_changes_no_result(tmp_path, dispatched):
    """The fit-start probe runs ``training_step`` once on the engine's copy: nothing is refused, and the run's
    weights equal those of the same module without the metric object (the probe leaves the generators alone)."""
    trained = {}
    for name, module in (("metric", MetricInValidationOnly), ("plain", lambda: LeNet5(lr=0.05))):
        torch.manual_seed(0)
        model = module()
        trained[name] = run(tmp_path / name, FedAsync(concurrency=3), model=model, max_versions=4, engine="cohort")
    assert dispatched and trained["metric"].summary["versions"] == 4
    assert torch.equal(global_weights(trained["metric"]), global_weights(trained["plain"]))


# -- parameters a step leaves without a gradient ----------------------------------------------------------------------


class UnusedHead(LeNet5):
    """LeNet-5 with a second head that ``training_step`` never uses (say, another task's): under ``fast`` its
    ``.grad`` stays ``None`` and ``torch.optim`` leaves it alone; the cohort engine's batched gradient is zero."""

    def __init__(self, **kwargs):
        super().__init__(**{"lr": 0.05, **kwargs})
        self.other_head = torch.nn.Linear(10, 3)


class AdamUnusedHead(UnusedHead):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class AdamWUnusedHead(UnusedHead):
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01, weight_decay=0.0)


UNUSED = r"without a gradient \(other_head\.weight, other_head\.bias;.*which {} moves; use engine='fast'"
MOVES_WITHOUT_GRADIENT = [
    (lambda: UnusedHead(weight_decay=0.01), "SGD with weight_decay=0.01"),
    (lambda: UnusedHead(momentum=0.9), "SGD with momentum=0.9"),
    (lambda: UnusedHead(weight_decay=0.01, momentum=0.9), "SGD with weight_decay=0.01 and momentum=0.9"),
    (AdamUnusedHead, "Adam"),
    (AdamWUnusedHead, "AdamW"),
]
IDS = ["weight-decay", "momentum", "both", "adam", "adamw"]


def test_fast_leaves_an_unused_parameter_alone_under_weight_decay_and_momentum(shards):
    """What the refusal protects: ``torch.optim`` skips a parameter whose ``.grad`` is ``None``."""
    torch.manual_seed(0)
    fast = FastEngine(UnusedHead(weight_decay=0.01, momentum=0.9), shards, 10)
    start = fast.flat.read()
    update = fast.train(ClientJob(0, 0, 0, 0.0, JobTiming(0, 0, 0), 5, 2), start)
    assert torch.equal(update.weights[-33:], start[-33:])  # other_head (30 weights, 3 biases): untouched
    assert not torch.equal(update.weights[:-33], start[:-33])


@pytest.mark.parametrize(("module", "optimizer"), MOVES_WITHOUT_GRADIENT, ids=IDS)
def test_an_unused_parameter_under_an_optimizer_that_moves_it_is_refused_at_construction(module, optimizer, shards):
    with pytest.raises(ValueError, match=UNUSED.format(optimizer)):
        CohortEngine(module(), shards, 10)


@pytest.mark.parametrize(
    ("module", "optimizer"), [MOVES_WITHOUT_GRADIENT[0], MOVES_WITHOUT_GRADIENT[3]], ids=["weight-decay", "adam"]
)
def test_an_unused_parameter_is_refused_at_fit_start_before_any_job(module, optimizer, tmp_path, dispatched):
    with pytest.raises(ValueError, match=UNUSED.format(optimizer)) as refused:
        run(tmp_path, FedAsync(concurrency=3), model=module(), max_versions=4, engine="cohort")
    assert not isinstance(refused.value, ClientJobError)
    assert dispatched == []


def test_under_plain_sgd_an_unused_parameter_trains_as_under_fast(tmp_path, dispatched):
    """A zero gradient changes nothing under plain SGD: allowed, and the unused head keeps its start weights."""
    trained = {}
    for engine in ("fast", "cohort"):
        torch.manual_seed(0)
        model = UnusedHead()
        start = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
        trained[engine] = run(tmp_path / engine, FedAsync(concurrency=3), model=model, max_versions=4, engine=engine)
    assert dispatched  # the cohort engine really trained
    fast, cohort = global_weights(trained["fast"]), global_weights(trained["cohort"])
    torch.testing.assert_close(cohort, fast, rtol=0, atol=1e-6)
    assert torch.equal(cohort[-33:], start[-33:]) and torch.equal(fast[-33:], start[-33:])  # other_head untouched
    assert (cohort[:-33] - start[:-33]).abs().max() > 1e-3  # the rest trained
