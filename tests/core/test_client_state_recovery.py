"""Per-client state that a failure or a move cannot lose (issue 34): self-contained checkpoints under the budget, a
run directory that moves, a resume under another budget, a full disk that is the run's failure, not a client's."""

from __future__ import annotations

import builtins
import errno
import shutil

import pytest
import torch
from conftest import global_weights, make_trainer, run

from lit_asyncfl.algorithms import MOON, FedDyn
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.core.client_state import ClientStateError
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5

MAKE = {
    "moon": lambda: MOON(mu=1.0, clients_per_round=4),
    "feddyn": lambda: FedDyn(alpha=0.05, clients_per_round=4),
}
VERSIONS = 6


def _resume(tmp_path, name, path, **kwargs):
    trainer = make_trainer(tmp_path, MAKE[name](), num_clients=8, max_versions=VERSIONS, **kwargs)
    torch.manual_seed(0)
    trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(path))
    return trainer


def _full(tmp_path, name, **kwargs):
    kwargs.setdefault("max_versions", VERSIONS)
    return run(tmp_path, MAKE[name](), model_seed=0, num_clients=8, **kwargs)


@pytest.mark.parametrize("name", sorted(MAKE))
def test_a_moved_run_directory_resumes_exactly(tmp_path, name):
    full = _full(tmp_path / "full", name, client_state_budget=0)
    _full(tmp_path / "first", name, client_state_budget=0, max_versions=VERSIONS // 2)
    old = next((tmp_path / "first").rglob("last.ckpt")).parent.parent
    assert any((old / "client_state").iterdir())  # the checkpoint needs files
    moved = tmp_path / "elsewhere" / "run"
    shutil.move(str(old), str(moved))  # another machine, a cluster's scratch dir
    resumed = _resume(tmp_path / "resumed", name, moved / "checkpoints" / "last.ckpt", client_state_budget=0)
    assert torch.equal(global_weights(resumed), global_weights(full))
    shutil.rmtree(moved / "client_state")
    with pytest.raises(ValueError, match=r"needs \d+ file\(s\) .*are missing or changed: .*client_state/\d+_\w+_\d+"
                                         r"\.bin \(missing\)"):  # fmt: skip
        _resume(tmp_path / "again", name, moved / "checkpoints" / "last.ckpt", client_state_budget=0)


class CopyAt(Callback):
    """Copies last.ckpt away at one event, as a user backing a run up while it goes on."""

    def __init__(self, event: int, to) -> None:
        self.event, self.to = event, to

    def on_event_end(self, trainer):
        if trainer.simulator.events_processed == self.event:
            shutil.copy(trainer.log_dir + "/checkpoints/last.ckpt", self.to)


@pytest.mark.parametrize("name", sorted(MAKE))
def test_a_copy_of_last_ckpt_taken_during_a_run_resumes_under_the_default_budget(tmp_path, name):
    copy = tmp_path / "copy.ckpt"
    full = _full(tmp_path / "full", name, checkpoint_every=1, callbacks=[CopyAt(12, copy)])
    assert copy.exists()  # then many more checkpoints were written by the run
    resumed = _resume(tmp_path / "resumed", name, copy)
    assert torch.equal(global_weights(resumed), global_weights(full))


@pytest.mark.parametrize(("written", "resumed"), [(0, None), (None, 0), (0, 2**30)])
def test_a_resume_under_another_client_state_budget_is_exact(tmp_path, written, resumed):
    full = _full(tmp_path / "full", "moon", client_state_budget=written)
    _full(tmp_path / "first", "moon", client_state_budget=written, max_versions=VERSIONS // 2)
    path = next((tmp_path / "first").rglob("last.ckpt"))
    again = _resume(tmp_path / "resumed", "moon", path, client_state_budget=resumed)
    assert torch.equal(global_weights(again), global_weights(full))


def test_a_full_disk_while_spilling_ends_the_run_and_is_not_blamed_on_a_client(tmp_path, monkeypatch):
    real_open, writes = builtins.open, []

    def full_disk(file, mode="r", *args, **kwargs):
        if str(file).endswith(".bin") and "w" in mode:
            writes.append(file)
            if len(writes) > 3:
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full_disk)
    with pytest.raises(ClientStateError, match=r"could not write client state to .*No space left on device.*the run's "
                                               r"disk failed, not a client"):  # fmt: skip
        _full(tmp_path, "moon", client_state_budget=0, on_client_error="drop")


@pytest.mark.parametrize("name", sorted(MAKE))
def test_results_and_resumes_do_not_depend_on_when_wall_clock_checkpoints_happen(tmp_path, name):
    """The flaky resume (issue 34, item 6): the only wall-clock input of a run is when its periodic checkpoints are
    written (``checkpoint_every_seconds``), and writing one used to write the store's resident entries to files
    and rotate its pins. A checkpoint after every event (what a loaded machine approaches) and none at all must give
    the same weights, and so must a resume from either."""
    never = _full(tmp_path / "never", name, client_state_budget=0, checkpoint_every_seconds=None)
    always = _full(tmp_path / "always", name, client_state_budget=0, checkpoint_every=1)
    assert torch.equal(global_weights(always), global_weights(never))
    for budget, every in [(0, 1), (0, None), (2**30, 1)]:
        first = tmp_path / f"first-{budget}-{every}"
        _full(first, name, client_state_budget=budget, checkpoint_every=every, checkpoint_every_seconds=None,
              max_versions=VERSIONS // 2)  # fmt: skip
        resumed = _resume(tmp_path / f"resumed-{budget}-{every}", name, next(first.rglob("last.ckpt")),
                          client_state_budget=budget, checkpoint_every=every)  # fmt: skip
        assert torch.equal(global_weights(resumed), global_weights(never)), (budget, every)
