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
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.engines import CohortEngine
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
