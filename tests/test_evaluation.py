"""Global evaluation: logged values are batch-size weighted means over the whole evaluation set; the versions the
run evaluates."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from conftest import run
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from lit_asyncfl.algorithms import Algorithm
from lit_asyncfl.evaluation import evaluate, find_metric
from lit_asyncfl.models import LogisticRegression
from lit_asyncfl.schedulers import KeepConcurrency
from lit_asyncfl.server import Mixing, StalenessWeight


def test_logged_metrics_equal_the_full_set_values_with_uneven_batches():
    torch.manual_seed(0)
    model = LogisticRegression(input_dim=5, num_classes=3)
    x, y = torch.randn(23, 5), torch.randint(0, 3, (23,))
    batches = [[x[i : i + 10], y[i : i + 10]] for i in range(0, 23, 10)]  # 10, 10, 3
    metrics = evaluate(model, batches, "val")
    with torch.no_grad():
        logits = model(x)
    assert metrics["val_acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item(), abs=1e-6)
    assert metrics["val_loss"] == pytest.approx(F.cross_entropy(logits, y).item(), abs=1e-6)
    assert model.training  # mode restored
    assert "log" not in vars(model)  # the capture is removed


def test_module_without_test_step_is_refused_as_lightning_refuses_it():
    """No logits scored as a classifier's: only the module's own hooks touch its data (issue 32; it was scored)."""

    class Bare(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)

        def forward(self, x):
            return self.layer(x)

    x, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    with pytest.raises(MisconfigurationException, match=r"No `test_step\(\)` method defined to run `Trainer.test`"):
        evaluate(Bare(), [[x, y]], "test")


@pytest.mark.parametrize(
    ("metrics", "kind", "expected"),
    [
        ({"val_loss": 1.0, "val_acc": 0.5}, "accuracy", 0.5),
        ({"valid/accuracy": 0.7, "valid/loss": 0.2}, "accuracy", 0.7),
        ({"valid/accuracy": 0.7, "valid/loss": 0.2}, "loss", 0.2),
        ({"mse": 0.3}, "accuracy", None),
    ],
)
def test_find_metric_by_name_suffix(metrics, kind, expected):
    assert find_metric(metrics, kind) == expected


def test_logged_torchmetrics_objects_are_computed_once_over_the_set_and_reset():
    from torchmetrics.classification import MulticlassAccuracy

    class WithMetric(LogisticRegression):
        def __init__(self):
            super().__init__(input_dim=5, num_classes=3)
            self.val_accuracy = MulticlassAccuracy(num_classes=3, average="micro")

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.val_accuracy(self(x), y)
            self.log("val_acc", self.val_accuracy)

    torch.manual_seed(1)
    model = WithMetric()
    x, y = torch.randn(23, 5), torch.randint(0, 3, (23,))
    batches = [[x[i : i + 10], y[i : i + 10]] for i in range(0, 23, 10)]
    with torch.no_grad():
        expected = (model(x).argmax(1) == y).float().mean().item()
    assert evaluate(model, batches)["val_acc"] == pytest.approx(expected)
    with torch.no_grad():
        model.net[-1].weight.zero_()
        model.net[-1].bias.copy_(torch.tensor([0.0, 0.0, 1.0]))  # always predicts class 2
    assert evaluate(model, batches)["val_acc"] == pytest.approx((y == 2).float().mean().item())  # no leak


class _AsksForEvaluations(KeepConcurrency):
    """Asks for an evaluation of every version ``v`` with ``v % 5 == 1`` (off the ``eval_every`` schedule)."""

    def on_update(self, sim, job, aggregated):
        if sim.server.version % 5 == 1:
            sim.evaluate()
        super().on_update(sim, job, aggregated)


def test_the_schedule_evaluates_every_multiple_of_eval_every_and_what_the_algorithm_asks_for(tmp_path):
    """Version 0, each multiple of ``eval_every``, each version the scheduler asks for between them (which does not
    move the next multiple), and the last one, each once."""
    scheduler = _AsksForEvaluations(2)
    algorithm = Algorithm(scheduler=scheduler, aggregator=Mixing(0.5), server_callbacks=[StalenessWeight()])
    trainer = run(tmp_path, algorithm, num_clients=6, max_versions=17, eval_every=3)
    versions = [row["version"] for row in trainer.history]
    expected = sorted({0, 17} | {v for v in range(18) if v % 3 == 0} | {v for v in range(18) if v % 5 == 1})
    assert versions == expected == [0, 1, 3, 6, 9, 11, 12, 15, 16, 17]
