"""Which ``lit_asyncfl`` source files one client update passes through (FedAsync, the ``fast`` engine).

A small FedAsync run (one job in flight, evaluation only at the start and the end, no logger, progress bar or
periodic checkpoint) is profiled over one whole event in its steady state: the arrival of an update, the job's
training (the sequential executor trains it when its update is needed), the server's staleness weight and
mixing, the scheduler's next dispatch, and the run callbacks' end of the event (profiled from the profiling
callback's ``on_event_end`` to the next one, so one whole cycle of the loop). Every Python call is recorded
(``sys.setprofile``); the files of ``lit_asyncfl`` are listed in the order they are first entered, with the
number of calls into each, then their count.

    python scripts/update_path.py            # the list and the count
    python scripts/update_path.py --calls    # also the sequence of file changes (shows back-and-forth)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lit_asyncfl"


def trace_one_update(event: int = 4) -> tuple[list[str], Counter[str], list[str]]:
    """(files in order of first entry, calls per file, the sequence of file changes) over event ``event``."""
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import FedAsync
    from lit_asyncfl.callbacks import Callback
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.models import LeNet5

    order: list[str] = []
    calls: Counter[str] = Counter()
    changes: list[str] = []
    package = str(PACKAGE)

    def profile(frame: Any, what: str, arg: Any) -> None:
        if what != "call":
            return
        path = frame.f_code.co_filename
        if not path.startswith(package):
            return
        name = str(Path(path).relative_to(ROOT))
        if name not in calls:
            order.append(name)
        calls[name] += 1
        if not changes or changes[-1] != name:
            changes.append(name)

    class Window(Callback):
        """Profiles from the end of event ``event - 1`` to the end of event ``event``."""

        def on_event_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            done = trainer.simulator.events_processed
            if done == event - 1:
                sys.setprofile(profile)
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
    trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule())
    sys.setprofile(None)
    return order, calls, changes


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
    parser.add_argument("--calls", action="store_true", help="also print the sequence of file changes")
    args = parser.parse_args()
    order, calls, changes = trace_one_update()
    for name in order:
        print(f"{name}  ({calls[name]} calls)")
    if args.calls:
        print("sequence of file changes (a repeated cycle shown once, with its count):")
        print(" -> ".join(compress([str(Path(c).relative_to("lit_asyncfl").with_suffix("")) for c in changes])))
    print(f"files={len(order)} file_changes={len(changes) - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
