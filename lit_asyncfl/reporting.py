"""Run outputs: history CSV, summary table, accuracy plot, partition description."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

BASE_COLUMNS = (
    "version",
    "virtual_time",
    "accuracy",
    "loss",
    "updates_received",
    "updates_aggregated",
    "updates_dropped",
    "num_online",
    "wall_time",
)


#: Summary keys that only an evaluation of the global model fills ("not evaluated" in the table of a run without).
EVALUATED_KEYS = ("monitor", "final_accuracy", "best_accuracy", "time_to_target", "versions_to_target")


def first_reaching(history: Sequence[dict[str, Any]], target: float, mode: str = "max") -> dict[str, Any] | None:
    """The first evaluation whose ``accuracy`` (the monitored metric) reaches ``target`` (``None`` if none did):
    at or above it for ``mode="max"``, at or below it for ``mode="min"``.

    Example:
        >>> rows = [{"version": 0, "accuracy": 0.1}, {"version": 7, "accuracy": 0.85}]
        >>> first_reaching(rows, 0.8)["version"], first_reaching(rows, 0.9), first_reaching(rows, 0.2, "min")["version"]
        (7, None, 0)
    """
    better = (lambda v: v >= target) if mode == "max" else (lambda v: v <= target)
    return next((r for r in history if r.get("accuracy") is not None and better(r["accuracy"])), None)


def run_summary(
    history: Sequence[dict[str, Any]],
    sim: Any,
    *,
    algorithm: str,
    num_clients: int,
    monitor: str | None,
    mode: str,
    target: float,
    stop_reason: str,
    wall_seconds: float,
) -> dict[str, Any]:
    """The summary of a run: accuracy (the monitored metric), time to target, counters, and the scheduler's own.

    Args:
        history: The evaluation rows.
        sim: The :class:`~lit_asyncfl.core.simulator.Simulator` at the end of the run.
        algorithm: The algorithm's name.
        num_clients: Number of clients.
        monitor: Name of the monitored metric (``None``: none).
        mode: ``"max"`` or ``"min"``: which values of the monitored metric are better.
        target: Target of the monitored metric.
        stop_reason: Why the run ended.
        wall_seconds: Wall-clock seconds spent in the run (across resumes).
    """
    stats = sim.server.stats
    accs = [r["accuracy"] for r in history if r.get("accuracy") is not None]
    reached = first_reaching(history, target, mode)
    return {
        "algorithm": algorithm,
        "num_clients": num_clients,
        "monitor": monitor,
        **({} if history else {"evaluated": False}),  # no validation_step or no validation data
        "final_accuracy": accs[-1] if accs else None,
        "best_accuracy": (max(accs) if mode == "max" else min(accs)) if accs else None,
        "target_accuracy": target,
        "time_to_target": None if reached is None else float(reached["virtual_time"]),
        "versions_to_target": None if reached is None else reached["version"],
        "versions": sim.server.version,
        "virtual_time": sim.now,
        "updates_received": stats.received,
        "updates_aggregated": stats.aggregated,
        "updates_discarded": stats.discarded,
        "updates_rejected": stats.rejected,
        "reject_reasons": dict(stats.reasons),
        "updates_dropped": sum(sim.dropped.values()),
        "drop_reasons": dict(sim.dropped),
        "mean_online_fraction": sim.availability.online_fraction(sim.now),
        "mean_staleness": stats.staleness_mean,
        "max_staleness": stats.staleness_max,
        "bytes_up": stats.bytes_up,
        "bytes_down": stats.bytes_down,
        "events": sim.events_processed,
        "stop_reason": stop_reason,
        "wall_seconds": round(wall_seconds, 2),
        **callback_metrics(sim),
        **sim.scheduler.summary(),
        **({"executor": dict(sim.executor.stats)} if getattr(sim.executor, "stats", None) else {}),
    }


def callback_metrics(sim: Any) -> dict[str, Any]:
    """What the server and client callbacks add to evaluation rows and the summary (their ``metrics`` hooks)."""
    client = {k: v for cb in sim.client_callbacks for k, v in cb.metrics().items()}
    return {**sim.server.callback_metrics(), **client}


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
        if 0 < abs(value) < 1e-3:  # e.g. a privacy delta of 1e-5, which 4 decimals would show as 0.0000
            return f"{value:.3g}"
        return f"{value:.4f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items()) or "-"
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """A two-column text table of a run summary (a run that evaluated nothing says so where a value is missing).

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
    unevaluated = set(EVALUATED_KEYS) if summary.get("evaluated") is False else set()
    lines += [
        f" {key.ljust(width)}    {'not evaluated' if key in unevaluated and value is None else _fmt(value)}"
        for key, value in summary.items()
    ]
    lines.append(rule)
    return "\n".join(lines)


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend, imported on first use (plots are optional)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> None:
    """Lay out, write (110 dpi) and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def _target_and_range(ax: Any, target: float | None, values: list[float]) -> None:
    """A metric's axis: the dashed ``target`` line when there is one, the range [0, 1] when every value is in it."""
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    if all(0 <= v <= 1 for v in values):
        ax.set_ylim(0, 1)


def plot_history(
    history: Sequence[dict[str, Any]],
    path: str | Path,
    title: str,
    target: float | None = None,
    metric: str = "accuracy",
) -> None:
    """Save the monitored metric (``accuracy`` in the rows, labelled ``metric``) and the loss against virtual time."""
    plt = _pyplot()
    rows = [r for r in history if r.get("accuracy") is not None]
    times = [r["virtual_time"] for r in rows]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
    ax_acc.plot(times, [r["accuracy"] for r in rows], marker=".", label="global model")
    _target_and_range(ax_acc, target, [r["accuracy"] for r in rows])
    ax_acc.set_xlabel("virtual time (s)")
    ax_acc.set_ylabel(metric)
    ax_acc.grid(alpha=0.3)
    ax_acc.legend(loc="lower right")
    ax_loss.plot(times, [r["loss"] for r in rows], marker=".", color="tab:red")
    ax_loss.set_xlabel("virtual time (s)")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(alpha=0.3)
    fig.suptitle(title)
    _save(fig, path)


def plot_availability(availability: Any, end: float, path: str | Path, title: str, points: int = 500) -> None:
    """Save the number of devices online against virtual time over ``[0, end]`` (sampled at ``points`` times)."""
    plt = _pyplot()
    times = np.linspace(0.0, max(end, 1e-9), points)
    counts = availability.online_counts(times)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.step(times, counts, where="post", color="tab:green")
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("devices online")
    ax.set_ylim(0, availability.num_clients * 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(f"{title}: {availability!r}"[:110], fontsize=9)
    _save(fig, path)


def write_partition_csv(counts: np.ndarray, path: str | Path, slowness: np.ndarray | None = None) -> None:
    """Save the partition: one row per client with its sample count, device slowness and samples per class.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "partition.csv"
        >>> write_partition_csv(np.array([[2, 0], [1, 3]]), p, slowness=np.array([0.5, 1.5]))
        >>> p.read_text().splitlines()
        ['client,num_samples,seconds_per_sample,class_0,class_1', '0,2,0.5,2,0', '1,4,1.5,1,3']
    """
    classes = counts.shape[1] if counts.shape[1] > 1 else 0
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["client", "num_samples", *(["seconds_per_sample"] if slowness is not None else []),
             *(f"class_{k}" for k in range(classes))]
        )  # fmt: skip
        for client, row in enumerate(counts):
            speed = [f"{float(slowness[client]):.6g}"] if slowness is not None else []
            writer.writerow([client, int(row.sum()), *speed, *(int(v) for v in row[:classes])])


def plot_partition(counts: np.ndarray, path: str | Path, title: str, max_clients: int = 100) -> None:
    """Save a heat map of samples per client and class (a bar chart of sizes when there is one "class"), for the
    first ``max_clients`` clients; readable with many classes, and one artist however many clients."""
    plt = _pyplot()
    shown = counts[:max_clients]
    fig, ax = plt.subplots(figsize=(10, 3.5))
    if shown.shape[1] > 1:
        image = ax.imshow(shown.T, aspect="auto", cmap="viridis", interpolation="nearest", origin="lower")
        fig.colorbar(image, ax=ax, label="samples")
        ax.set_ylabel("class")
    else:
        ax.bar(np.arange(len(shown)), shown[:, 0], width=0.9, linewidth=0)
        ax.set_ylabel("samples")
        ax.grid(axis="y", alpha=0.3)
    ax.set_xlabel("client" + (f" (first {max_clients} of {len(counts)})" if len(counts) > max_clients else ""))
    ax.set_title(title)
    _save(fig, path)


def mean_std(values: Sequence[float], digits: int = 4) -> str:
    """``mean ± std`` over seeds as the papers' tables print it; ``/`` for no values.

    Example:
        >>> mean_std([0.9, 0.8]), mean_std([1200.0], digits=0), mean_std([])
        ('0.8500 ± 0.0707', '1,200', '/')
    """
    if not values:
        return "/"
    if len(values) == 1:
        return f"{values[0]:,.{digits}f}"
    return f"{statistics.mean(values):,.{digits}f} ± {statistics.stdev(values):,.{digits}f}"


def plot_clients(
    history: Sequence[dict[str, Any]],
    path: str | Path,
    title: str,
    target: float | None = None,
    metric: str = "accuracy",
) -> None:
    """Save the distribution over clients of the monitored metric against virtual time: the 10-90% and 25-75%
    percentile bands, the median, the mean and the worst 10% of the per-client evaluations, with the global
    evaluation's value (a panel each for the personal models' and the personalized values when there are any)."""
    plt = _pyplot()
    prefixes = [p for p in ("client", "personal", "personalized") if any(f"{p}_acc_p50" in r for r in history)]
    if not prefixes:
        return
    fig, axes = plt.subplots(1, len(prefixes), figsize=(6.5 * len(prefixes), 4), squeeze=False)
    for ax, prefix in zip(axes[0], prefixes):
        rows = [r for r in history if f"{prefix}_acc_p50" in r]
        times = [r["virtual_time"] for r in rows]
        stats = ("p10", "p25", "p50", "p75", "p90", "mean", "worst10")
        col = {q: [r[f"{prefix}_acc_{q}"] for r in rows] for q in stats}
        for low, high, alpha in (("p10", "p90", 0.2), ("p25", "p75", 0.35)):
            label = f"clients {low[1:]}-{high[1:]}%"
            ax.fill_between(times, col[low], col[high], alpha=alpha, color="tab:blue", linewidth=0, label=label)
        ax.plot(times, col["p50"], color="tab:blue", label="median client")
        ax.plot(times, col["mean"], color="tab:orange", linestyle="--", label="mean over clients")
        ax.plot(times, col["worst10"], color="tab:red", linestyle=":", label="worst 10% of clients")
        glob = [(r["virtual_time"], r["accuracy"]) for r in history if r.get("accuracy") is not None]
        if glob:
            ax.plot(*zip(*glob), color="black", linewidth=1, label="global model (validation set)")
        _target_and_range(ax, target, [v for q in col.values() for v in q])
        ax.set_xlabel("virtual time (s)")
        suffix = {"personal": " (personal models)", "personalized": " (personalized)"}.get(prefix, "")
        ax.set_ylabel(f"{metric} per client{suffix}")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=7)
    fig.suptitle(f"{title}: {rows[-1]['clients_evaluated']} clients, held-out samples")
    _save(fig, path)


def write_clients_csv(
    clients: np.ndarray, num_samples: np.ndarray, values: dict[str, np.ndarray], path: str | Path
) -> None:
    """Save one row per evaluated client: its held-out sample count and each metric's last value.

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "clients.csv"
        >>> write_clients_csv(np.array([0, 2]), np.array([3, 1]), {"client_val_acc": np.array([1.0, 0.5])}, p)
        >>> p.read_text().splitlines()
        ['client,num_held_out,client_val_acc', '0,3,1.0', '2,1,0.5']
    """
    names = sorted(values)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["client", "num_held_out", *names])
        for position, client in enumerate(clients):
            writer.writerow([int(client), int(num_samples[position]), *(float(values[n][position]) for n in names)])
