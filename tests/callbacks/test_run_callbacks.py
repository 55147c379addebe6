"""Run callbacks: user hooks, ModelCheckpoint's top-k, EarlyStopping's patience, their state across a resume."""

from __future__ import annotations

import pytest
import torch
from conftest import global_weights, make_trainer, run

from lit_asyncfl.algorithms import FedAsync, FedBuff
from lit_asyncfl.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.evaluation import evaluate
from lit_asyncfl.models import LeNet5


class Recorder(Callback):
    """Records every hook call; optionally stops the run at a version."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.stop_at = stop_at
        self.seen: list[tuple[int, float]] = []
        self.calls: list[str] = []

    def on_fit_start(self, trainer):
        self.calls.append("fit_start")

    def on_new_version(self, trainer):
        self.calls.append(f"version {trainer.simulator.server.version}")

    def on_evaluation_end(self, trainer, metrics):
        self.calls.append(f"evaluation {metrics['version']}")
        self.seen.append((metrics["version"], metrics["accuracy"]))
        if self.stop_at is not None and metrics["version"] >= self.stop_at:
            trainer.request_stop("enough")

    def on_fit_end(self, trainer):
        self.calls.append("fit_end")

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state_dict):
        self.seen = [tuple(s) for s in state_dict["seen"]]


class ScriptedScore(LeNet5):
    """Logs ``val_score`` from a fixed sequence, one value per evaluation (the digits' validation set is one batch)."""

    scores: list[float]
    evaluations = 0

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val_score", self.scores[min(self.evaluations, len(self.scores) - 1)])
        self.evaluations += 1


def scripted(scores):
    torch.manual_seed(0)  # built before the trainer seeds the RNGs: same initial weights in every run
    model = ScriptedScore(lr=0.05)  # the scores are no hyper-parameter: a resumed run may continue the sequence
    model.scores = list(scores)
    return model


def test_a_user_callback_sees_every_new_version_and_evaluation_in_order(tmp_path):
    recorder = Recorder()
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=6, eval_every=2, callbacks=[recorder])
    assert recorder.seen == [(r["version"], r["accuracy"]) for r in trainer.history]
    expected = ["fit_start", "evaluation 0"]
    for v in range(1, 7):
        expected += [f"version {v}"] + ([f"evaluation {v}"] if v % 2 == 0 else [])
    assert recorder.calls == [*expected, "fit_end"]


def test_a_user_callback_can_stop_the_run_with_its_reason(tmp_path):
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=20, eval_every=2, callbacks=[Recorder(stop_at=6)])
    assert trainer.summary["stop_reason"] == "enough" and trainer.summary["versions"] == 6
    assert [r["version"] for r in trainer.history] == [0, 2, 4, 6]


def test_should_stop_set_directly_stops_as_in_lightning(tmp_path):
    class Stopper(Callback):
        def on_new_version(self, trainer):
            if trainer.simulator.server.version == 3:
                trainer.should_stop = True

    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=20, callbacks=[Stopper()])
    assert trainer.summary["versions"] == 3 and trainer.summary["stop_reason"] == "callback"


def test_callback_state_survives_a_resume_as_in_the_uninterrupted_run(tmp_path):
    full_recorder = Recorder()
    full = run(tmp_path / "full", FedBuff(buffer_size=2, concurrency=4), max_versions=10, eval_every=2,
               callbacks=[full_recorder])  # fmt: skip
    times = {}

    class VersionTimes(Callback):
        def on_new_version(self, trainer):
            times[trainer.simulator.server.version] = trainer.simulator.now

    run(tmp_path / "times", FedBuff(buffer_size=2, concurrency=4), max_versions=10, callbacks=[VersionTimes()])
    stop_at = times[5] + 1e-6  # right after version 5: the first run ends with an off-schedule evaluation
    first = run(tmp_path / "first", FedBuff(buffer_size=2, concurrency=4), max_virtual_time=stop_at, eval_every=2,
                callbacks=[Recorder()])  # fmt: skip
    assert 0 < first.simulator.server.version < 10
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    saved = torch.load(ckpt, weights_only=True)["lit_asyncfl"]
    on_schedule = [(r["version"], r["accuracy"]) for r in first.history if r["version"] % 2 == 0]
    assert first.history[-1]["version"] % 2 == 1  # the first run ended with an off-schedule evaluation ...
    assert [tuple(s) for s in saved["callbacks"]["Recorder"]["seen"]] == on_schedule  # ... not in the checkpoint
    resumed_recorder = Recorder()
    resumed = make_trainer(tmp_path / "resumed", FedBuff(buffer_size=2, concurrency=4), max_versions=10,
                           eval_every=2, callbacks=[resumed_recorder])  # fmt: skip
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed_recorder.seen == full_recorder.seen

    def without_wall_time(history):
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in history]

    assert without_wall_time(resumed.history) == without_wall_time(full.history)


def lightning_top_k(scores, k):
    """Lightning's rule for mode="max": a model enters when strictly better than the k-th, which is the oldest of
    the worst scores kept."""
    kept = {}
    for version, score in scores:
        if len(kept) < k:
            kept[version] = score
            continue
        kth = min(kept, key=kept.get)
        if score > kept[kth]:
            del kept[kth]
            kept[version] = score
    return kept


class StubTrainer:
    """What ModelCheckpoint needs of a trainer: save_checkpoint writes an empty file."""

    final_evaluation = False

    def __init__(self, log_dir):
        self.log_dir = str(log_dir)
        self.saved = []

    def save_checkpoint(self, path, weights_only=False):
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(b"")
        self.saved.append(str(path))


def feed(checkpoint, trainer, scores, name="val_acc"):
    checkpoint.on_fit_start(trainer)
    for version, score in enumerate(scores):
        checkpoint.on_evaluation_end(trainer, {"version": version, name: score})


def test_model_checkpoint_ranks_ties_as_lightning_does(tmp_path):
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=3)
    feed(checkpoint, StubTrainer(tmp_path), [0.3, 0.3, 0.5, 0.9])
    kept = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert kept == ["version=1-val_acc=0.3000.ckpt", "version=2-val_acc=0.5000.ckpt", "version=3-val_acc=0.9000.ckpt"]
    assert set(checkpoint.best_k_models) == {str(tmp_path / "checkpoints" / name) for name in kept}
    feed(tie := ModelCheckpoint(monitor="val_acc", mode="max"), StubTrainer(tmp_path / "b"), [0.5, 0.5])
    assert "version=0-" in tie.best_model_path  # an equal score does not replace the best


def test_model_checkpoint_with_a_fixed_name_or_a_slash_in_the_metric_keeps_exactly_its_files(tmp_path):
    fixed = ModelCheckpoint(monitor="val_acc", mode="max", filename="best")
    feed(fixed, StubTrainer(tmp_path / "fixed"), [0.1, 0.5, 0.7])
    assert [p.name for p in (tmp_path / "fixed" / "checkpoints").iterdir()] == ["best.ckpt"]
    assert fixed.best_model_path.endswith("best.ckpt") and fixed.best_model_score == 0.7
    slash = ModelCheckpoint(monitor="val/acc", mode="max")
    feed(slash, StubTrainer(tmp_path / "slash"), [0.1, 0.5, 0.7, 0.2], name="val/acc")
    files = [p for p in (tmp_path / "slash" / "checkpoints").rglob("*.ckpt")]
    assert [str(p) for p in files] == [slash.best_model_path] and "val/acc=0.7000" in slash.best_model_path


def test_model_checkpoint_keeps_exactly_the_top_k_global_models(tmp_path):
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=3)
    trainer = run(tmp_path, FedAsync(concurrency=4), max_versions=14, eval_every=1, callbacks=[checkpoint])
    expected = lightning_top_k([(r["version"], r["val_acc"]) for r in trainer.history], 3)
    files = sorted(p for p in (tmp_path / "FedAsync").rglob("version=*.ckpt"))
    assert len(files) == 3
    dm = DigitsDataModule()
    dm.setup("fit")
    loaded_versions = {}
    for path in files:
        ckpt = torch.load(path, weights_only=True)
        model = LeNet5.load_from_checkpoint(path)
        metrics = evaluate(model, dm.val_dataloader())
        loaded_versions[ckpt["global_step"]] = metrics["val_acc"]  # the file's model scores what was logged
    assert loaded_versions == expected
    best_version = max(expected, key=expected.get)  # the oldest of equal best scores
    assert checkpoint.best_model_score == expected[best_version]
    assert f"version={best_version}-" in checkpoint.best_model_path


def test_model_checkpoint_without_monitor_keeps_the_latest_and_can_keep_a_resumable_last(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpts", save_last=True, every_n_versions=4)
    trainer = run(tmp_path, FedAsync(concurrency=4), max_versions=10, eval_every=2, callbacks=[checkpoint])
    names = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert names == ["last.ckpt", "version=8.ckpt"]  # checks at versions 0, 4, 8 (every >= 4 versions)
    resumed = make_trainer(tmp_path / "again", FedAsync(concurrency=4), max_versions=10, eval_every=2)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(), ckpt_path=str(tmp_path / "ckpts" / "last.ckpt"))
    assert torch.equal(global_weights(resumed), global_weights(trainer))


@pytest.mark.parametrize(
    ("scores", "kwargs", "stopped_after"),
    [
        pytest.param([0.1, 0.5, 0.4, 0.5, 0.45, 0.9], {"patience": 3}, 5, id="equal-is-no-improvement"),
        pytest.param([0.1, 0.5, 0.55, 0.56, 0.57, 0.9], {"patience": 2, "min_delta": 0.02}, 5, id="min-delta"),
        pytest.param([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7], {"patience": 1}, None, id="always-improving"),
        pytest.param([0.1, 0.2, 0.95, 0.1], {"patience": 5, "stopping_threshold": 0.9}, 3, id="threshold"),
        pytest.param([0.125, 0.875, 0.9, 0.1], {"patience": 5, "stopping_threshold": 0.875}, 3, id="threshold-strict"),
        pytest.param([0.5, 0.4, 0.1, 0.6], {"patience": 5, "divergence_threshold": 0.2}, 3, id="divergence"),
        pytest.param([0.5, 0.6, float("nan"), 0.9], {"patience": 5}, 3, id="not-finite"),
    ],
)
def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path, scores, kwargs, stopped_after):
    stopper = EarlyStopping(monitor="val_score", mode="max", **kwargs)
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=12, eval_every=2, callbacks=[stopper],
                  model=scripted(scores))  # fmt: skip
    if stopped_after is None:
        assert trainer.summary["stop_reason"] == "max_versions" and stopper.stopped_version is None
    else:
        assert trainer.summary["stop_reason"] == "early_stopping"
        assert len(trainer.history) == stopped_after  # stopped at the boundary of the deciding evaluation's event
        assert trainer.summary["versions"] == 2 * (stopped_after - 1) == stopper.stopped_version


def test_early_stopping_with_min_mode_and_its_patience_across_a_resume(tmp_path):
    scores = [1.0, 0.8, 0.9, 0.85, 0.7, 0.75, 0.76, 0.77, 0.78]
    full_stop = EarlyStopping(monitor="val_score", mode="min", patience=3)
    full = run(tmp_path / "full", FedAsync(concurrency=3), max_versions=30, eval_every=2, callbacks=[full_stop],
               model=scripted(scores))  # fmt: skip
    assert full.summary["stop_reason"] == "early_stopping" and full.summary["versions"] == 14  # 0.7 at version 8
    first = run(tmp_path / "first", FedAsync(concurrency=3), max_versions=10, eval_every=2,
                callbacks=[EarlyStopping(monitor="val_score", mode="min", patience=3)],
                model=scripted(scores))  # fmt: skip
    assert first.summary["stop_reason"] == "max_versions"
    resumed_stop = EarlyStopping(monitor="val_score", mode="min", patience=3)
    resumed = make_trainer(tmp_path / "resumed", FedAsync(concurrency=3), max_versions=30, eval_every=2,
                           callbacks=[resumed_stop])  # fmt: skip
    model = scripted(scores[6:])  # the first run's evaluations at versions 0..10 used scores[:6]
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed.fit(model, datamodule=DigitsDataModule(), ckpt_path=str(ckpt))
    assert resumed_stop.best_score == pytest.approx(0.7, abs=1e-6) and resumed.summary["versions"] == 14
    assert torch.equal(global_weights(resumed), global_weights(full))


def test_a_missing_monitored_metric_is_named_with_the_logged_ones(tmp_path):
    with pytest.raises(RuntimeError, match=r"EarlyStopping\(monitor='val_f1'\).*'val_acc', 'val_loss'"):
        run(tmp_path / "a", FedAsync(concurrency=2), max_versions=2, callbacks=[EarlyStopping(monitor="val_f1")])
    with pytest.raises(RuntimeError, match=r"ModelCheckpoint\(monitor='val_f1'\).*'val_acc'"):
        run(tmp_path / "b", FedAsync(concurrency=2), max_versions=2, callbacks=[ModelCheckpoint(monitor="val_f1")])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: EarlyStopping(monitor="val_acc", mode="up"), r"mode must be one of \['min', 'max'\], got 'up'"),
        (lambda: EarlyStopping(monitor="val_acc", patience=0), r"patience must be an integer >= 1, got 0"),
        (lambda: EarlyStopping(monitor="val_acc", min_delta=-1), r"min_delta must be a finite number >= 0"),
        (lambda: ModelCheckpoint(save_top_k=2), r"save_top_k=2, monitor=None\) has no metric"),
        (lambda: ModelCheckpoint(monitor="val_acc", save_top_k=-2), r"save_top_k must be an integer >= -1"),
        (lambda: ModelCheckpoint(every_n_versions=0), r"every_n_versions must be an integer >= 1 or None, got 0"),
    ],
)
def test_callback_arguments_are_checked_at_construction(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_two_callbacks_with_one_state_key_are_refused():
    from lit_asyncfl import FederatedTrainer

    with pytest.raises(ValueError, match=r"distinct state_key values; duplicated: \[\"EarlyStopping"):
        FederatedTrainer(max_versions=1, callbacks=[EarlyStopping("val_acc"), EarlyStopping("val_acc", patience=5)])
    FederatedTrainer(max_versions=1, callbacks=[EarlyStopping("val_acc"), EarlyStopping("val_loss")], logger=False)


def test_the_final_off_schedule_evaluation_neither_ranks_stops_nor_changes_the_stop_reason(tmp_path):
    class StopsLate(Callback):
        def on_evaluation_end(self, trainer, metrics):
            if trainer.final_evaluation:
                trainer.request_stop("too late")

    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max", save_top_k=2)
    trainer = run(tmp_path, FedAsync(concurrency=3), max_versions=7, eval_every=2, callbacks=[StopsLate(), checkpoint])
    assert trainer.history[-1]["version"] == 7 and trainer.summary["stop_reason"] == "max_versions"
    on_disk = {str(p) for p in (tmp_path / "FedAsync").rglob("version=*.ckpt")}
    assert on_disk == set(checkpoint.best_k_models)  # files and state agree
    saved = torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)["lit_asyncfl"]["callbacks"]
    assert set(saved[checkpoint.state_key]["best_k_models"]) == on_disk  # and so does the checkpoint


def test_ctrl_c_stops_gracefully_even_after_a_callback_asked_to_stop(tmp_path):
    import os
    import signal

    class CtrlC(Callback):
        def __init__(self, request_first):
            self.request_first = request_first

        def on_new_version(self, trainer):
            if trainer.simulator.server.version == 3:
                if self.request_first:
                    trainer.request_stop("mine")
                os.kill(os.getpid(), signal.SIGINT)  # one Ctrl-C: a graceful stop, never an abort

    previous = signal.getsignal(signal.SIGINT)
    for request_first, reason in [(False, "interrupted"), (True, "mine")]:
        out = tmp_path / reason
        trainer = run(out, FedAsync(concurrency=3), max_versions=20, callbacks=[CtrlC(request_first)])
        assert trainer.summary["stop_reason"] == reason and trainer.summary["versions"] == 3
        assert next(out.rglob("last.ckpt")).is_file() and next(out.rglob("summary.json")).is_file()
        assert signal.getsignal(signal.SIGINT) is previous  # the handler is restored
