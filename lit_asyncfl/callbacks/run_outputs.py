"""``RunOutputs``: the files a run leaves in its log dir, and the summary table it prints."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.reporting import (
    format_summary,
    plot_availability,
    plot_history,
    plot_partition,
    write_history_csv,
    write_partition_csv,
)

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer

log = logging.getLogger("lit_asyncfl")


class RunOutputs(Callback):
    """Writes ``history.csv``, ``summary.json``, ``accuracy.png`` (the monitored metric and the loss against
    virtual time), ``config.yaml`` (CLI runs), ``partition.csv`` and ``partition.png`` (label-partitioned data),
    ``availability.png`` (devices online over virtual time, when devices come and go) into the log dir at the end
    of the run, and prints the summary table. Every trainer has one.

    Args:
        print_summary: Print the summary table and where the outputs are.

    Example:
        >>> RunOutputs(print_summary=False).print_summary
        False
    """

    def __init__(self, print_summary: bool = True) -> None:
        self.print_summary = print_summary

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        """The same files for a run an exception ended (its summary's ``stop_reason`` says ``error: <type>``)."""
        if not trainer.summary:
            return
        try:
            self.on_fit_end(trainer)
        except Exception as error:  # never hide the exception that ended the run
            log.warning("lit_asyncfl: could not write the outputs of the failed run: %r", error)

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        out = Path(trainer.log_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_history_csv(trainer.history, out / "history.csv")
        (out / "summary.json").write_text(json.dumps(trainer.summary, indent=2))
        if trainer.run_config is not None:
            import yaml

            (out / "config.yaml").write_text(yaml.safe_dump(trainer.run_config, sort_keys=False))
        if any(r.get("accuracy") is not None for r in trainer.history):
            metric = trainer.summary.get("monitor") or "accuracy"
            plot_history(trainer.history, out / "accuracy.png", trainer.algorithm.name, trainer.target_accuracy, metric)
        sim = trainer.simulator
        if sim is not None and not sim.availability.always_online:
            plot_availability(sim.availability, sim.now, out / "availability.png", trainer.algorithm.name)
        dm = trainer.datamodule
        counts = getattr(dm, "partition_counts", None)
        if counts is not None:
            slowness = sim.profiles.time_per_sample if sim is not None else None
            write_partition_csv(counts, out / "partition.csv", slowness)
            plot_partition(counts, out / "partition.png", f"{type(dm).__name__}: {dm.partitioner!r}")
        if self.print_summary:
            print(format_summary(trainer.summary))
            print(f"outputs in {out}/ (history.csv, summary.json, accuracy.png, partition.csv, checkpoints/last.ckpt)")
