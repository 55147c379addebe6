"""Measure what a failure of each kind loses: the work a resume from ``last.ckpt`` must redo, and whether it ends
with the uninterrupted run's weights.

Each kind fails one FedAsync run on the bundled digits (10 clients, LogisticRegression, 120 versions; MOON with
its state on disk for the full disk) part-way, resumes from the run's ``checkpoints/last.ckpt`` with the cause
removed, and compares the final global weights with those of the same run never interrupted (``torch.equal``).
``kill -9`` and ``SIGTERM`` hit a separate process running with ``checkpoint_every_seconds=1`` and events made
~40 ms long, 1.7 s after its first periodic checkpoint; the full disk (MOON, 12 versions, ``client_state_budget=0``)
makes every file write fail after the 40th (checkpoints every 25 events stand in for the periodic ones). The
logger fails at its 7th ``log_metrics`` and the run callback at the evaluation of version 60, both with
``checkpoint_every_seconds=None``.

    python scripts/failure_losses.py            # prints a Markdown table (docs/reproducibility.md quotes it)
"""

from __future__ import annotations

import builtins
import errno
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.loggers import Logger

from lit_asyncfl import FederatedTrainer
from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.algorithms import MOON, FedAsync
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5, LogisticRegression

VERSIONS = 120


class Broken(LogisticRegression):
    """Raises in its ``fail_at``-th training step (a bug the user then fixes; 0: never, every run uses it)."""

    fail_at = 0
    steps = 0

    def training_step(self, batch, batch_idx):
        Broken.steps += 1
        if Broken.steps == Broken.fail_at:
            raise RuntimeError("bug")
        return super().training_step(batch, batch_idx)


class BlipLogger(Logger):
    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.calls = fail_at, 0

    name = "blip"
    version = 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise ConnectionError("network blip")


class BuggyCallback(Callback):
    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        if metrics["version"] == 60:
            raise RuntimeError("callback bug")


def trainer(root: Path, algorithm: Any = None, **kwargs: Any) -> FederatedTrainer:
    kwargs.setdefault("checkpoint_every_seconds", None)
    kwargs.setdefault("max_versions", VERSIONS)
    return FederatedTrainer(algorithm or FedAsync(concurrency=3), num_clients=10,
                            eval_every=10, logger=kwargs.pop("logger", False), enable_progress_bar=False,
                            print_summary=False, default_root_dir=str(root), **kwargs)  # fmt: skip


def fit(t: FederatedTrainer, ckpt_path: str | None = None) -> FederatedTrainer:
    torch.manual_seed(0)
    t.fit(Broken(input_dim=64), DigitsDataModule(), ckpt_path=ckpt_path)
    return t


def last_ckpt(root: Path) -> Path | None:
    return next(root.rglob("last.ckpt"), None)


def outcome(root: Path, reached: int, reference: torch.Tensor, resume: Any) -> dict[str, Any]:
    path = last_ckpt(root)
    if path is None:
        return {"reached": reached, "ckpt": "none", "lost": reached, "exact": "no checkpoint"}
    version = int(ckpt.load(path)["lit_asyncfl"]["version"])
    resumed = resume(str(path))
    return {"reached": reached, "ckpt": version, "lost": reached - version,
            "exact": torch.equal(resumed.simulator.server.weights, reference)}  # fmt: skip


def in_process(kind: str, tmp: Path, reference: torch.Tensor) -> dict[str, Any]:
    root = tmp / kind
    extra: dict[str, Any] = {}
    if kind == "client job (raise)":
        Broken.steps, Broken.fail_at = 0, 300
    elif kind == "logger":
        extra = {"logger": BlipLogger(fail_at=7)}
    elif kind == "run callback":
        extra = {"callbacks": [BuggyCallback()]}
    t = trainer(root, **extra)
    try:
        fit(t)
    except Exception:
        pass
    Broken.fail_at = 0
    reached = t.simulator.server.version if t.simulator is not None else 0
    return outcome(root, reached, reference, lambda p: fit(trainer(tmp / f"{kind}-resumed"), ckpt_path=p))


def client_job_drop(tmp: Path, reference: torch.Tensor) -> dict[str, Any]:
    Broken.steps, Broken.fail_at = 0, 300
    t = fit(trainer(tmp / "drop", on_client_error="drop"))
    Broken.fail_at = 0
    return {"reached": t.summary["versions"], "ckpt": "end", "lost": f"{t.summary['updates_dropped']} job",
            "exact": "no: the run goes on without the job"}  # fmt: skip


_CHILD = """
import sys, time, torch
sys.path.insert(0, sys.argv[2])
from failure_losses import Broken
from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.data import DigitsDataModule
class Slow(Callback):
    def on_event_end(self, trainer):
        time.sleep(0.04)
        print("V", trainer.simulator.server.version, flush=True)
t = FederatedTrainer(FedAsync(concurrency=3), num_clients=10, max_versions=VERSIONS, eval_every=10, logger=False,
                     enable_progress_bar=False, print_summary=False, default_root_dir=sys.argv[1],
                     checkpoint_every_seconds=1.0, callbacks=[Slow()])
torch.manual_seed(0)
t.fit(Broken(input_dim=64), DigitsDataModule())
print("STOP", t.summary["stop_reason"], flush=True)
""".replace("VERSIONS", str(VERSIONS))


def signalled(sig: signal.Signals, tmp: Path, reference: torch.Tensor) -> dict[str, Any]:
    root = tmp / sig.name
    script = tmp / "child.py"
    script.write_text(_CHILD)
    here = str(Path(__file__).resolve().parent)
    proc = subprocess.Popen([sys.executable, str(script), str(root), here], stdout=subprocess.PIPE, text=True)
    time.sleep(0.1)
    while last_ckpt(root) is None and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1.7)  # between two periodic checkpoints
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    versions = [int(line.split()[1]) for line in out.splitlines() if line.startswith("V ")]
    return outcome(root, max(versions), reference, lambda p: fit(trainer(tmp / f"{sig.name}-resumed"), ckpt_path=p))


def full_disk(tmp: Path) -> dict[str, Any]:
    def moon(root: Path, **kwargs: Any) -> FederatedTrainer:
        return trainer(root, MOON(mu=1.0, clients_per_round=4), max_versions=12, client_state_budget=0, **kwargs)

    def lenet(ckpt_path: str | None, root: Path, **kwargs: Any) -> FederatedTrainer:
        t = moon(root, **kwargs)
        torch.manual_seed(0)
        t.fit(LeNet5(lr=0.05), DigitsDataModule(), ckpt_path=ckpt_path)
        return t

    reference = lenet(None, tmp / "disk-reference").simulator.server.weights
    real_open, spills = builtins.open, []

    def open_on_a_full_disk(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if "w" in mode and str(file).endswith((".bin", ".tmp")):
            spills.append(file)
            if len(spills) > 40:
                raise OSError(errno.ENOSPC, "No space left on device", str(file))
        return real_open(file, mode, *args, **kwargs)

    failed = moon(tmp / "disk", checkpoint_every=25)
    builtins.open = open_on_a_full_disk
    try:
        torch.manual_seed(0)
        failed.fit(LeNet5(lr=0.05), DigitsDataModule())
    except Exception as error:
        print(f"full disk ended the run with {type(error).__name__}", file=sys.stderr)
    finally:
        builtins.open = real_open
    reached = failed.simulator.server.version
    return outcome(tmp / "disk", reached, reference, lambda p: lenet(p, tmp / "disk-resumed"))


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        reference = fit(trainer(tmp / "reference")).simulator.server.weights
        rows = {kind: in_process(kind, tmp, reference) for kind in ("client job (raise)", "logger", "run callback")}
        rows["client job (drop)"] = client_job_drop(tmp, reference)
        rows["kill -9"] = signalled(signal.SIGKILL, tmp, reference)
        rows["SIGTERM"] = signalled(signal.SIGTERM, tmp, reference)
        rows["full disk (MOON, state on disk)"] = full_disk(tmp)
    print("failure | versions reached | last.ckpt at version | versions to redo | resume == uninterrupted")
    print("---|---|---|---|---")
    for kind, r in rows.items():
        print(f"{kind} | {r['reached']} | {r['ckpt']} | {r['lost']} | {r['exact']}")


if __name__ == "__main__":
    main()
