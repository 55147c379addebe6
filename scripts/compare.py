"""Compare methods the way the papers do: configs (or presets on one base config) x seeds on one setting.

Writes into ``--out``: ``comparison.md`` and ``comparison.csv`` (final and best accuracy mean ± std over seeds,
virtual time and versions to the target accuracy — "/" when no seed reached it — how many seeds reached it, and
the speed-up in time to target against a baseline method), ``accuracy.png`` (accuracy against virtual time: the
mean over seeds per method, with a min-max band), and one directory per run under ``runs/<method>/seed_<s>/``
holding the run's outputs and its ``result.json``. Finished runs (those with a ``result.json``) are not run
again, so an interrupted comparison resumes where it stopped, and adding a seed runs only that seed. With
``--docs NAME`` the table also goes to ``docs/benchmarks/NAME.md``, headed by the command, machine and date (the
table the documentation shows).

    # presets on one base config
    python scripts/compare.py --base configs/quickstart.yaml --presets FedAsync FedBuff --seeds 0 1 2 \\
        --baseline FedAsync --set trainer.max_virtual_time=20000 --out compare/quickstart
    # whole configs
    python scripts/compare.py --configs configs/fedavg.yaml configs/fedprox.yaml --seeds 0 1 --out compare/sync
    # a comparison spec (methods with their own arguments, the setting, the offline substitute)
    python scripts/compare.py --spec configs/compare/fedhist_table1.yaml --out compare/fedhist

Fair tuning (``--grid KEY=V1,V2 ...``, as the papers tune): every method gets the same grid of CLI settings, e.g.
``--grid model.init_args.lr=0.02,0.05,0.1 trainer.algorithm.init_args.server_lr=0.5,1``; a
``trainer.algorithm.init_args.*`` key applies only to the methods whose preset takes that argument. Each grid point
runs on ``--tune-seeds`` (default 100: seeds the table does not report; runs under ``runs/<method>/tune/``), and
each method is reported at the point with the highest mean test accuracy over the last quarter of its runs' virtual
time (the mean over the tuning seeds). The grid, the criterion and the chosen points head the table.

A spec is YAML with ``base`` (a config), ``methods`` (name -> list of CLI arguments, e.g.
``["--trainer.algorithm=FedBuff", "--trainer.algorithm.init_args.buffer_size=10"]``, or ``{config: path, args:
[...]}``), and optionally ``seeds``, ``target``, ``baseline``, ``set`` (arguments for every run), ``title`` and
``substitute`` (the offline dataset standing in for the paper's).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lit_asyncfl.reporting import mean_std

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.print_summary=false", "--trainer.logger=false"]


def load_plan(args: argparse.Namespace) -> dict[str, Any]:
    """The comparison plan: ``methods`` (name -> (config, arguments)), seeds, target, baseline, title."""
    spec: dict[str, Any] = {}
    if args.spec:
        spec = yaml.safe_load(Path(args.spec).read_text()) or {}
    base = args.base or spec.get("base")
    methods: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, config: str | None, arguments: list[str]) -> None:
        if name in methods:
            raise SystemExit(f"two methods are named {name!r}: give them distinct names (e.g. in a --spec)")
        if any(c in name for c in "/|\n"):
            raise SystemExit(f"method name {name!r} must not contain '/', '|' or a line break")
        methods[name] = (config, arguments)

    for name, entry in (spec.get("methods") or {}).items():
        if isinstance(entry, dict):
            add(str(name), entry.get("config", base), [str(a) for a in entry.get("args", [])])
        else:
            add(str(name), base, [str(a) for a in (entry or [])])
    for preset in args.presets or []:
        add(preset, base, [f"--trainer.algorithm={preset}"])
    for config in args.configs or []:
        add(Path(config).stem, config, [])
    if not methods:
        raise SystemExit("nothing to compare: give --presets (with --base), --configs or a --spec with methods")
    missing = sorted({c for c, _ in methods.values() if not c or not Path(c).exists()}, key=str)
    if missing:
        raise SystemExit(f"config file(s) not found: {missing} (presets need --base or a spec's base)")
    seeds = args.seeds if args.seeds is not None else spec.get("seeds", [0, 1, 2])
    baseline = args.baseline or spec.get("baseline")
    if baseline is not None and baseline not in methods:
        raise SystemExit(f"baseline {baseline!r} is not one of the methods {list(methods)}")
    settings = [str(a) for a in spec.get("set", [])] + [f"--{kv}" if not kv.startswith("--") else kv for kv in args.set]
    return {
        "methods": methods,
        "seeds": [int(s) for s in seeds],
        "target": args.target if args.target is not None else spec.get("target"),
        "baseline": baseline,
        "settings": settings,
        "title": spec.get("title", ""),
        "substitute": spec.get("substitute", ""),
    }


def algorithm_of(config: str, arguments: list[str]) -> str | None:
    """The preset a method runs: the last ``--trainer.algorithm=`` argument, else its config's (``None``: not
    found)."""
    for arg in reversed(arguments):
        for key in ("--trainer.algorithm=", "--trainer.algorithm.class_path="):
            if arg.startswith(key):
                return arg[len(key) :].rsplit(".", 1)[-1]
    algorithm = ((yaml.safe_load(Path(config).read_text()) or {}).get("trainer") or {}).get("algorithm")
    if isinstance(algorithm, dict):
        algorithm = algorithm.get("class_path")
    return algorithm.rsplit(".", 1)[-1] if isinstance(algorithm, str) else None


def preset_accepts(preset: str, key: str) -> bool:
    """Whether ``preset`` takes the argument ``key`` (its own ``__init__`` or a parent's, for the ablation presets
    that forward ``**kwargs``).

    Example:
        >>> preset_accepts("FedBuff", "server_lr"), preset_accepts("FedAsync", "server_lr")
        (True, False)
        >>> preset_accepts("FedASMU_DA", "tau_max")
        True
    """
    import inspect

    from lit_asyncfl.algorithms import PRESETS

    cls = PRESETS.get(preset.lower().replace("_", "-")) or PRESETS.get(preset.lower())
    if cls is None:
        raise SystemExit(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    for klass in cls.__mro__:
        params = inspect.signature(klass.__init__).parameters if "__init__" in vars(klass) else {}
        if key in params:
            return True
        if params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return False
    return False


def parse_grid(items: list[str]) -> dict[str, list[str]]:
    """``["model.init_args.lr=0.02,0.05"]`` -> ``{"model.init_args.lr": ["0.02", "0.05"]}``."""
    grid = {}
    for item in items:
        key, _, values = item.removeprefix("--").partition("=")
        if not values:
            raise SystemExit(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. model.init_args.lr=0.02,0.05,0.1)")
        grid[key] = values.split(",")
    return grid


def grid_points(config: str, arguments: list[str], grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """The grid points a method takes: algorithm arguments only where its preset has them."""
    prefix = "trainer.algorithm.init_args."
    preset = algorithm_of(config, arguments) if any(k.startswith(prefix) for k in grid) else None
    keys = [k for k in grid if not k.startswith(prefix) or (preset and preset_accepts(preset, k[len(prefix) :]))]
    import itertools

    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_label(point: dict[str, str]) -> str:
    """A grid point as a short name: ``lr=0.05,server_lr=1`` (the last part of each key)."""
    return ",".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()) or "default"


def late_accuracy(history: list[dict[str, Any]]) -> float | None:
    """Mean accuracy over the last quarter of a run's virtual time (the tuning criterion).

    Example:
        >>> late_accuracy([{"virtual_time": t, "accuracy": a} for t, a in [(0, 0.1), (50, 0.5), (80, 0.7), (100, 0.9)]])
        0.8
    """
    rows = [r for r in history if r.get("accuracy") is not None]
    if not rows:
        return None
    end = rows[-1]["virtual_time"]
    return statistics.mean(r["accuracy"] for r in rows if r["virtual_time"] >= 0.75 * end)


def run_arguments(config: str, arguments: list[str], seed: int, target: float | None) -> list[str]:
    """The CLI arguments of one run (stored with its result, so a resumed comparison can check its settings)."""
    argv = ["--config", str(config), *arguments, f"--trainer.seed={seed}", *QUIET]
    if target is not None:
        argv.append(f"--trainer.target_accuracy={target}")
    return argv


def run_one(method: str, config: str, arguments: list[str], seed: int, target: float | None, out: Path) -> dict:
    """Run one method and seed in this process (through the CLI parser) and save its ``result.json``."""
    import torch

    torch.set_num_threads(1)
    from lit_asyncfl.cli import FederatedCLI

    run_dir = out / "runs" / method / f"seed_{seed}"
    argv = run_arguments(config, arguments, seed, target)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # argv is the script's own
        cli = FederatedCLI(args=[*argv, f"--trainer.default_root_dir={run_dir}"], run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    result = {
        "method": method,
        "seed": seed,
        "arguments": argv,
        "summary": cli.trainer.summary,
        "history": [{k: r[k] for k in ("version", "virtual_time", "accuracy", "loss")} for r in cli.trainer.history],
    }
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, run_dir / "result.json")  # appears only once complete: an interrupted run is redone
    return result


def aggregate(results: dict[str, list[dict]], baseline: str | None) -> list[dict[str, Any]]:
    """One row per method: accuracy and time-to-target statistics over seeds, speed-up against the baseline."""
    rows = []
    for method, runs in results.items():
        summaries = [r["summary"] for r in runs]
        times = [s["time_to_target"] for s in summaries if s["time_to_target"] is not None]
        versions = [s["versions_to_target"] for s in summaries if s["versions_to_target"] is not None]
        rows.append(
            {
                "method": method,
                "seeds": len(runs),
                "final_by_seed": {r.get("seed", i): r["summary"]["final_accuracy"] for i, r in enumerate(runs)},
                "final_accuracy": [s["final_accuracy"] for s in summaries if s["final_accuracy"] is not None],
                "best_accuracy": [s["best_accuracy"] for s in summaries if s["best_accuracy"] is not None],
                "time_to_target": times,
                "versions_to_target": versions,
                "reached": len(times),
                "target": summaries[0]["target_accuracy"] if summaries else None,
                # ASFL-style runs (SemiAsyncRounds) also report the latency-accuracy objective
                # (only from runs that completed their rounds: a cut-short run's latency would flatter it)
                "objective": [s["objective"] for s in summaries if s.get("objective") is not None],
                "total_latency": [s["total_latency"] for s in summaries if s.get("objective") is not None],
                # devices that come and go (lit_asyncfl.availability): how many were online, how many jobs were lost
                "online": [s.get("mean_online_fraction", 1.0) for s in summaries],
                "dropped": [s.get("updates_dropped", 0) for s in summaries],
                "received": [s.get("updates_received", 0) for s in summaries],
            }
        )
    base = next((r for r in rows if r["method"] == baseline), None)

    def all_reached(row: dict[str, Any]) -> bool:
        return bool(row["seeds"]) and row["reached"] == row["seeds"]

    for row in rows:
        # Only when every seed of both reached the target: a mean over the lucky seeds would flatter a method.
        ok = base is not None and all_reached(base) and all_reached(row)
        row["speedup"] = (
            statistics.mean(base["time_to_target"]) / statistics.mean(row["time_to_target"]) if ok else None
        )
    return rows


def markdown(rows: list[dict[str, Any]], plan: dict[str, Any]) -> str:
    target = rows[0]["target"] if rows else None
    head = [
        f"**{plan['title']}**" if plan["title"] else "",
        f"Offline substitute: {plan['substitute']}" if plan["substitute"] else "",
    ]
    lines = [h for h in head if h]
    if plan.get("grid"):
        chosen = "; ".join(f"{m}: {p}" for m, p in plan["chosen"].items())
        lines.append(
            f"Tuning grid {plan['grid']} (algorithm arguments only for the presets that take them), each point on "
            f"seed(s) {plan['tune_seeds']}, not reported; each method at the point with the highest mean test "
            f"accuracy over the last quarter of its runs' virtual time: {chosen}."
        )
    lines += [
        f"Seeds {plan['seeds']}; mean ± std over seeds; time and versions to {target:g} accuracy over the seeds "
        "that reached it (\"/\": none did); speed-up = baseline's mean time to target / the method's, only when "
        "every seed of both reached the target.",
        "",
        f"| method | final accuracy | best accuracy | time to {target:g} (virtual s) | versions to {target:g} "
        f"| reached | speed-up vs {plan['baseline'] or '-'} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "/"
        lines.append(
            f"| {r['method']} | {mean_std(r['final_accuracy'])} | {mean_std(r['best_accuracy'])} | "
            f"{mean_std(r['time_to_target'], 0)} | {mean_std(r['versions_to_target'], 0)} | "
            f"{r['reached']}/{r['seeds']} | {speedup} |"
        )
    base = next((r for r in rows if r["method"] == plan["baseline"]), None)
    if base is not None and len(rows) > 1:
        lines += [
            "",
            f"Against {plan['baseline']}, paired by seed: final-accuracy wins, the mean difference of final accuracy "
            "± its std over seeds, and the effect size d = mean difference / std of the differences (paired Cohen's "
            "d; with 3 seeds a rough guide).",
            "",
            f"| method | wins vs {plan['baseline']} | Δ final accuracy | d |",
            "| --- | --- | --- | --- |",
        ]
        for r in rows:
            seeds = sorted(s for s in set(r["final_by_seed"]) & set(base["final_by_seed"])
                           if r["final_by_seed"][s] is not None and base["final_by_seed"][s] is not None)  # fmt: skip
            if r is base or not seeds:
                continue
            diffs = [round(r["final_by_seed"][s] - base["final_by_seed"][s], 6) for s in seeds]  # no float-noise spread
            mean = statistics.mean(diffs)
            sd = statistics.stdev(diffs) if len(diffs) > 1 else None
            d = "/" if sd is None else ("inf" if sd == 0 else f"{mean / sd:+.2f}")
            spread = "" if sd is None else f" ± {sd:.3f}"
            lines.append(f"| {r['method']} | {sum(x > 0 for x in diffs)}/{len(seeds)} | {mean:+.3f}{spread} | {d} |")
    if any(r["objective"] for r in rows):
        base = next((r for r in rows if r["method"] == plan["baseline"] and r["objective"]), None)
        lines += [
            "",
            "Latency-accuracy objective acc_K (T_max / total latency)^theta and total latency (ASFL); change = the "
            "method's mean objective against the baseline's.",
            "",
            "| method | objective | total latency (virtual s) | final accuracy | change vs "
            f"{plan['baseline'] or '-'} |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rows:
            change = "/"
            if base is not None and r["objective"]:
                change = f"{statistics.mean(r['objective']) / statistics.mean(base['objective']) - 1:+.1%}"
            finished = "" if len(r["objective"]) == r["seeds"] else f" ({len(r['objective'])}/{r['seeds']} finished)"
            lines.append(
                f"| {r['method']} | {mean_std(r['objective'])}{finished} | {mean_std(r['total_latency'], 0)} | "
                f"{mean_std(r['final_accuracy'])} | {change} |"
            )
    if any((r["dropped"] and max(r["dropped"]) > 0) or (r["online"] and min(r["online"]) < 1) for r in rows):
        lines += [
            "",
            "Devices that come and go: the mean fraction of devices online over the run, the client jobs lost (their "
            "device went offline or crashed, or a round's deadline passed) and the updates that reached the server.",
            "",
            "| method | devices online | jobs dropped | updates received | dropped share |",
            "| --- | --- | --- | --- | --- |",
        ]
        for r in rows:
            total = sum(r["dropped"]) + sum(r["received"])
            share = f"{sum(r['dropped']) / total:.1%}" if total else "/"
            lines.append(
                f"| {r['method']} | {mean_std(r['online'], 2)} | {mean_std(r['dropped'], 0)} | "
                f"{mean_std(r['received'], 0)} | {share} |"
            )
    return "\n".join(lines) + "\n"


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    def stat(values: list[float], fn: Any) -> Any:
        return fn(values) if len(values) >= (2 if fn is statistics.stdev else 1) else ""

    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["method", "seeds", "final_accuracy_mean", "final_accuracy_std", "best_accuracy_mean",
             "best_accuracy_std", "time_to_target_mean", "time_to_target_std", "versions_to_target_mean",
             "reached", "target", "speedup", "objective_mean", "objective_std", "total_latency_mean",
             "total_latency_std"]
        )  # fmt: skip
        for r in rows:
            writer.writerow(
                [r["method"], r["seeds"], stat(r["final_accuracy"], statistics.mean),
                 stat(r["final_accuracy"], statistics.stdev), stat(r["best_accuracy"], statistics.mean),
                 stat(r["best_accuracy"], statistics.stdev), stat(r["time_to_target"], statistics.mean),
                 stat(r["time_to_target"], statistics.stdev), stat(r["versions_to_target"], statistics.mean),
                 r["reached"], r["target"], "" if r["speedup"] is None else r["speedup"],
                 stat(r["objective"], statistics.mean), stat(r["objective"], statistics.stdev),
                 stat(r["total_latency"], statistics.mean), stat(r["total_latency"], statistics.stdev)]
            )  # fmt: skip


def curve_on_grid(history: list[dict[str, Any]], grid: np.ndarray) -> np.ndarray:
    """Accuracy at each grid time: the last evaluation at or before it (NaN before the first one).

    Example:
        >>> curve_on_grid([{"virtual_time": 0.0, "accuracy": 0.1}, {"virtual_time": 10.0, "accuracy": 0.5}],
        ...               np.array([0.0, 5.0, 10.0, 20.0])).tolist()
        [0.1, 0.1, 0.5, 0.5]
    """
    rows = [r for r in history if r.get("accuracy") is not None]
    times = np.array([r["virtual_time"] for r in rows], dtype=float)
    accs = np.array([r["accuracy"] for r in rows], dtype=float)
    idx = np.searchsorted(times, grid, side="right") - 1
    return np.where(idx >= 0, accs[np.clip(idx, 0, None)], np.nan)


def plot(results: dict[str, list[dict]], path: Path, title: str, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ends = [r["history"][-1]["virtual_time"] for runs in results.values() for r in runs if r["history"]]
    if not ends:
        return
    end = max(ends)
    grid = np.linspace(0.0, end, 400)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, runs in results.items():
        runs = [r for r in runs if r["history"]]
        if not runs:
            continue
        # a seed's curve stops where its run stopped; beyond that it is not extended
        curves = np.stack([
            np.where(grid <= r["history"][-1]["virtual_time"], curve_on_grid(r["history"], grid), np.nan) for r in runs
        ])  # fmt: skip
        # mean and band only where every seed has a value: no jump where a seed's run ended early
        (line,) = ax.plot(grid, curves.mean(axis=0), label=f"{method} ({len(runs)} seeds)")
        if len(runs) > 1:
            ax.fill_between(grid, curves.min(axis=0), curves.max(axis=0), color=line.get_color(), alpha=0.15, lw=0)
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("virtual time (s)")
    ax.set_ylabel("accuracy (mean over seeds, band: min-max)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title or "accuracy against virtual time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_all(
    jobs: list[tuple[str, str, list[str], int]], args: argparse.Namespace, target: float | None, what: str
) -> tuple[dict[str, list[dict]], list[str]]:
    """Run (name, config, arguments, seed) jobs, reusing finished ones under ``args.out``; results by name, and
    the failures."""
    results: dict[str, list[dict]] = {name: [] for name, *_ in jobs}
    todo = []
    for job in jobs:
        name, config, arguments, seed = job
        done = args.out / "runs" / name / f"seed_{seed}" / "result.json"
        if not done.exists():
            todo.append(job)
            continue
        previous = json.loads(done.read_text())
        expected = run_arguments(config, arguments, seed, target)
        if previous["arguments"] != expected:
            raise SystemExit(
                f"{done} was run with other settings:\n  then: {previous['arguments']}\n  now:  {expected}\n"
                "use another --out, or delete that run directory to run it again"
            )
        results[name].append(previous)
    total = len(jobs)
    print(f"{total} {what}: {total - len(todo)} already finished in {args.out}, {len(todo)} to run", flush=True)

    from tqdm import tqdm

    bar = tqdm(total=len(todo), desc=what, unit="run", disable=not todo)
    failures: list[str] = []

    def finished(job: tuple, outcome: dict | BaseException) -> None:
        if isinstance(outcome, BaseException):
            failures.append(f"{job[0]} seed {job[3]}: {type(outcome).__name__}: {outcome}")
            tqdm.write(f"FAILED {failures[-1]}")
        else:
            results[outcome["method"]].append(outcome)
        bar.update()
        bar.set_postfix_str(f"{job[0]} seed {job[3]}")

    if args.workers > 1 and len(todo) > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            futures = {pool.submit(run_one, *job, target, args.out): job for job in todo}
            for future in as_completed(futures):
                error = future.exception()
                finished(futures[future], error if error is not None else future.result())
    else:
        for job in todo:
            try:
                outcome: dict | BaseException = run_one(*job, target, args.out)
            except Exception as error:  # one failed run must not lose the others' table
                outcome = error
            finished(job, outcome)
    bar.close()
    return results, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, help="a comparison spec (YAML)")
    parser.add_argument("--base", help="base config for --presets")
    parser.add_argument("--presets", nargs="*", help="preset names run on the base config (e.g. FedAsync FedBuff)")
    parser.add_argument("--configs", nargs="*", help="whole configs, one method each (named by file stem)")
    parser.add_argument("--seeds", type=int, nargs="+", help="run seeds (default: the spec's, else 0 1 2)")
    parser.add_argument("--target", type=float, help="target accuracy (default: the configs')")
    parser.add_argument("--baseline", help="method the speed-up is measured against")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="CLI settings for every run")
    parser.add_argument("--grid", nargs="*", default=[], metavar="KEY=V1,V2", help="tuning grid (see above)")
    parser.add_argument("--tune-seeds", type=int, nargs="+", default=[100], help="seeds of the tuning runs")
    parser.add_argument("--workers", type=int, default=1, help="runs in parallel (one process and thread each)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--docs", metavar="NAME", help="also write docs/benchmarks/NAME.md (machine, date)")
    args = parser.parse_args(argv)
    plan = load_plan(args)
    commit = None
    if args.docs:
        from docs_tables import clean_commit

        commit = clean_commit()  # before the runs: refuses uncommitted code
    args.out.mkdir(parents=True, exist_ok=True)
    grid = parse_grid(args.grid)
    plan["grid"], plan["chosen"], plan["tune_seeds"] = grid, {}, args.tune_seeds
    if grid:
        if set(args.tune_seeds) & set(plan["seeds"]):
            raise SystemExit(f"--tune-seeds {args.tune_seeds} overlap the reported seeds {plan['seeds']}")
        tuning = {}
        for method, (config, arguments) in plan["methods"].items():
            for point in grid_points(config, [*arguments, *plan["settings"]], grid):
                extra = [f"--{k}={v}" for k, v in point.items()]
                tuning[f"{method}/tune/{point_label(point)}"] = (method, point, config, [*arguments, *extra])
        jobs = [(name, c, [*a, *plan["settings"]], s) for name, (_, _, c, a) in tuning.items() for s in args.tune_seeds]
        tuned, failures = run_all(jobs, args, plan["target"], "tuning runs")
        for method in plan["methods"]:
            scores = {}
            for name, (m, _point, _, _) in tuning.items():
                late = [late_accuracy(r["history"]) for r in tuned.get(name, [])]
                if m == method and late and None not in late and len(late) == len(args.tune_seeds):
                    scores[name] = statistics.mean(late)
            if not scores:
                raise SystemExit(
                    f"no grid point of {method} finished on every tuning seed:\n  " + "\n  ".join(failures)
                )
            best = max(scores, key=scores.get)
            _, point, config, arguments = tuning[best]
            plan["methods"][method] = (config, arguments)
            plan["chosen"][method] = point_label(point)
            print(f"{method}: best grid point {point_label(point)} (late accuracy {scores[best]:.4f})", flush=True)
    jobs = [(m, c, [*a, *plan["settings"]], s) for m, (c, a) in plan["methods"].items() for s in plan["seeds"]]
    results, failures = run_all(jobs, args, plan["target"], "runs")
    results = {m: runs for m, runs in results.items() if runs}
    if not results:
        print("no run finished:\n  " + "\n  ".join(failures))
        return 1
    for runs in results.values():
        runs.sort(key=lambda r: r["seed"])

    rows = aggregate(results, plan["baseline"])
    table = markdown(rows, plan)
    (args.out / "comparison.md").write_text(table)
    if args.docs:
        from docs_tables import write_docs_table

        print(f"wrote {write_docs_table(args.docs, table, commit=commit)}")
    write_csv(rows, args.out / "comparison.csv")
    plot(results, args.out / "accuracy.png", plan["title"], rows[0]["target"] if rows else None)
    print(table)
    print(f"wrote {args.out}/comparison.md, comparison.csv, accuracy.png")
    if failures:
        print(
            f"{len(failures)} run(s) failed (left out of the table; rerun to retry them):\n  " + "\n  ".join(failures)
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
