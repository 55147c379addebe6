"""Run outputs: history CSV, summary table, accuracy plot."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BASE_COLUMNS = ("version", "virtual_time", "accuracy", "loss", "updates_received", "updates_aggregated", "wall_time")


def first_reaching(history: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation whose accuracy reaches ``target`` (``None`` if none did).

    Example:
        >>> rows = [{"version": 0, "accuracy": 0.1}, {"version": 7, "accuracy": 0.85}]
        >>> first_reaching(rows, 0.8)["version"], first_reaching(rows, 0.9)
        (7, None)
    """
    return next((r for r in history if r.get("accuracy") is not None and r["accuracy"] >= target), None)


def time_to_target(history: Sequence[dict[str, Any]], target: float) -> float | None:
    """Virtual time of the first evaluation whose accuracy reaches ``target`` (``None`` if never).

    Example:
        >>> time_to_target([{"virtual_time": 0, "accuracy": 0.1}, {"virtual_time": 9.5, "accuracy": 0.85}], 0.8)
        9.5
    """
    row = first_reaching(history, target)
    return None if row is None else float(row["virtual_time"])


def write_history_csv(history: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write one row per evaluation; the base columns first, then every other logged metric."""
    extra = sorted({k for row in history for k in row} - set(BASE_COLUMNS))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*BASE_COLUMNS, *extra])
        writer.writeheader()
        for row in history:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def _fmt(value: Any) -> str:
    if value is None:
        return "not reached"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """A two-column text table of a run summary.

    Example:
        >>> print(format_summary({"algorithm": "FedAsync", "final_accuracy": 0.91}))
        ──────────────────────────────────
         algorithm           FedAsync
         final_accuracy      0.9100
        ──────────────────────────────────
    """
    width = max(len(k) for k in summary) + 2
    rule = "─" * 34
    lines = [rule]
    lines += [f" {key.ljust(width)}    {_fmt(value)}" for key, value in summary.items()]
    lines.append(rule)
    return "\n".join(lines)


def plot_history(history: Sequence[dict[str, Any]], path: str | Path, title: str, target: float | None = None) -> None:
    """Save accuracy and loss against virtual time as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in history if r.get("accuracy") is not None]
    times = [r["virtual_time"] for r in rows]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_acc.plot(times, [r["accuracy"] for r in rows], marker=".", label="global model")
    if target is not None:
        ax_acc.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax_acc.set_xlabel("virtual time (s)")
    ax_acc.set_ylabel("accuracy")
    ax_acc.set_ylim(0, 1)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(loc="lower right")
    ax_loss.plot(times, [r["loss"] for r in rows], marker=".", color="tab:red")
    ax_loss.set_xlabel("virtual time (s)")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
