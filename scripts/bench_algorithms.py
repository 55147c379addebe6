"""Compare algorithm presets on the offline digits data: the benchmark tables of FedASMU, FedADT and FedHist.

Every method of a suite runs with the same devices, data split and virtual-time budget, for several seeds and
Dirichlet concentrations; the table reports final and best accuracy (mean +- std over seeds) and the virtual
time to the target accuracy (mean over the seeds that reached it, "/" when none did).

    python scripts/bench_algorithms.py --suite fedasmu          # FedASMU, -DA, -FA, -0, FedAsync, FedBuff, PORT
    python scripts/bench_algorithms.py --suite fedadt           # FedADT, FedFa, CA2FL, FADAS, FedCompass, ...
    python scripts/bench_algorithms.py --suite fedhist          # FedHist, its ablations, FedAsync, FedBuff, ...
    python scripts/bench_algorithms.py --suite pathological     # 200 clients, 1-2 classes each, E=5, stragglers
    python scripts/bench_algorithms.py --suite pathological --grid lr=0.02,0.05,0.1 server_lr=0.5,1 \\
        --tune-seeds 1                                           # each method at its best grid point (see below)
    python scripts/bench_algorithms.py --suite fedasmu --seeds 1 --seed-offset 100 --local-epochs 5 \\
        --kwargs FedASMU='{"lambda0": 10.0}'                     # a variant, on a seed the tables do not use

Fair tuning (``--grid``): every method gets the same grid — ``lr`` is the clients' learning rate, any other key a
preset argument, applied to the methods whose preset takes it (e.g. ``server_lr``) — each grid point runs on
``--tune-seeds`` seeds from ``--tune-offset`` (100: seeds the table does not report), and each method is reported
at its best point: the highest mean test accuracy over the last quarter of the virtual-time budget (the mean over
the tuning seeds; later evaluations count, not one lucky peak). The grid, the criterion and each method's chosen
point are in the table.

Besides the table, the suite's seed methods (``focus``) get a win table against every other method: over the
seeds (paired: the same seed is the same data split and devices), how often the seed method ends with the higher
final accuracy and reaches the target sooner (a run that never reaches it counts as infinitely late), the mean
difference of final accuracy ± its std over seeds, and the effect size d = mean difference / std of the
differences (paired Cohen's d; "inf" when every seed differs by the same amount). A plot per setting shows the
accuracy against virtual time, the mean over seeds with a min-max band.

Writes ``<suite>.csv``, ``<suite>.md`` and ``<suite>[_<setting>].png`` into ``--out`` (with ``--docs`` also
``docs/benchmarks/<suite>.md`` and its plots, headed by the command, machine, date and commit: the table the
documentation shows; ``--docs`` refuses to start from a working tree with uncommitted changes, so that the commit
named is the code measured). Runs go to a process pool (one torch thread each).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from lit_asyncfl.reporting import mean_std

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import plot, preset_accepts  # (the scripts folder is not a package)

SUITES: dict[str, dict[str, Any]] = {
    "fedasmu": {
        "methods": [
            "FedASMU",
            "FedASMU-DA",
            "FedASMU-FA",
            "FedASMU-0",
            "FedAsync",
            "FedBuff",
            "PORT",
            "ASOFed",
            "FedSA",
            "MOON",
            "FedDyn",
        ],
        "devices": ["UniformRatio", {"ratio": 5.0}],
        "alphas": [0.1],
        "max_virtual_time": 20_000.0,
        # the same 10% parallelism as FedASMU's trigger and FedAsync (PORT: M = half the selected, as its authors;
        # FedSA: M = 30% of the selected, as its Flower re-implementation's 3 of 10)
        "focus": ["FedASMU"],
        "kwargs": {
            "FedBuff": {"concurrency": 0.1},
            "PORT": {"concurrency": 0.1, "buffer_size": 5},
            "ASOFed": {"concurrency": 0.1},
            "FedSA": {"concurrency": 0.1, "buffer_size": 3},
        },
    },
    "fedadt": {
        "methods": ["FedADT", "FedFa", "CA2FL", "FADAS", "FedCompass", "FedAsync", "FedBuff", "FedAvgM"],
        "devices": ["UniformResponse", {"low": 0.0, "high": 5000.0}],
        "alphas": [0.1, 0.5],
        "max_virtual_time": 600_000.0,
        "focus": ["FedADT"],
        # the same 20% concurrency as FedADT, FedFa, CA2FL and FedBuff (FADAS, a newer standard, too)
        "kwargs": {
            # the paper distils on 0.5% of its training data (300 MNIST images); 0.5% of digits is 7 images, under
            # one per class: 5% (72 images) keeps the set's size per class closer to the paper's
            "FedADT": {"data_fraction": 0.05},
            "FedAsync": {"concurrency": 0.2},
            "FADAS": {"concurrency": 0.2},
            "FedAvgM": {"clients_per_round": 0.2},  # synchronous rounds of the same 20%
            # every client trains (cross-silo); the authors' Q_min:Q_max = 1:5 in steps of the ~2-step digits epoch.
            # These devices are outside FedCompass's design: a job's time is drawn afresh whatever the client and its
            # steps, so its per-client speed estimate predicts nothing (measured on its page: clients idle 57% of
            # the run waiting for their groups, 0.25); no argument fixes that
            "FedCompass": {"q_min": 1, "q_max": 5},
        },
    },
    "fedhist": {
        "methods": [
            "FedHist",
            "FedHist-noEGS",
            "FedHist-noHAA",
            "FedHist-noINA",
            "FedAsync",
            "FedBuff",
            "DynSGD",
            "TWAFL",
            "MOON",
            "WKAFL",
            "REFL",
        ],
        "devices": ["UniformRatio", {"ratio": 5.0}],
        "alphas": [0.3],
        "max_virtual_time": 3_000.0,
        "focus": ["FedHist"],
        # N/K = 10: K = 10 of 100 clients per aggregation; the asynchronous baselines keep all 100 training too
        "kwargs": {
            "FedAsync": {"concurrency": 1.0},
            "FedBuff": {"buffer_size": 10, "concurrency": 1.0},
            # DynSGD in FedHist's K-async form (its Eq. 4, weights summing to 1): unnormalised, 1/tau with tau ~ N/K
            # = 10 leaves one averaged update per generation of jobs, too few for this budget (0.20 on seed 0)
            "DynSGD": {"normalize": True},
            # MOON as FedHist's authors ran it: asynchronous (FedAsync-style), every client training
            "MOON": {"asynchronous": True, "concurrency": 1.0},
            # REFL's rounds: K = 10 devices, a deadline near the median job (16-80 s here) so that stragglers exist
            "REFL": {"clients_per_round": 10, "deadline": 40.0},
        },
    },
    "pathological": {
        # closer to the papers' cross-device experiments: 200 clients holding 1-2 classes each (2 label-sorted
        # shards), five local epochs, heavy-tailed device speeds (log-normal, sigma 0.5) with 10% stragglers 10x
        # slower; every method that chooses its concurrency keeps 10% (20 clients) in flight, as FedASMU's
        # trigger does; the K-async methods (FedHist, WKAFL) keep every client training by design (their
        # papers' regime, K = 20 = N/10), so the table gives each method's client work (updates per 1,000 s)
        "methods": ["FedASMU", "FedADT", "FedHist", "FedAsync", "FedBuff", "CA2FL", "FADAS", "WKAFL"],
        "num_clients": 200,
        "partition": ["Shards", {"shards_per_client": 2}],
        "local_epochs": 5,
        "devices": ["Stragglers", {"fraction": 0.1, "factor": 10.0, "sigma": 0.5}],
        "alphas": [None],
        # long enough for the strongest to level off: on seed 100 FedHist reached 0.95 by 3,700 virtual s and
        # stayed there, FADAS 0.8 by 3,100; a K-async run (32,000 updates) costs ~200 s, the others ~15 s
        "max_virtual_time": 6_000.0,
        "eval_every": 10,  # versions: buffered methods make ~200 in the budget
        "kwargs": {
            "FedADT": {"concurrency": 0.1, "data_fraction": 0.05},  # as in the fedadt suite
            "FedAsync": {"concurrency": 0.1},
            "FedBuff": {"concurrency": 0.1},
            "CA2FL": {"concurrency": 0.1},
            "FADAS": {"concurrency": 0.1},
            "FedHist": {"k": 20},
            "WKAFL": {"k": 20},
        },
        "focus": ["FedASMU", "FedADT", "FedHist"],
    },
}


def run_one(method: str, seed: int, alpha: float | None, cfg: dict, point: dict | None = None) -> dict:
    """One run of ``method``; ``point`` is a grid point (``lr``: the clients' learning rate, others preset
    arguments) on top of the suite's arguments."""
    import torch

    torch.set_num_threads(1)
    import lit_asyncfl.devices as devices
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import PRESETS
    from lit_asyncfl.data import DigitsDataModule, partition
    from lit_asyncfl.models import LeNet5

    point = dict(point or {})
    lr = point.pop("lr", cfg["lr"])
    device_cls, device_kwargs = cfg["devices"]
    if cfg["partition"] is None:
        datamodule = DigitsDataModule(partition="dirichlet", alpha=alpha)
    else:
        part_cls, part_kwargs = cfg["partition"]
        datamodule = DigitsDataModule(partition=getattr(partition, part_cls)(**part_kwargs))
    trainer = FederatedTrainer(
        PRESETS[method.lower()](**{**cfg["kwargs"].get(method, {}), **point}),
        num_clients=cfg["num_clients"],
        local_epochs=cfg["local_epochs"],
        max_virtual_time=cfg["max_virtual_time"],
        device_model=getattr(devices, device_cls)(**device_kwargs),
        eval_every=cfg["eval_every"],
        target_accuracy=cfg["target"],
        seed=seed,
        logger=False,
        default_root_dir=tempfile.mkdtemp(),
        enable_progress_bar=False,
        print_summary=False,
    )
    trainer.fit(LeNet5(lr=lr), datamodule=datamodule)
    s = trainer.summary
    keys = (
        "final_accuracy",
        "best_accuracy",
        "time_to_target",
        "versions_to_target",
        "versions",
        "updates_received",
        "updates_discarded",
        "mean_staleness",
    )
    history = [{"virtual_time": r["virtual_time"], "accuracy": r["accuracy"]} for r in trainer.history]
    late = [r["accuracy"] for r in history if r["virtual_time"] >= 0.75 * cfg["max_virtual_time"]]
    return {
        "method": method,
        "alpha": alpha,
        "seed": seed,
        **{k: s[k] for k in keys},
        "late_accuracy": statistics.mean(late) if late else s["final_accuracy"],
        "wall_seconds": s["wall_seconds"],
        "history": history,
    }


def grid_points(method: str, grid: dict[str, list[float]]) -> list[dict[str, float]]:
    """The grid points ``method`` takes: ``lr`` always, other keys where its preset takes them."""
    keys = [k for k in grid if k == "lr" or preset_accepts(method, k)]
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def setting_name(alpha: float | None, cfg: dict) -> str:
    if alpha is not None:
        return f"Dirichlet {alpha:g}"
    part_cls, part_kwargs = cfg["partition"]
    return f"{part_cls}({', '.join(f'{k}={v}' for k, v in part_kwargs.items())})"


def win_rows(rows: list[dict], focus: str, other: str, alpha: float | None, target: float) -> str | None:
    """One line of the win table: ``focus`` against ``other`` over the seeds both ran (paired by seed)."""
    mine = {r["seed"]: r for r in rows if r["method"] == focus and r["alpha"] == alpha}
    theirs = {r["seed"]: r for r in rows if r["method"] == other and r["alpha"] == alpha}
    seeds = sorted(set(mine) & set(theirs))
    if not seeds:
        return None
    # rounded: accuracies are multiples of 1/test-set size (float32 values), and their noise is no spread
    diffs = [round(mine[s]["final_accuracy"] - theirs[s]["final_accuracy"], 6) for s in seeds]

    def when(r: dict) -> float:
        return math.inf if r["time_to_target"] is None else r["time_to_target"]

    acc_wins = sum(d > 0 for d in diffs)
    time_wins = sum(when(mine[s]) < when(theirs[s]) for s in seeds)
    sd = statistics.stdev(diffs) if len(diffs) > 1 else math.nan
    mean = statistics.mean(diffs)
    d = "/" if math.isnan(sd) else ("inf" if sd == 0 else f"{mean / sd:+.2f}")
    return (
        f"| {focus} | {other} | {acc_wins}/{len(seeds)} | {time_wins}/{len(seeds)} | {mean:+.3f}"
        + ("" if math.isnan(sd) else f" ± {sd:.3f}")
        + f" | {d} |"
    )


def report(rows: list[dict], methods: list[str], alphas: list, cfg: dict, header: str, focus: list[str]) -> str:
    """The suite's Markdown: the table, then the seed methods' win tables."""
    target = cfg["target"]
    lines = [
        header,
        "",
        f"| setting | method | final accuracy | best accuracy | time to {target:g} (virtual s) "
        "| versions to target | reached | updates | updates per 1,000 s | discarded |"
        + (" chosen grid point |" if cfg.get("grid") else ""),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if cfg.get("grid") else ""),
    ]
    for a in alphas:
        for m in methods:
            rs = [r for r in rows if r["method"] == m and r["alpha"] == a]
            if not rs:
                continue
            times = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
            rounds = [r["versions_to_target"] for r in rs if r["versions_to_target"] is not None]
            updates = statistics.mean(r["updates_received"] for r in rs)
            discarded = sum(r["updates_discarded"] for r in rs) / max(sum(r["updates_received"] for r in rs), 1)
            ends = statistics.mean(r["history"][-1]["virtual_time"] for r in rs if r["history"]) or 1.0
            chosen = ""
            if cfg.get("grid"):
                point = cfg["chosen"].get(f"{m}|{a}", {})
                chosen = f" {', '.join(f'{k}={v:g}' for k, v in point.items()) or 'suite default'} |"
            lines.append(
                f"| {setting_name(a, cfg)} | {m} | {mean_std([r['final_accuracy'] for r in rs])} | "
                f"{mean_std([r['best_accuracy'] for r in rs])} | {mean_std(times, 0)} | {mean_std(rounds, 0)} | "
                f"{len(times)}/{len(rs)} | {updates:,.0f} | {1000 * updates / ends:,.1f} | {discarded:.1%} |{chosen}"
            )
    focus = [f for f in focus if f in methods]
    if focus:
        lines += [
            "",
            f"Win table (paired by seed): final-accuracy wins, wins in time to {target:g} (never reaching it counts "
            "as infinitely late), mean difference of final accuracy ± std over seeds, and the effect size d = mean "
            "difference / std of the differences (paired Cohen's d; with 3 seeds a rough guide, |d| > 1 a "
            "consistent difference).",
            "",
        ]
        for a in alphas:
            lines += [
                f"| {setting_name(a, cfg)}: method | against | accuracy wins | time wins | Δ final accuracy | d |",
                "| --- | --- | --- | --- | --- | --- |",
            ]
            for f in focus:
                for other in methods:
                    if other != f and other not in focus:
                        line = win_rows(rows, f, other, a, target)
                        if line:
                            lines.append(line)
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def tune(pool: ProcessPoolExecutor, methods: list[str], alphas: list, cfg: dict, args: argparse.Namespace) -> dict:
    """Each method's best grid point per setting on the tuning seeds (see the module's docstring)."""
    grid = cfg["grid"]
    tune_seeds = range(args.tune_offset, args.tune_offset + args.tune_seeds)
    jobs = [(m, s, a, p) for a in alphas for m in methods for p in grid_points(m, grid) for s in tune_seeds]
    futures = [pool.submit(run_one, m, s, a, cfg, p) for m, s, a, p in jobs]
    scores: dict[tuple, list[float]] = {}
    for i, (job, fut) in enumerate(zip(jobs, futures), 1):
        r = fut.result()
        m, s, a, p = job
        scores.setdefault((m, a, json.dumps(p, sort_keys=True)), []).append(r["late_accuracy"])
        print(f"[tune {i}/{len(jobs)}] {m} {setting_name(a, cfg)} seed {s} {p}: late {r['late_accuracy']:.4f}",
              flush=True)  # fmt: skip
    chosen = {}
    for a in alphas:
        for m in methods:
            best = max(
                (json.loads(k[2]) for k in scores if k[0] == m and k[1] == a),
                key=lambda p: statistics.mean(scores[(m, a, json.dumps(p, sort_keys=True))]),
            )
            chosen[f"{m}|{a}"] = best
            print(f"chosen for {m} ({setting_name(a, cfg)}): {best}", flush=True)
    return chosen


def parse_grid(items: list[str]) -> dict[str, list[float]]:
    """``["lr=0.02,0.05", "server_lr=1"]`` -> ``{"lr": [0.02, 0.05], "server_lr": [1.0]}``."""
    grid = {}
    for item in items:
        key, _, values = item.partition("=")
        if not values:
            raise SystemExit(f"--grid {item!r}: expected KEY=V1,V2,... (e.g. lr=0.02,0.05,0.1)")
        grid[key] = [float(v) for v in values.split(",")]
    return grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--methods", nargs="+", help="override the suite's methods (preset names)")
    parser.add_argument("--alphas", nargs="+", type=float, help="Dirichlet concentrations (Dirichlet suites)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (tune on seeds the tables omit)")
    parser.add_argument("--max-virtual-time", type=float)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--local-epochs", type=int, help="local epochs (default: the suite's, 1 on digits suites)")
    parser.add_argument("--kwargs", nargs="*", default=[], metavar="METHOD=JSON", help="preset keyword arguments")
    parser.add_argument("--grid", nargs="*", default=[], metavar="KEY=V1,V2", help="tuning grid (see above)")
    parser.add_argument("--tune-seeds", type=int, default=1, help="seeds per grid point")
    parser.add_argument("--tune-offset", type=int, default=100, help="first tuning seed")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--docs", action="store_true", help="also write docs/benchmarks/<suite>.md (machine, date)")
    args = parser.parse_args()
    commit = None
    if args.docs:
        from docs_tables import clean_commit

        commit = clean_commit()  # before the runs: refuses uncommitted code
    suite = SUITES[args.suite]
    cfg = {
        "devices": suite["devices"],
        "num_clients": suite.get("num_clients", 100),
        "partition": suite.get("partition"),
        "lr": suite.get("lr", 0.05),
        "eval_every": suite.get("eval_every", 25),
        "max_virtual_time": args.max_virtual_time or suite["max_virtual_time"],
        "target": args.target,
        "local_epochs": args.local_epochs or suite.get("local_epochs", 1),
        "kwargs": {**suite["kwargs"], **{k: json.loads(v) for k, v in (a.split("=", 1) for a in args.kwargs)}},
        "grid": parse_grid(args.grid),
    }
    if args.alphas and cfg["partition"] is not None:
        raise SystemExit(f"--alphas: the {args.suite} suite is not split by a Dirichlet partition")
    methods, alphas = args.methods or suite["methods"], args.alphas or suite["alphas"]
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    if cfg["grid"] and set(seeds) & set(range(args.tune_offset, args.tune_offset + args.tune_seeds)):
        raise SystemExit("the tuning seeds overlap the reported seeds: move --tune-offset or --seed-offset")
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        cfg["chosen"] = tune(pool, methods, alphas, cfg, args) if cfg["grid"] else {}
        jobs = [(m, s, a) for a in alphas for s in seeds for m in methods]
        futures = [pool.submit(run_one, m, s, a, cfg, cfg["chosen"].get(f"{m}|{a}")) for m, s, a in jobs]
        for i, fut in enumerate(futures, 1):
            r = fut.result()
            rows.append(r)
            print(
                f"[{i}/{len(jobs)}] {r['method']} {setting_name(r['alpha'], cfg)} seed {r['seed']}: "
                f"final {r['final_accuracy']:.4f} best {r['best_accuracy']:.4f} "
                f"time-to-{args.target:g} {r['time_to_target']} ({r['wall_seconds']:.0f} s)",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.suite}.csv", "w", newline="") as fh:
        fields = [k for k in rows[0] if k != "history"]
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    device_cls, device_kwargs = cfg["devices"]
    split = "Dirichlet" if cfg["partition"] is None else setting_name(None, cfg)
    header = (
        f"digits, LeNet-5 (lr {cfg['lr']:g}{' unless the grid sets it' if 'lr' in cfg['grid'] else ''}), "
        f"{cfg['num_clients']} clients, {split} split, E={cfg['local_epochs']}, "
        f"devices {device_cls}({device_kwargs}), seeds {seeds.start}..{seeds.stop - 1}, "
        f"{cfg['max_virtual_time']:,.0f} virtual s, evaluation every {cfg['eval_every']} versions, "
        f"preset arguments {cfg['kwargs'] or 'defaults'}"
    )
    if cfg["grid"]:
        header += (
            f". Tuning grid {cfg['grid']} (lr: the clients' learning rate; other keys only for the presets that take "
            f"them), each point on seed(s) {args.tune_offset}..{args.tune_offset + args.tune_seeds - 1}, not "
            "reported; each method at the point with the highest mean test accuracy over the last quarter of the "
            "budget"
        )
    else:
        header += ". Every method at its preset's defaults and the suite's arguments (no tuning grid)"
    plots = []
    for a in alphas:
        name = args.suite if len(alphas) == 1 else f"{args.suite}_{setting_name(a, cfg).split()[-1]}"
        results = {m: [r for r in rows if r["method"] == m and r["alpha"] == a] for m in methods}
        plot(results, args.out / f"{name}.png", f"{args.suite} suite, {setting_name(a, cfg)}", args.target)
        plots.append(name)
    header += (
        f". Cost: {len(rows)} reported runs taking {sum(r['wall_seconds'] for r in rows) / 60:,.0f} min of run time "
        "in all (one thread each; more while other jobs share the cores)"
    )
    table = report(rows, methods, alphas, cfg, header, suite.get("focus", []))
    (args.out / f"{args.suite}.md").write_text(table)
    if args.docs:
        import shutil

        from docs_tables import DOCS_BENCHMARKS, write_docs_table

        for name in plots:
            shutil.copyfile(args.out / f"{name}.png", DOCS_BENCHMARKS / f"{name}.png")
        print(f"wrote {write_docs_table(args.suite, table, commit=commit)}")
    print(table)


if __name__ == "__main__":
    main()
