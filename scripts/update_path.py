"""Which ``lit_asyncfl`` source files one client update passes through (FedAsync, the ``fast`` engine).

A small FedAsync run (one job in flight, evaluation only at the start and the end, no logger, progress bar or
periodic checkpoint) is profiled over one whole event in its steady state: the arrival of an update, the job's
training (the sequential executor trains it when its update is needed), the server's staleness weight and
mixing, the scheduler's next dispatch, and the run callbacks' end of the event (profiled from the profiling
callback's ``on_event_end`` to the next one, so one whole cycle of the loop). Every Python call is recorded
(``sys.setprofile``); the files of ``lit_asyncfl`` are listed in the order they are first entered, with the
number of calls into each, then their count.

**User files** are the files of the classes of the run's ``LightningModule`` (``LeNet5`` and its base class in
``lit_asyncfl/models/``): a user's own module replaces them, so they are marked ``[user]`` and counted apart from
the **library files** (every other file of ``lit_asyncfl``).

**Returns** count the back-and-forth between library files: a call into library file ``F`` is a return when code
of ``F`` is already waiting lower on the call stack for a call it made into another file (``F -> G -> F``: the
callee, or something it called, calls back into its caller's file), e.g. a scheduler's hook dispatching through
the simulator that called it. Calls are counted outside the local-training inner loop: a call made while a frame
of user code is on the stack (``training_step``, what it calls: ``self.log``, ``self.trainer``) is not counted,
nor is a call into user code.

    python scripts/update_path.py            # the list and the counts
    python scripts/update_path.py --calls    # also the sequence of file changes and each return

The last two lines are ``files=N file_changes=M`` (every file, the user's included) and
``library_files=N user_files=M returns=K``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lit_asyncfl"


class Trace:
    """What one profiled window saw: files in order of first entry, calls per file, the sequence of file changes
    and the returns (each as ``caller -> callee``, see the module docstring)."""

    def __init__(self, user_files: set[str]) -> None:
        self.user_files = user_files
        self.order: list[str] = []
        self.calls: Counter[str] = Counter()
        self.changes: list[str] = []
        self.returns: list[str] = []
        self._stack: list[str | None] = []  # the file of each frame on the call stack (None: not lit_asyncfl)

    def _file(self, frame: Any) -> str | None:
        path = frame.f_code.co_filename
        return str(Path(path).relative_to(ROOT)) if path.startswith(str(PACKAGE)) else None

    def start(self, frame: Any) -> None:
        """Take the call stack below ``frame`` (the profiler starts in the middle of it)."""
        frames = []
        while frame is not None:
            frames.append(self._file(frame))
            frame = frame.f_back
        self._stack = frames[::-1]

    def profile(self, frame: Any, what: str, arg: Any) -> None:
        if what == "return":
            if self._stack:
                self._stack.pop()
            return
        if what != "call":
            return
        name = self._file(frame)
        self._count_return(name)
        self._stack.append(name)
        if name is None:
            return
        if name not in self.calls:
            self.order.append(name)
        self.calls[name] += 1
        if not self.changes or self.changes[-1] != name:
            self.changes.append(name)

    def _count_return(self, name: str | None) -> None:
        if name is None or name in self.user_files or any(f in self.user_files for f in self._stack):
            return
        caller = next((f for f in reversed(self._stack) if f is not None), None)
        if caller is not None and caller != name and name in self._stack:
            self.returns.append(f"{_short(caller)} -> {_short(name)}")


def _short(name: str) -> str:
    return str(Path(name).relative_to("lit_asyncfl").with_suffix(""))


def trace_one_update(event: int = 4) -> Trace:
    """Profile event ``event`` of a small FedAsync run (see the module docstring)."""
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import FedAsync
    from lit_asyncfl.callbacks import Callback
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.models import LeNet5

    model = LeNet5(lr=0.05)
    user = {inspect.getsourcefile(c) for c in type(model).__mro__ if c.__module__.startswith("lit_asyncfl.")}
    trace = Trace({str(Path(f).resolve().relative_to(ROOT)) for f in user if f is not None})

    class Window(Callback):
        """Profiles from the end of event ``event - 1`` to the end of event ``event``."""

        def on_event_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            done = trainer.simulator.events_processed
            if done == event - 1:
                trace.start(sys._getframe())
                sys.setprofile(trace.profile)
            elif done == event:
                sys.setprofile(None)

    trainer = FederatedTrainer(
        FedAsync(concurrency=1),
        num_clients=4,
        max_versions=event + 2,
        eval_every=1000,
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        checkpoint_every_seconds=None,
        callbacks=[Window()],
        default_root_dir=tempfile.mkdtemp(prefix="update_path_"),
    )
    trainer.fit(model, datamodule=DigitsDataModule())
    sys.setprofile(None)
    return trace


def compress(seq: list[str], longest: int = 4) -> list[str]:
    """``seq`` with each run of a repeated cycle of up to ``longest`` items written once, as ``(a -> b) x N``.

    Example:
        >>> compress(["a", "b", "c", "b", "c", "b", "c", "d"])
        ['a', '(b -> c) x3', 'd']
    """
    out, i = [], 0
    while i < len(seq):
        for k in range(1, longest + 1):
            cycle, n = seq[i : i + k], 1
            while seq[i + n * k : i + (n + 1) * k] == cycle:
                n += 1
            if n > 1:
                out.append(f"({' -> '.join(cycle)}) x{n}")
                i += n * k
                break
        else:
            out.append(seq[i])
            i += 1
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="also print the sequence of file changes and returns")
    args = parser.parse_args()
    trace = trace_one_update()
    for name in trace.order:
        mark = "  [user]" if name in trace.user_files else ""
        print(f"{name}  ({trace.calls[name]} calls){mark}")
    if args.calls:
        print("sequence of file changes (a repeated cycle shown once, with its count):")
        print(" -> ".join(compress([_short(c) for c in trace.changes])))
        print("returns (a call back into a library file waiting lower on the stack):")
        for line in compress(trace.returns):
            print(f"  {line}")
    user = [name for name in trace.order if name in trace.user_files]
    print(f"files={len(trace.order)} file_changes={len(trace.changes) - 1}")
    print(f"library_files={len(trace.order) - len(user)} user_files={len(user)} returns={len(trace.returns)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
