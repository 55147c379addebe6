"""Compare algorithm presets on the offline digits data: the benchmark tables of FedASMU, FedADT and FedHist.

Every method of a suite runs with the same devices, data split and virtual-time budget, for several seeds and
Dirichlet concentrations; the table reports final and best accuracy (mean +- std over seeds) and the virtual
time to the target accuracy (mean over the seeds that reached it, "/" when none did).

    python scripts/bench_algorithms.py --suite fedasmu          # FedASMU, -DA, -FA, -0, FedAsync, FedBuff, PORT
    python scripts/bench_algorithms.py --suite fedadt           # FedADT, FedFa, CA2FL, FADAS, FedCompass, ...
    python scripts/bench_algorithms.py --suite fedhist          # FedHist, its ablations, FedAsync, FedBuff, ...
    python scripts/bench_algorithms.py --suite fedasmu --seeds 1 --seed-offset 100 --local-epochs 5 \\
        --kwargs FedASMU='{"lambda0": 10.0}'                     # a variant, on a seed the tables do not use

Writes ``<suite>.csv`` and ``<suite>.md`` into ``--out`` (with ``--docs`` also ``docs/benchmarks/<suite>.md``,
headed by the command, machine and date: the table the documentation shows). Runs go to a process pool (one
torch thread each).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from lit_asyncfl.reporting import mean_std

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
        # the same 20% concurrency as FedADT, FedFa, CA2FL and FedBuff (FADAS, a newer standard, too)
        "kwargs": {
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
}


def run_one(method: str, seed: int, alpha: float, cfg: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    import lit_asyncfl.devices as devices
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import PRESETS
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.models import LeNet5

    device_cls, device_kwargs = cfg["devices"]
    trainer = FederatedTrainer(
        PRESETS[method.lower()](**cfg["kwargs"].get(method, {})),
        num_clients=100,
        local_epochs=cfg["local_epochs"],
        max_virtual_time=cfg["max_virtual_time"],
        device_model=getattr(devices, device_cls)(**device_kwargs),
        eval_every=25,
        target_accuracy=cfg["target"],
        seed=seed,
        logger=False,
        default_root_dir=tempfile.mkdtemp(),
        enable_progress_bar=False,
        print_summary=False,
    )
    trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet", alpha=alpha))
    s = trainer.summary
    keys = (
        "final_accuracy",
        "best_accuracy",
        "time_to_target",
        "versions_to_target",
        "versions",
        "updates_received",
        "mean_staleness",
    )
    return {
        "method": method,
        "alpha": alpha,
        "seed": seed,
        **{k: s[k] for k in keys},
        "wall_seconds": s["wall_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), required=True)
    parser.add_argument("--methods", nargs="+", help="override the suite's methods (preset names)")
    parser.add_argument("--alphas", nargs="+", type=float, help="Dirichlet concentrations")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (tune on seeds the tables omit)")
    parser.add_argument("--max-virtual-time", type=float)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--kwargs", nargs="*", default=[], metavar="METHOD=JSON", help="preset keyword arguments")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--docs", action="store_true", help="also write docs/benchmarks/<suite>.md (machine, date)")
    args = parser.parse_args()
    suite = SUITES[args.suite]
    cfg = {
        "devices": suite["devices"],
        "max_virtual_time": args.max_virtual_time or suite["max_virtual_time"],
        "target": args.target,
        "local_epochs": args.local_epochs,
        "kwargs": {**suite["kwargs"], **{k: json.loads(v) for k, v in (a.split("=", 1) for a in args.kwargs)}},
    }
    methods, alphas = args.methods or suite["methods"], args.alphas or suite["alphas"]
    seeds = range(args.seed_offset, args.seed_offset + args.seeds)
    jobs = [(m, s, a) for a in alphas for s in seeds for m in methods]
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_one, m, s, a, cfg) for m, s, a in jobs]
        for i, fut in enumerate(futures, 1):
            r = fut.result()
            rows.append(r)
            print(
                f"[{i}/{len(jobs)}] {r['method']} alpha {r['alpha']} seed {r['seed']}: "
                f"final {r['final_accuracy']:.4f} best {r['best_accuracy']:.4f} "
                f"time-to-{args.target:g} {r['time_to_target']} ({r['wall_seconds']:.0f} s)",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.suite}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    device_cls, device_kwargs = cfg["devices"]
    lines = [
        f"digits, LeNet-5 (lr 0.05), 100 clients, E={args.local_epochs}, devices {device_cls}({device_kwargs}), "
        f"seeds {seeds.start}..{seeds.stop - 1}, {cfg['max_virtual_time']:,.0f} virtual s, "
        f"preset arguments {cfg['kwargs'] or 'defaults'}",
        "",
        f"| Dirichlet | method | final accuracy | best accuracy | time to {args.target:g} (virtual s) "
        "| versions to target | reached | updates |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for a in alphas:
        for m in methods:
            rs = [r for r in rows if r["method"] == m and r["alpha"] == a]
            times = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
            rounds = [r["versions_to_target"] for r in rs if r["versions_to_target"] is not None]
            updates = statistics.mean(r["updates_received"] for r in rs)
            lines.append(
                f"| {a:g} | {m} | {mean_std([r['final_accuracy'] for r in rs])} | "
                f"{mean_std([r['best_accuracy'] for r in rs])} | {mean_std(times, 0)} | {mean_std(rounds, 0)} | "
                f"{len(times)}/{len(rs)} | {updates:,.0f} |"
            )
    table = "\n".join(lines)
    (args.out / f"{args.suite}.md").write_text(table + "\n")
    if args.docs:
        from docs_tables import write_docs_table

        print(f"wrote {write_docs_table(args.suite, table)}")
    print(table)


if __name__ == "__main__":
    main()
