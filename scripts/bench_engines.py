"""Per-update time of each local-training engine against a raw PyTorch loop doing the same SGD steps.

The raw loop (``raw_update`` of ``bench_overhead.py``: one reused model, client shards pre-sliced as tensors, a
fresh SGD optimizer per update) is the physical limit for the same work. Every engine runs the same jobs (same
start weights, same batch order) under the same kernel choice, interleaved in one process and repeated; medians
per update are compared. The row ``raw, oneDNN on`` shows what the automatic kernel choice is worth.

    python scripts/bench_engines.py                  # digits, LeNet-5, ~18 samples per client, E=1, batch 10
    python scripts/bench_engines.py --epochs 5 --threads 2

The cohort engine gets all jobs in flight at once and computes them ``--cohort`` at a time. The last line is
machine-readable: ``fast_vs_raw=<x> lightning_vs_raw=<x> cohort50_vs_raw=<x>``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from bench_overhead import raw_update

from lit_asyncfl.client.engines import ENGINES, build_executor
from lit_asyncfl.client.kernels import OneDNN
from lit_asyncfl.core.seeding import derive_seed
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=80, help="IID clients (80 gives ~18 samples each)")
    parser.add_argument("--jobs", type=int, default=100, help="updates per repeat (client = job %% clients)")
    parser.add_argument("--cohort", type=int, default=50, help="jobs per cohort of the cohort engine")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--onednn", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile'd cohort (compiles first)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dm = DigitsDataModule(partition="iid", batch_size=args.batch_size)
    dm.setup("fit")
    shards = dm.client_shards(args.clients, seed=0)
    model = LeNet5(lr=0.05)
    onednn = {"auto": None, "on": True, "off": False}[args.onednn]
    executors = {name: build_executor(name, model, shards, args.batch_size, onednn=onednn) for name in ENGINES}
    executors["cohort"].max_cohort = args.cohort
    engines = list(ENGINES)
    if args.compile:
        executors["cohort, compiled"] = build_executor("cohort", model, shards, args.batch_size, compile_cohort=True)
        executors["cohort, compiled"].max_cohort = args.cohort
        engines.append("cohort, compiled")
    kernels = executors["fast"].trainer.onednn  # the (automatic) choice, the same for every engine
    raw_model = LeNet5(lr=0.05)
    sliced = [(shards.inputs[i], shards.targets[i]) for i in shards.indices]  # pre-sliced per client
    start = executors["fast"].trainer.flat.read()
    start_views = executors["fast"].trainer.flat.param_views(start)
    jobs = [
        ClientJob(j, j % args.clients, 0, 0.0, JobTiming(0, 0, 0), derive_seed(0, j), args.epochs)
        for j in range(args.jobs)
    ]

    def run_raw(onednn_flag: bool | None):
        def run():
            with OneDNN(onednn_flag):
                return [
                    raw_update(raw_model, *sliced[j.client], start_views, j.seed, args.epochs, args.batch_size, 0.05)
                    for j in jobs
                ]

        return run

    def run_engine(name: str):
        executor = executors[name]

        def run():
            for j in jobs:  # all in flight at once; the cohort engine computes them max_cohort at a time
                executor.submit(j, start)
            return [executor.result(j.job_id).weights for j in jobs]

        return run

    runs = {"raw": run_raw(kernels), "raw, oneDNN on": run_raw(True)}
    runs.update({name: run_engine(name) for name in engines})
    reference = runs["raw"]()  # also the warm-up (and the compilation of a compiled cohort)
    max_diff = {name: max((a - b).abs().max().item() for a, b in zip(reference, runs[name]())) for name in engines}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / len(jobs))
    med = {k: statistics.median(v) for k, v in times.items()}
    samples = np.mean([len(i) for i in shards.indices])
    kernel_text = {None: "oneDNN unchanged (on)", True: "oneDNN on", False: "oneDNN off"}[kernels]
    print(
        f"{len(jobs)} updates x {args.repeats} repeats, {samples:.1f} samples/client, E={args.epochs}, "
        f"batch {args.batch_size}, {args.threads} thread(s), {kernel_text} ({args.onednn})"
    )
    print(f"{'engine':<26}{'median ms/update':>18}{'ratio vs raw':>14}{'max |w - w_raw|':>18}")
    for name in runs:
        diff = f"{max_diff[name]:.1e}" if name in max_diff else "-"
        label = name.replace("cohort", f"cohort ({args.cohort})")
        print(f"{label:<26}{med[name] * 1e3:>18.3f}{med[name] / med['raw']:>14.3f}{diff:>18}")
    ratio = {name: med[name] / med["raw"] for name in engines}
    compiled = f" cohort{args.cohort}_compiled_vs_raw={ratio['cohort, compiled']:.3f}" if args.compile else ""
    print(
        f"fast_vs_raw={ratio['fast']:.3f} lightning_vs_raw={ratio['lightning']:.3f} "
        f"cohort{args.cohort}_vs_raw={ratio['cohort']:.3f}{compiled}"
    )


if __name__ == "__main__":
    main()
