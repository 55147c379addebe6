"""FedASMU against its ablations and the asynchronous baselines (issue 3's benchmark).

Digits (scikit-learn, offline), LeNet-5, 100 clients, Dirichlet(0.1) labels, devices 1-5x slow (uniform), seeds
0..S-1. Every method gets the same virtual-time budget; the table reports final and best accuracy (mean +- std
over seeds) and virtual time to the target accuracy (mean over the seeds that reached it; "/" when none did).

    python scripts/bench_fedasmu.py                                  # 6 methods x 3 seeds, 2 processes
    python scripts/bench_fedasmu.py --seeds 1 --max-virtual-time 8000 --methods FedASMU FedASMU-0
    python scripts/bench_fedasmu.py --fedasmu '{"iota0": 0.0, "lambda0": 10.0}'   # try other FedASMU settings

Writes ``bench_fedasmu.csv`` and ``bench_fedasmu.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

METHODS = ["FedASMU", "FedASMU-DA", "FedASMU-FA", "FedASMU-0", "FedAsync", "FedBuff"]


def run_one(method: str, seed: int, args: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    from lit_asyncfl import FederatedTrainer
    from lit_asyncfl.algorithms import PRESETS
    from lit_asyncfl.data import DigitsDataModule
    from lit_asyncfl.devices import UniformRatio
    from lit_asyncfl.models import LeNet5

    kwargs = args["fedasmu"] if method.startswith("FedASMU") else {}
    algorithm = PRESETS[method.lower()](**kwargs)
    trainer = FederatedTrainer(
        algorithm,
        num_clients=100,
        local_epochs=args["local_epochs"],
        max_virtual_time=args["max_virtual_time"],
        device_model=UniformRatio(ratio=5.0),
        eval_every=25,
        target_accuracy=args["target"],
        seed=seed,
        logger=False,
        default_root_dir=tempfile.mkdtemp(),
        enable_progress_bar=False,
        print_summary=False,
    )
    trainer.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet", alpha=args["alpha"]))
    s = trainer.summary
    return {
        "method": method,
        "seed": seed,
        **{
            k: s[k]
            for k in (
                "final_accuracy",
                "best_accuracy",
                "time_to_target",
                "versions",
                "updates_received",
                "updates_discarded",
                "mean_staleness",
                "bytes_down",
                "wall_seconds",
            )
        },
    }


def fmt(values: list[float]) -> str:
    if not values:
        return "/"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed (e.g. tune on seeds the table omits)")
    parser.add_argument("--max-virtual-time", type=float, default=20_000.0)
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--alpha", type=float, default=0.1, help="Dirichlet concentration")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--fedasmu", type=json.loads, default={}, help="JSON of FedASMU keyword arguments")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    shared = {
        "max_virtual_time": args.max_virtual_time,
        "target": args.target,
        "alpha": args.alpha,
        "local_epochs": args.local_epochs,
        "fedasmu": args.fedasmu,
    }
    jobs = [(m, s) for s in range(args.seed_offset, args.seed_offset + args.seeds) for m in args.methods]
    rows = []
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_one, m, s, shared) for m, s in jobs]
        for i, fut in enumerate(futures, 1):
            row = fut.result()
            rows.append(row)
            print(
                f"[{i}/{len(jobs)}] {row['method']} seed {row['seed']}: final {row['final_accuracy']:.4f} "
                f"best {row['best_accuracy']:.4f} time-to-{args.target:g} {row['time_to_target']} "
                f"({row['wall_seconds']:.0f} s)",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "bench_fedasmu.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"digits, LeNet-5, 100 clients, Dirichlet({args.alpha}), E={args.local_epochs}, 5x speed spread, "
        f"seeds {args.seed_offset}..{args.seed_offset + args.seeds - 1}, "
        f"{args.max_virtual_time:g} virtual s, FedASMU settings {args.fedasmu or 'default'}",
        "",
        f"| method | final accuracy | best accuracy | time to {args.target:g} (virtual s) | reached | updates |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in args.methods:
        rs = [r for r in rows if r["method"] == m]
        times = [r["time_to_target"] for r in rs if r["time_to_target"] is not None]
        t = f"{statistics.mean(times):,.0f}" + (f" ± {statistics.stdev(times):,.0f}" if len(times) > 1 else "")
        updates = statistics.mean(r["updates_received"] for r in rs)
        lines.append(
            f"| {m} | {fmt([r['final_accuracy'] for r in rs])} | {fmt([r['best_accuracy'] for r in rs])} | "
            f"{t if times else '/'} | {len(times)}/{len(rs)} | {updates:,.0f} |"
        )
    table = "\n".join(lines)
    (args.out / "bench_fedasmu.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
