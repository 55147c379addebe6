"""The per-client state store (lit_asyncfl.core.client_state) beyond core/test_client_state.py: spilled tensors of
every shape, copies not views, the previous checkpoint's files kept; presets with state on disk resume exactly."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import global_weights, make_trainer, run

from lit_asyncfl.algorithms import MOON, FedAvgM
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5


@pytest.mark.parametrize(
    "tensor",
    [torch.empty(0), torch.empty(3, 0, dtype=torch.float64), torch.tensor(2.5), torch.zeros(0, dtype=torch.bfloat16)],
    ids=["empty", "empty-2d", "0-dim", "empty-bf16"],
)
def test_store_spills_and_resumes_empty_and_0_dim_tensors_bit_exact(tmp_path, tensor):
    store = ClientStateStore(budget_bytes=0, directory=str(tmp_path / "a"))  # every entry goes to disk
    store.put(0, "x", tensor)
    back = store.get(0, "x")
    assert back.dtype == tensor.dtype and back.shape == tensor.shape and torch.equal(back, tensor)
    other = ClientStateStore(budget_bytes=0, directory=str(tmp_path / "b"))
    other.load_state_dict(store.state_dict())
    again = other.get(0, "x")
    assert again.dtype == tensor.dtype and again.shape == tensor.shape and torch.equal(again, tensor)


@pytest.mark.parametrize("budget", [None, 1 << 20, 0])
def test_store_keeps_a_copy_views_and_later_in_place_changes_do_not_reach_it(tmp_path, budget):
    store = ClientStateStore(budget_bytes=budget, directory=str(tmp_path))
    base = torch.arange(12.0).reshape(3, 4)
    view, row = base.t()[1], base[1]  # a non-contiguous and a contiguous view
    store.put(0, "v", view)
    store.put(0, "row", row)
    expected, expected_row = view.clone(), row.clone()
    base.mul_(-1)  # the caller changes its tensor in place afterwards
    assert torch.equal(store.get(0, "v"), expected) and torch.equal(store.get(0, "row"), expected_row)
    state = store.state_dict()
    base.add_(100)
    resumed = ClientStateStore(budget_bytes=budget, directory=str(tmp_path / "resumed"))
    resumed.load_state_dict(state)  # the checkpoint (tensors or files) holds the value of the put too
    assert torch.equal(resumed.get(0, "v"), expected) and torch.equal(resumed.get(0, "row"), expected_row)


def test_store_keeps_the_files_of_the_previous_checkpoint_while_the_next_one_is_written(tmp_path):
    """Copy-on-write over the last two manifests: if writing checkpoint N+1 fails, checkpoint N (still on disk)
    must find its files, even for entries changed since."""
    store = ClientStateStore(budget_bytes=0, directory=str(tmp_path / "run"))
    store.put(0, "x", torch.ones(3))
    older = store.state_dict()  # checkpoint N
    store.put(0, "x", torch.full((3,), 2.0))
    store.state_dict()  # checkpoint N+1 (its file could fail to be saved)
    store.put(0, "x", torch.full((3,), 3.0))
    resumed = ClientStateStore(budget_bytes=0, directory=str(tmp_path / "resumed"))
    resumed.load_state_dict(older)
    assert torch.equal(resumed.get(0, "x"), torch.ones(3))
    store.state_dict()  # checkpoint N+2: N's files may go now
    assert not os.path.isfile(older["files"][0][2])


# ---------------------------------------------------------------------------------- FedAvgM asynchronous, resume


@pytest.mark.parametrize(
    "name, make, versions",
    [
        ("fedavgm", lambda: FedAvgM(clients_per_round=3), 6),
        ("fedavgm-async", lambda: FedAvgM(asynchronous=True, buffer_size=2, concurrency=4), 6),
        ("moon-async", lambda: MOON(asynchronous=True, concurrency=4), 10),
    ],
)
def test_resume_mid_run_is_exact_and_runs_are_deterministic(tmp_path, name, make, versions):
    """FedAvgM's momentum buffer (both variants) and asynchronous MOON's state on disk with jobs in flight survive
    a checkpoint exactly; two runs give the same weights."""
    full = run(tmp_path / "full", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    again = run(tmp_path / "again", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    assert torch.equal(global_weights(full), global_weights(again))
    run(tmp_path / "first", make(), num_clients=8, max_versions=versions // 2, client_state_budget=0)
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", make(), num_clients=8, max_versions=versions, client_state_budget=0)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
