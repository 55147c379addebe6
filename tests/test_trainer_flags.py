"""``lightning.Trainer`` flags users reach for (issue 32, item 5): gradient clipping per client job as Lightning
clips (``GradientClipping``, weights equal to ``lightning.Trainer(gradient_clip_val=...)``), the others refused at
construction naming their route, ``seed_everything`` before the trainer refused naming ``seed``."""

from __future__ import annotations

import copy
import os

import lightning as L
import pytest
import torch
from conftest import make_trainer
from torch.utils.data import DataLoader, RandomSampler, TensorDataset
from wild_modules import LClassifier, LData, TinyGAN

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAvg
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.client_callbacks import GradientClipping
from lit_asyncfl.core.flat import FlatParameters


@pytest.mark.parametrize(
    ("flag", "value", "route"),
    [("max_epochs", 3, r"local_epochs=E"), ("min_epochs", 1, r"local_epochs=E"), ("max_steps", 10, "max_versions"),
     ("gradient_clip_val", 0.5, r"GradientClipping\(gradient_clip_val, gradient_clip_algorithm\)"),
     ("gradient_clip_algorithm", "value", r"GradientClipping"),
     ("accumulate_grad_batches", 4, r"larger batch_size .* manual optimization"),
     ("precision", "16-mixed", r"dtype of the module's parameters .* no mixed precision"),
     ("devices", 2, "RayExecutor"), ("check_val_every_n_epoch", 2, "eval_every"),
     ("overfit_batches", 1, "docs/lightning.md")],
)  # fmt: skip
def test_lightning_trainer_flags_are_refused_naming_their_route(tmp_path, flag, value, route):
    """They used to be Python's bare 'unexpected keyword argument'."""
    with pytest.raises(ValueError, match=rf"FederatedTrainer\({flag}={value!r}\): a lightning.Trainer flag .*{route}"):
        make_trainer(tmp_path, "fedavg", max_versions=1, **{flag: value})


def test_other_unknown_keywords_stay_a_type_error_and_the_signature_is_kept(tmp_path):
    import inspect

    with pytest.raises(TypeError, match="unexpected keyword argument 'max_version'"):
        make_trainer(tmp_path, "fedavg", max_version=1)
    assert list(inspect.signature(FederatedTrainer).parameters)[:3] == ["algorithm", "num_clients", "local_epochs"]


@pytest.fixture
def restore_global_seed():
    saved = os.environ.get("PL_GLOBAL_SEED")
    yield
    if saved is None:
        os.environ.pop("PL_GLOBAL_SEED", None)
    else:
        os.environ["PL_GLOBAL_SEED"] = saved


def test_seed_everything_before_the_trainer_is_refused_unless_seed_says_it(tmp_path, restore_global_seed):
    """The trainer seeds everything from seed= at construction: a default seed=0 silently replaced the user's."""
    L.seed_everything(42, verbose=False)
    with pytest.raises(ValueError, match=r"seed_everything\(42\) was called, .* pass FederatedTrainer\(seed=42\)"):
        make_trainer(tmp_path, "fedavg", max_versions=1)
    assert make_trainer(tmp_path, "fedavg", max_versions=1, seed=42).seed == 42
    assert make_trainer(tmp_path, "fedavg", max_versions=1).seed == 0  # its own seeding is not the user's call
    L.seed_everything(0, verbose=False)
    assert make_trainer(tmp_path, "fedavg", max_versions=1).seed == 0  # the same seed: nothing replaced


# -- gradient clipping: each client job equals lightning.Trainer(gradient_clip_val=...).fit of its shard, in the
# job's batch order (one randperm of the shard from the job's seed) ------------------------------------------------
class _Updates(Callback):
    def __init__(self):
        self.updates = []

    def on_client_update(self, trainer, update, aggregated):
        self.updates.append(update)


def _lightning_job(model, update, shards, batch_size, **flags):
    idx = shards.indices[update.job.client]
    data = TensorDataset(shards.inputs[idx], shards.targets[idx])
    order = RandomSampler(data, generator=torch.Generator().manual_seed(update.job.seed))  # the job's one epoch
    loader = DataLoader(data, batch_size=batch_size, sampler=order)
    reference = copy.deepcopy(model)
    FlatParameters(reference).load(update.base_weights)
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer = L.Trainer(max_epochs=update.job.local_epochs, limit_val_batches=0, **quiet, **flags)
    trainer.fit(reference, train_dataloaders=loader)
    return FlatParameters(reference).read()


@pytest.mark.parametrize("engine", ["fast", "lightning"])
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_equals_lightnings_gradient_clip_val(tmp_path, engine, algorithm):
    clip = 0.05 if algorithm == "norm" else 0.01
    algo, record = FedAvg(), _Updates()
    algo.client_callbacks.append(GradientClipping(clip, algorithm))
    trainer = make_trainer(tmp_path, algo, num_clients=3, max_versions=2, engine=engine, callbacks=[record])
    torch.manual_seed(0)
    model = LClassifier(lr=1.0)
    trainer.fit(model, datamodule=LData())
    executor_trainer = trainer.simulator.executor.trainer
    shards, batch_size = executor_trainer.shards, executor_trainer.batch_size
    assert len(record.updates) >= 2
    flags = dict(gradient_clip_val=clip, gradient_clip_algorithm=algorithm)
    for update in record.updates[:2]:
        assert torch.equal(update.weights, _lightning_job(model, update, shards, batch_size, **flags))
        assert not torch.equal(update.weights, _lightning_job(model, update, shards, batch_size))  # it clipped


def test_gradient_clipping_is_refused_by_the_cohort_engine_and_under_manual_optimization(tmp_path):
    algo = FedAvg()
    algo.client_callbacks.append(GradientClipping(0.5))
    with pytest.raises(ValueError, match="the cohort engine cannot run the client callback GradientClipping"):
        make_trainer(tmp_path / "c", algo, num_clients=3, max_versions=1, engine="cohort").fit(
            LClassifier(), datamodule=LData()
        )
    with pytest.raises(ValueError, match=r"TinyGAN uses manual optimization, but .* GradientClipping"):
        make_trainer(tmp_path / "m", algo, num_clients=3, max_versions=1, engine="lightning").fit(
            TinyGAN(), datamodule=LData()
        )


def test_gradient_clipping_checks_its_arguments():
    with pytest.raises(ValueError, match="gradient_clip_val must be > 0, got 0"):
        GradientClipping(0)
    with pytest.raises(ValueError, match="unknown gradient_clip_algorithm 'l1'"):
        GradientClipping(0.5, "l1")
