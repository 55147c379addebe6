"""A client's failure stays the client's: a job that raises either ends the run with everything written and a
checkpoint at the event boundary before it, or is dropped and the run goes on; crash-safe outputs."""

from __future__ import annotations

import json
import math
import os
from typing import ClassVar

import pytest
import torch
from builders import FailAfterTheMerge, FailInTheMerge
from conftest import global_weights, make_trainer

from lit_asyncfl.algorithms import FedAsync, FedAvg
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.core.simulator import ClientJobError
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression
from lit_asyncfl.server.base import ServerCallback


class Flaky(LogisticRegression):
    """Raises at the given training steps (counted over the whole run, across the engine's copy: a class
    attribute), otherwise a plain logistic regression."""

    fail_at: ClassVar[set[int]] = set()
    steps = 0
    failures = 0

    def training_step(self, batch, batch_idx):
        Flaky.steps += 1
        if Flaky.steps in Flaky.fail_at:
            Flaky.failures += 1
            raise RuntimeError(f"boom at step {Flaky.steps}")
        return super().training_step(batch, batch_idx)


@pytest.fixture
def flaky():
    Flaky.steps = Flaky.failures = 0
    yield Flaky
    Flaky.fail_at = set()


def _fit(tmp_path, algorithm=None, **kwargs):
    trainer = make_trainer(tmp_path, algorithm or FedAsync(concurrency=3), max_versions=kwargs.pop("max_versions", 30),
                           **kwargs)  # fmt: skip
    torch.manual_seed(0)
    trainer.fit(Flaky(input_dim=64), datamodule=DigitsDataModule())
    return trainer


def test_a_failing_job_ends_the_run_with_outputs_and_a_checkpoint_that_resumes_exactly(tmp_path, flaky):
    healthy = _fit(tmp_path / "healthy")  # the same run without the failure
    flaky.fail_at, flaky.steps = {60}, 0
    failed = make_trainer(tmp_path / "failed", FedAsync(concurrency=3), max_versions=30)
    torch.manual_seed(0)
    with pytest.raises(ClientJobError, match=r"the job \d+ of client \d+ .* raised RuntimeError: boom at step 60"):
        failed.fit(Flaky(input_dim=64), datamodule=DigitsDataModule())
    out = failed.log_dir
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["stop_reason"] == "error: ClientJobError"
    assert 0 < summary["versions"] < 30
    assert os.path.exists(os.path.join(out, "history.csv")) and os.path.exists(os.path.join(out, "accuracy.png"))
    last = os.path.join(out, "checkpoints", "last.ckpt")
    assert os.path.exists(last)
    flaky.fail_at = set()  # the user fixed the bug: the resume redoes the failed job and ends as the healthy run
    resumed = make_trainer(tmp_path / "resumed", FedAsync(concurrency=3), max_versions=30)
    resumed.fit(Flaky(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=last)
    assert torch.equal(global_weights(resumed), global_weights(healthy))

    def rows(trainer):
        return [{k: v for k, v in row.items() if k != "wall_time"} for row in trainer.history]

    assert rows(resumed) == rows(healthy)


def test_a_failing_job_is_dropped_and_the_run_goes_on(tmp_path, flaky, caplog):
    flaky.fail_at = {20, 60, 61, 150}
    with caplog.at_level("WARNING", logger="lit_asyncfl"):
        trainer = _fit(tmp_path / "a", on_client_error="drop")
    s = trainer.summary
    assert s["stop_reason"] == "max_versions" and s["versions"] == 30
    assert 1 <= flaky.failures <= 4  # 60 and 61 may fall in one job (which then stops at 60)
    assert s["updates_dropped"] == s["drop_reasons"]["client_error"] == flaky.failures
    assert len([r for r in caplog.records if "dropped job" in r.message]) == flaky.failures
    flaky.steps = flaky.failures = 0
    again = _fit(tmp_path / "b", on_client_error="drop")
    assert torch.equal(global_weights(again), global_weights(trainer))  # deterministic


def test_synchronous_rounds_close_with_the_members_that_answered(tmp_path, flaky):
    flaky.fail_at = {3}  # the first round's first job
    trainer = _fit(tmp_path, FedAvg(clients_per_round=3), on_client_error="drop", max_versions=3)
    assert trainer.summary["versions"] == 3 and trainer.summary["updates_dropped"] == 1
    assert trainer.summary["updates_aggregated"] == 3 * 3 - 1  # the first round aggregated two


def test_drop_is_refused_with_the_cohort_engine():
    with pytest.raises(ValueError, match=r"on_client_error='drop' needs engine='fast' or 'lightning'"):
        make_trainer("unused", FedAsync(), max_versions=2, engine="cohort", on_client_error="drop")
    with pytest.raises(ValueError, match=r"unknown on_client_error 'ignore'; allowed: \['raise', 'drop'\]"):
        make_trainer("unused", FedAsync(), max_versions=2, on_client_error="ignore")


class SometimesNaN(LogisticRegression):
    """Returns a NaN loss at every 37th training step (about 1 in 10 jobs): those jobs diverge."""

    steps = 0

    def training_step(self, batch, batch_idx):
        SometimesNaN.steps += 1
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if SometimesNaN.steps % 37 == 0 else loss


def test_a_diverged_fedasmu_job_teaches_the_shared_state_nothing(tmp_path):
    """FedASMU learns mid-job (the merge's reward, the beta controls) and at the server (the alpha controls): a
    job with a NaN loss must leave the meta-policy, the Q-tables, the baseline and every control finite."""
    from lit_asyncfl.algorithms import FedASMU

    SometimesNaN.steps = 0
    algo = FedASMU(clients_per_trigger=3, max_parallel=4, num_slots=3, lr_gamma=1e-2, lr_lambda=1e-2)
    trainer = make_trainer(tmp_path, algo, max_versions=60)
    torch.manual_seed(0)
    trainer.fit(SometimesNaN(input_dim=64), datamodule=DigitsDataModule())
    merge, weight = algo.client_callbacks[0], algo.server_callbacks[1]
    selector = merge.selector
    assert trainer.summary["reject_reasons"].get("non_finite", 0) >= 3  # diverged jobs happened and were rejected
    assert trainer.summary["versions"] == 60
    assert all(torch.isfinite(p).all() for p in selector.policy.parameters())
    assert all(torch.isfinite(torch.as_tensor(q)).all() for q in selector.q_tables.values())
    assert torch.isfinite(torch.as_tensor(selector.baseline)).all()
    assert merge._controls and torch.isfinite(torch.tensor(list(merge._controls.values()))).all()
    assert weight._controls and torch.isfinite(torch.tensor(list(weight._controls.values()))).all()
    assert torch.isfinite(global_weights(trainer)).all()


def test_concurrent_runs_into_one_root_claim_distinct_versions(tmp_path):
    import threading

    from lightning.pytorch.loggers import CSVLogger

    from lit_asyncfl.loggers import claim_log_dir

    barrier, claimed = threading.Barrier(8), []

    def claim(i):
        loggers = [CSVLogger(str(tmp_path), name="FedAsync")] if i % 2 else []  # both kinds race for the same dirs
        barrier.wait()
        claimed.append(claim_log_dir(loggers, str(tmp_path), "FedAsync"))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(os.path.basename(p) for p in claimed) == [f"version_{i}" for i in range(8)]


def test_an_unwritable_root_is_refused_before_anything_runs(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=3, logger=True,
                           default_root_dir=str(blocker / "runs"))  # fmt: skip
    with pytest.raises(ValueError, match=r"cannot write the run's outputs under '.*a-file/runs'.*default_root_dir"):
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert trainer.simulator.events_processed == 0


def test_a_corrupted_or_non_finite_checkpoint_is_refused(tmp_path):
    from lit_asyncfl import checkpoint as ckpt

    trainer = _fit(tmp_path, max_versions=5)
    last = os.path.join(trainer.log_dir, "checkpoints", "last.ckpt")
    checkpoint = ckpt.load(last)  # intact: loads
    data = bytearray(open(last, "rb").read())
    weight = checkpoint["state_dict"]["net.1.weight"].numpy().tobytes()
    at = data.find(weight)
    assert at > 0  # the tensor's bytes, stored as they are in the file
    data[at + 100] ^= 0x01  # one bit of one weight
    corrupted = tmp_path / "corrupted.ckpt"
    corrupted.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"does not match the checksum stored in it"):
        ckpt.load(corrupted)
    with pytest.raises(ValueError, match=r"does not match the checksum"):
        make_trainer(tmp_path / "r", FedAsync(concurrency=3), max_versions=8).fit(
            Flaky(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=str(corrupted)
        )
    checkpoint["state_dict"]["net.1.bias"][3] = float("nan")
    ckpt.save(checkpoint, tmp_path / "nan.ckpt")  # a consistent checksum, of NaN weights
    with pytest.raises(ValueError, match=r"holds non-finite global weights \(NaN or inf in net.1.bias\)"):
        ckpt.load(tmp_path / "nan.ckpt")


# -- crash safety: SIGTERM and kill -9 ------------------------------------------------------------------------------
_SCRIPT = """
import sys, time, torch
from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression

class Slow(Callback):  # a run long enough to be killed mid-way
    def on_event_end(self, trainer):
        time.sleep(0.02)

trainer = FederatedTrainer(FedAsync(concurrency=3), num_clients=10, max_versions=80, logger=False,
                           enable_progress_bar=False, print_summary=False, default_root_dir=sys.argv[1],
                           checkpoint_every_seconds=0.2, callbacks=[Slow()])
torch.manual_seed(0)
trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
print("STOP", trainer.summary["stop_reason"], trainer.summary["versions"], flush=True)
"""


def _run_and_signal(tmp_path, sig):
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    root = tmp_path / "runs"
    last = root / "FedAsync" / "version_0" / "checkpoints" / "last.ckpt"
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert last.exists(), proc.communicate()[1][-2000:]  # a periodic checkpoint by default, without asking
    time.sleep(0.3)
    proc.send_signal(getattr(signal, sig))
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out, last


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGKILL"])
def test_a_killed_run_resumes_from_its_periodic_checkpoint_exactly(tmp_path, sig):
    from lit_asyncfl import checkpoint as ckpt

    code, out, last = _run_and_signal(tmp_path, sig)
    version = ckpt.load(last)["lit_asyncfl"]["version"]
    if sig == "SIGTERM":  # handled like Ctrl-C: a graceful stop with everything written
        assert code == 0 and "STOP interrupted (SIGTERM)" in out
        assert (last.parent.parent / "summary.json").exists()
    else:
        assert code == -9 and "STOP" not in out  # nothing ran after the kill: only the periodic checkpoint is left
    assert 0 < version < 80
    uninterrupted = make_trainer(tmp_path / "full", FedAsync(concurrency=3), max_versions=80)
    torch.manual_seed(0)
    uninterrupted.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    resumed = make_trainer(tmp_path / "resumed", FedAsync(concurrency=3), max_versions=80)
    resumed.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=str(last))
    assert torch.equal(global_weights(resumed), global_weights(uninterrupted))


def test_fedasmu_runs_under_the_lightning_engine_as_under_the_fast_one(tmp_path):
    """Merge requests after the last local step (the last slot) happen after the job's Trainer finished: its
    module's self.log must not be called there. Both engines give the same run."""
    from lit_asyncfl.algorithms import FedASMU
    from lit_asyncfl.client import ClientCallback
    from lit_asyncfl.models import LeNet5

    class MergedAtTheEnd(ClientCallback):
        def __init__(self):
            self.count = 0

        def on_fresh_model(self, trainer, job, fresh_weights, fresh_version, batch):
            self.count += job.request_step == job.num_steps

    weights = {}
    for engine in ("fast", "lightning"):
        algo = FedASMU(clients_per_trigger=3, max_parallel=4, num_slots=3, epsilon=0.5)
        spy = MergedAtTheEnd()
        algo.client_callbacks.append(spy)
        trainer = make_trainer(tmp_path / engine, algo, max_versions=25, engine=engine)
        torch.manual_seed(0)
        trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule())  # LeNet5 logs train_loss in training_step
        weights[engine] = global_weights(trainer)
        assert trainer.summary["versions"] == 25 and spy.count >= 1  # the case happened
    assert torch.equal(weights["fast"], weights["lightning"])


@pytest.mark.parametrize(
    ("model", "message"),
    [
        pytest.param(lambda: LogisticRegression(input_dim=10), r"shapes \[\(10, 1, 8, 8\), \(10,\)\] raised Runtime",
                     id="input-size"),
        pytest.param(lambda: LogisticRegression(input_dim=64, num_classes=3), r"raised IndexError: Target \d+ is out",
                     id="too-few-classes"),
    ],
)  # fmt: skip
def test_a_model_that_does_not_fit_the_data_is_refused_at_fit_start_naming_both(tmp_path, model, message):
    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), max_versions=3)
    with pytest.raises(ValueError, match=r"LogisticRegression does not fit the data of DigitsDataModule: .*" + message):
        trainer.fit(model(), datamodule=DigitsDataModule())


class MergedJobs(ServerCallback):
    """Records the jobs that merged a fresh model and trained on after it."""

    def __init__(self):
        self.jobs = []

    def on_aggregated(self, server, updates):
        self.jobs += [u.job.job_id for u in updates if "beta" in u.info and u.job.request_step < u.job.num_steps]


def fedasmu_failing_after_the_merge(tmp_path, name, failing=(), ckpt_path=None, model=None, in_merge=False, **kwargs):
    """A small FedASMU run whose jobs ``failing`` raise right after their merge (``in_merge``: in it, in a callback
    after FedASMU's): the trainer, the callback that records the drops and the jobs that merged and trained on."""
    from lit_asyncfl.algorithms import FedASMU

    algo = FedASMU(clients_per_trigger=3, max_parallel=4, num_slots=3, epsilon=0.5, lr_gamma=1e-2)
    fail, merged = (FailInTheMerge if in_merge else FailAfterTheMerge)(failing), MergedJobs()
    algo.client_callbacks.append(fail)
    algo.server_callbacks.append(merged)
    kwargs.setdefault("max_versions", 20)
    trainer = make_trainer(tmp_path / name, algo, **kwargs)
    FailAfterTheMerge.clock = lambda: trainer.simulator.now
    torch.manual_seed(0)
    model = model or LogisticRegression(input_dim=64)
    trainer.fit(model, datamodule=DigitsDataModule(), ckpt_path=ckpt_path)
    return trainer, fail, merged.jobs


def rewards_and_a_merged_job(tmp_path, monkeypatch, **kwargs):
    """The jobs whose merge rewards FedASMU's slot policy from now on (a list, filled as runs go) and a job that
    merged and trained on in a healthy run (``kwargs``: its arguments)."""
    from lit_asyncfl.rl import TimeSlotSelector

    rewarded = []
    reward = TimeSlotSelector.reward
    monkeypatch.setattr(TimeSlotSelector, "reward", lambda self, j, r: rewarded.append(j) or reward(self, j, r))
    _, _, merged = fedasmu_failing_after_the_merge(tmp_path, "healthy", **kwargs)
    rewarded.clear()
    return rewarded, sorted(merged)[len(merged) // 2]


def test_a_fedasmu_job_failing_after_its_merge_keeps_what_the_merge_taught_and_fails_at_its_arrival(
    tmp_path, monkeypatch
):
    """The merge at the request teaches FedASMU's slot policy and the client's controls; the rest of the job
    trains until its arrival. A job that raises after its merge keeps what its merge taught (learned at its request
    event) and fails at its arrival event: dropped there, or the run stops there with a checkpoint that holds the
    failure, so that a resumed run fails the job at the same event (issue 30; before, the job failed at its
    request and its merge taught nothing)."""
    rewarded, failing = rewards_and_a_merged_job(tmp_path, monkeypatch)
    dropped, fail, _ = fedasmu_failing_after_the_merge(tmp_path, "drop", {failing}, on_client_error="drop")
    assert failing in rewarded  # learned at its request event
    [(job_id, when, request, arrival)] = fail.drops
    assert job_id == failing and when == arrival > request  # dropped at its arrival event
    assert dropped.summary["drop_reasons"] == {"client_error": 1}

    message = rf"the job {failing} .* raised RuntimeError: boom after the merge of job {failing}"
    with pytest.raises(ClientJobError, match=message):
        fedasmu_failing_after_the_merge(tmp_path, "failing", {failing})
    last = str(next((tmp_path / "failing").rglob("last.ckpt")))
    resumed, fail, _ = fedasmu_failing_after_the_merge(tmp_path, "resumed", ckpt_path=last, on_client_error="drop")
    assert [d[0] for d in fail.drops] == [failing]
    assert torch.equal(global_weights(resumed), global_weights(dropped))
    again = (
        rf"the job {failing} .* before the checkpoint, after its request: RuntimeError: boom after the merge"
        r".* resume with on_client_error='drop' .* or from a checkpoint written before its request"
    )
    with pytest.raises(ClientJobError, match=again):
        fedasmu_failing_after_the_merge(tmp_path, "again", ckpt_path=last)


def test_a_fedasmu_job_failing_in_a_later_callbacks_merge_teaches_nothing_and_fails_at_its_request(
    tmp_path, monkeypatch
):
    """FedASMU's merge learns once every callback's ``on_fresh_model`` returned (where the Ray executor learns it):
    a job whose merge a later callback fails teaches the slot policy nothing and is dropped at its request event
    (before, FreshModelMerge learned inside its own ``on_fresh_model``, so the failing job had rewarded the policy
    sequentially but not on Ray)."""
    rewarded, failing = rewards_and_a_merged_job(tmp_path, monkeypatch)
    _, fail, _ = fedasmu_failing_after_the_merge(tmp_path, "drop", {failing}, in_merge=True, on_client_error="drop")
    [(job_id, when, request, _)] = fail.drops
    assert job_id == failing and when == request  # dropped at its request event
    assert failing not in rewarded and rewarded  # the others' merges taught the policy


class SettleWithABrokenExecutor(Callback):
    """Once a job is past its request and not settled: a checkpoint is taken while its executor's ``result``
    raises an error of the executor's own (a stopped executor's ``KeyError``); records what the checkpoint raised."""

    def __init__(self):
        self.errors = []

    def on_event_end(self, trainer):
        simulator = trainer.simulator
        past = [k for k, job in simulator.in_flight.items() if job.request_step is not None
                and not math.isnan(job.arrival_time) and k not in simulator.ready]  # fmt: skip
        if not past or self.errors:
            return

        def broken(job_id, fresh=None):
            raise KeyError(job_id)

        simulator.executor.result = broken
        try:
            simulator.state_dict()
            self.errors.append(None)
        except KeyError as error:
            self.errors.append(error)
        finally:
            del simulator.executor.result


def test_a_checkpoint_records_as_failing_after_its_merge_only_the_error_the_job_raised(tmp_path):
    """Settling the jobs past their request for a checkpoint records only the error the executor kept for a job
    (raised after its merge) as that job's failure; any other error (the executor's own: a stopped executor's
    ``KeyError``, a Ray worker dead too often) propagates (before, the checkpoint recorded it as the job's
    permanent failure)."""
    settle = SettleWithABrokenExecutor()
    fedasmu_failing_after_the_merge(tmp_path, "settle", callbacks=[settle], max_versions=6)
    [error] = settle.errors
    assert isinstance(error, KeyError)
