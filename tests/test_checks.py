"""Invalid settings fail early with a message naming the value and what is allowed."""

from __future__ import annotations

import pytest
from conftest import make_trainer

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedADT, FedASMU, FedASMU_0, FedAsync, FedAvg, FedBuff, FedHist, FedProx
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5
from lit_asyncfl.schedulers import KeepConcurrency, PeriodicTrigger


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FederatedTrainer(max_versions=1, num_clients=0), r"num_clients must be >= 1, got 0"),
        (lambda: FederatedTrainer(max_versions=1, local_epochs=0), r"local_epochs must be >= 1, got 0"),
        (lambda: FederatedTrainer(), r"set a budget: max_virtual_time .* and/or max_versions"),
        (lambda: FederatedTrainer(max_virtual_time=-5.0), r"max_virtual_time must be > 0, got -5.0"),
        (lambda: FederatedTrainer(max_versions=0), r"max_versions must be >= 1, got 0"),
        (lambda: FederatedTrainer(max_versions=1, eval_every=0), r"eval_every must be >= 1, got 0"),
        (
            lambda: FederatedTrainer(max_versions=1, target_accuracy=1.5),
            r"target_accuracy must be in \(0, 1\], got 1.5",
        ),
        (lambda: FederatedTrainer(max_versions=1, seed=-1), r"seed must be an integer in \[0, 2\*\*32\), got -1"),
        (lambda: FederatedTrainer(max_versions=1, accelerator="tpu"), r"unknown accelerator 'tpu'; allowed: \['cpu'"),
        (
            lambda: FederatedTrainer(FedAsync(concurrency=20), num_clients=10, max_versions=1),
            r"concurrency=20 is larger than num_clients=10; allowed: 1..10",
        ),
        (
            lambda: FederatedTrainer(FedAvg(clients_per_round=11), num_clients=10, max_versions=1),
            r"clients_per_round=11 is larger than num_clients=10",
        ),
        (lambda: FedAsync(alpha=0.0), r"alpha must be in \(0, 1\], got 0.0"),
        (lambda: FedAsync(alpha=1.2), r"alpha must be in \(0, 1\], got 1.2"),
        (lambda: FedAsync(staleness="cubic"), r"unknown staleness function 'cubic'; allowed: \['constant'"),
        (lambda: FedAsync(a=-1.0), r"staleness parameter a must be >= 0, got -1.0"),
        (lambda: FedBuff(buffer_size=0), r"buffer_size must be >= 1 or None, got 0"),
        (lambda: FedBuff(server_lr=0.0), r"server_lr must be > 0, got 0.0"),
        (lambda: FedProx(mu=-0.1), r"FedProx mu must be >= 0, got -0.1"),
        (lambda: KeepConcurrency(0), r"concurrency must be >= 1, got 0"),
        (lambda: KeepConcurrency(1.5), r"concurrency as a fraction must be in \(0, 1\], got 1.5"),
        (lambda: PeriodicTrigger(period=-10), r"period must be > 0 virtual seconds, got -10"),
        (lambda: DigitsDataModule(partition="dirichlet", alpha=-0.5), r"Dirichlet alpha must be > 0, got -0.5"),
        (lambda: DigitsDataModule(batch_size=0), r"batch_size must be >= 1, got 0"),
        (lambda: DigitsDataModule(test_fraction=1.0), r"test_fraction must be in \(0, 1\), got 1.0"),
        (lambda: LeNet5(lr=0), r"lr must be > 0, got 0"),
        (lambda: FederatedTrainer(max_versions=1, local_epochs=1.5), r"local_epochs must be an integer >= 1, got 1.5"),
        (lambda: FederatedTrainer(max_versions=2.5), r"max_versions must be an integer >= 1, got 2.5"),
        (lambda: FederatedTrainer(max_versions=1, num_clients="10"), r"num_clients must be an integer >= 1, got '10'"),
        (lambda: DigitsDataModule(partition="iid", alpha=0.1), r"alpha=0.1 only applies to partition='dirichlet'"),
        # Issue 16: values that used to be silently accepted.
        (lambda: FedASMU(lambda0=float("nan")), r"lambda0 must be a finite number > 0, got nan"),
        (lambda: FedASMU(gamma0=float("nan")), r"gamma0 must be a finite number > 0, got nan"),
        (lambda: FedASMU_0(lambda0=float("nan")), r"lambda0 must be a finite number > 0, got nan"),  # part unused
        (lambda: FedProx(mu=float("nan")), r"FedProx mu must be a finite number >= 0, got nan"),
        (lambda: LeNet5(lr=float("inf")), r"lr must be a finite number > 0, got inf"),
        (lambda: LeNet5(weight_decay=float("nan")), r"weight_decay must be a finite number >= 0, got nan"),
        (lambda: FedBuff(server_lr=float("inf")), r"server_lr must be a finite number > 0, got inf"),
        (lambda: FedHist(max_exponent=-1), r"max_exponent must be >= 0, got -1"),
        (lambda: FedADT(weight_min=0.8, weight_max=0.6), r"weight_min must be <= weight_max, got weight_min=0.8"),
        (lambda: FedAsync(a=float("inf")), r"staleness parameter a must be a finite number >= 0, got inf"),
        (lambda: FedBuff(buffer_size=2.5), r"buffer_size must be >= 1 or None, got 2.5"),
        (lambda: FedAsync(max_staleness=2.5), r"max_staleness must be an integer >= 0, got 2.5"),
        (lambda: FedASMU(tau_max=2.5), r"tau_max must be an integer >= 1, got 2.5"),
        (lambda: FedHist(egs="no"), r"egs must be True or False, got 'no'"),
        (lambda: LeNet5(lr="0.1"), r"lr must be a finite number > 0, got '0.1'"),
        (
            lambda: FederatedTrainer(max_virtual_time=float("inf")),
            r"max_virtual_time=inf without max_versions leaves the run no finite budget",
        ),
    ],
)
def test_bad_settings_fail_at_construction_with_the_value_and_the_allowed_range(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_an_infinite_time_budget_is_allowed_when_max_versions_bounds_the_run():
    trainer = FederatedTrainer(max_virtual_time=float("inf"), max_versions=3, logger=False, print_summary=False)
    assert trainer.max_virtual_time == float("inf") and trainer.max_versions == 3


def test_more_clients_than_samples_fails_before_anything_runs(tmp_path):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=1), num_clients=2000, max_versions=1)
    with pytest.raises(ValueError, match=r"cannot split 1437 training samples among 2000 clients"):
        trainer.fit(LeNet5(), datamodule=DigitsDataModule())
    assert trainer.simulator is None


def test_non_lightning_objects_are_refused(tmp_path):
    import torch

    trainer = make_trainer(tmp_path, FedAsync(concurrency=1), max_versions=1)
    with pytest.raises(TypeError, match="model must be a LightningModule, got Linear"):
        trainer.fit(torch.nn.Linear(2, 2), datamodule=DigitsDataModule())


def test_a_ray_executor_without_ray_installed_is_refused_naming_the_extra(tmp_path, monkeypatch):
    import sys

    from lit_asyncfl.client.ray_executor import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    for executor in ("ray", RayExecutor(num_workers=2)):
        with pytest.raises(ImportError, match=r"executor='ray' needs Ray: pip install 'lit-asyncfl\[ray\]'"):
            FederatedTrainer(max_versions=1, logger=False, default_root_dir=str(tmp_path), executor=executor)
    with pytest.raises(ValueError, match=r"executor must be one of \['sequential', 'ray'\] or a RayExecutor, got 'x'"):
        FederatedTrainer(max_versions=1, logger=False, default_root_dir=str(tmp_path), executor="x")
