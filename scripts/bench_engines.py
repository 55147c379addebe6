"""Per-update time of each local-training engine against a raw PyTorch loop doing the same SGD steps.

The raw loop (``raw_update`` of ``bench_overhead.py``: one reused model, client shards pre-sliced as tensors, a
fresh SGD optimizer per update) is the physical limit for the same work. Every engine runs the same jobs (same
start weights, same batch order) under the same kernel choice, interleaved in one process and repeated; medians
per update are compared. The row ``raw, oneDNN on`` shows what the automatic kernel choice is worth.

    python scripts/bench_engines.py                  # digits, LeNet-5, ~18 samples per client, E=1, batch 10
    python scripts/bench_engines.py --epochs 5 --threads 2

The cohort engine gets all jobs in flight at once and computes them ``--cohort`` at a time. The last line is
machine-readable: ``fast_vs_raw=<x> lightning_vs_raw=<x> cohort50_vs_raw=<x>``.

``--whole-runs`` measures instead whole ``FederatedTrainer`` runs (100 clients, LeNet-5, batch 10, E = 1, 1 thread)
with ``engine="fast"`` and ``engine="cohort"``, where cohorts are only as large as the jobs pending when an update is
first needed: FedAsync and FedBuff (buffer 10) at 10 and 50 clients in flight and FedAvg with 10 and 50 clients per
round, on an IID and a Dirichlet(0.5) split of the digits. Each configuration also times a **raw PyTorch loop over
the same updates**: the client jobs whose updates the ``fast`` run received (recorded in its warm-up run: same
clients, same seeds, so the same shards, batch order and number of SGD steps), trained one after another by a plain
loop without the simulator (one reused LeNet-5, each client's shard pre-sliced as tensors, the start weights copied
in, a fresh ``torch.optim.SGD``, ``randperm`` batches, ``F.cross_entropy``, backward, step, the weights read out as
one vector), under the kernel choice the engines make. It does only the local training: no server, aggregation,
event queue or evaluation, and every job starts from the initial weights (the cost of a step does not depend on
them). The three run interleaved (fast, cohort, raw, fast, ...) so machine load affects them alike; the global model
is evaluated only at the start and the end of the engines' runs. It prints updates per wall second (engines: from
``on_fit_start`` to ``on_fit_end``, so without building the trainer and writing the plots, about a second per run
that both engines pay alike; raw: the loop), medians over repeats, the ratios cohort/fast and cohort/raw of the
medians (above 1: cohort faster), the range of cohort/raw over the repeats and the mean cohort size. The last line is
``cohort_vs_raw_whole_50=X cohort_vs_raw_whole_10=Y``: raw-loop time per update divided by the cohort's, on the
Dirichlet(0.5) split, each the median over FedAsync, FedBuff and FedAvg with 50 (X) or 10 (Y) clients in flight:

    python scripts/bench_engines.py --whole-runs                   # ~600 updates per run, 3 repeats: ~10 minutes
    python scripts/bench_engines.py --whole-runs --partitions dirichlet --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from bench_overhead import raw_update

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import Algorithm, FedAsync, FedAvg, FedBuff
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.client.engines import ENGINES, build_executor
from lit_asyncfl.client.kernels import OneDNN
from lit_asyncfl.core.seeding import derive_seed
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LeNet5

#: Whole-run configurations: (algorithm factory, updates per version).
WHOLE_RUNS: dict[str, tuple[Callable[[], Algorithm], int]] = {
    "fedasync10": (lambda: FedAsync(concurrency=10), 1),
    "fedasync50": (lambda: FedAsync(concurrency=50), 1),
    "fedbuff10": (lambda: FedBuff(buffer_size=10, concurrency=10), 10),
    "fedbuff50": (lambda: FedBuff(buffer_size=10, concurrency=50), 10),
    "fedavg10": (lambda: FedAvg(clients_per_round=10), 10),
    "fedavg50": (lambda: FedAvg(clients_per_round=50), 50),
}

#: Clients in flight of each whole-run configuration.
IN_FLIGHT = {"fedasync10": 10, "fedbuff10": 10, "fedavg10": 10, "fedasync50": 50, "fedbuff50": 50, "fedavg50": 50}


class RunTimer(Callback):
    """Wall time from ``on_fit_start`` to ``on_fit_end``: the run itself (simulation, local training, aggregation,
    the first and last evaluation), without building the trainer and data (same for both engines) and without the
    output files (plots) written after it."""

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        self.start = time.perf_counter()

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self.seconds = time.perf_counter() - self.start


class JobRecorder(Callback):
    """The (client, seed, SGD steps) of every update the server receives, in order."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, int, int]] = []

    def on_client_update(self, trainer: FederatedTrainer, update: ClientUpdate, aggregated: bool) -> None:
        self.jobs.append((update.job.client, update.job.seed, update.num_steps))


def whole_run(
    config: str, partition: str, engine: str, updates: int, recorder: JobRecorder | None = None
) -> tuple[float, int, list[int], FederatedTrainer]:
    """One run: (wall seconds of the run, updates received, cohort sizes, the trainer)."""
    make, per_version = WHOLE_RUNS[config]
    versions = max(1, updates // per_version)
    timer = RunTimer()
    trainer = FederatedTrainer(
        make(),
        num_clients=100,
        max_versions=versions,
        eval_every=versions,  # evaluated at the start and the end only: the engines' share of the run shows
        monitor="val_acc",
        seed=0,
        engine=engine,
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        checkpoint_every_seconds=None,
        default_root_dir=tempfile.mkdtemp(),
        callbacks=[timer] if recorder is None else [timer, recorder],
    )
    alpha = {"alpha": 0.5} if partition == "dirichlet" else {}
    data = DigitsDataModule(partition=partition, batch_size=10, **alpha)
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    trainer.fit(model, datamodule=data)
    assert trainer.simulator is not None
    sizes = list(getattr(trainer.simulator.executor, "cohort_sizes", []))
    return timer.seconds, trainer.summary["updates_received"], sizes, trainer


def raw_whole(trainer: FederatedTrainer, jobs: list[tuple[int, int, int]]) -> Callable[[], float]:
    """The raw loop over the recorded ``jobs`` on the shards and kernel choice of the ``fast`` run ``trainer``;
    returns a function timing one pass (seconds)."""
    assert trainer.simulator is not None
    engine = trainer.simulator.executor.trainer
    shards, onednn = engine.shards, engine.onednn
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    sliced = [(shards.inputs[i], shards.targets[i]) for i in shards.indices]

    def update(client: int, seed: int, steps: int) -> torch.Tensor:
        x, y = sliced[client]
        with torch.no_grad():
            torch._foreach_copy_(params, start)
        generator = torch.Generator().manual_seed(seed)
        optimizer = torch.optim.SGD(params, lr=0.05)
        done = 0
        while done < steps:
            order = torch.randperm(len(y), generator=generator)
            for s in range(0, len(y), 10):
                if done == steps:
                    break
                idx = order[s : s + 10]
                loss = F.cross_entropy(model(x[idx]), y[idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                done += 1
        return torch.nn.utils.parameters_to_vector(params).detach().clone()

    def timed() -> float:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with OneDNN(onednn):
                t0 = time.perf_counter()
                for client, seed, steps in jobs:
                    update(client, seed, steps)
                return time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)

    return timed


def whole_runs(args: argparse.Namespace) -> None:
    print(
        f"whole runs: 100 clients, LeNet-5, batch 10, E=1, 1 thread, ~{args.updates} updates per run, "
        f"{args.repeats} interleaved repeats (fast, cohort, raw loop); updates per wall second (median)"
    )
    header = f"{'run':<12}{'partition':<11}{'fast upd/s':>11}{'cohort upd/s':>13}{'raw upd/s':>10}"
    print(f"{header}{'cohort/fast':>12}{'cohort/raw':>11}{'range':>11}{'mean cohort':>12}")
    vs_fast, vs_raw = [], {}
    for partition in args.partitions:
        for config in args.configs:
            rates: dict[str, list[float]] = {"fast": [], "cohort": [], "raw": []}
            sizes: list[int] = []
            recorder = JobRecorder()
            *_, fast_trainer = whole_run(config, partition, "fast", args.updates, recorder)  # warm-up, job record
            whole_run(config, partition, "cohort", 50)  # warm-up (first calls of vmap)
            raw = raw_whole(fast_trainer, recorder.jobs)
            for _ in range(args.repeats):
                for engine in ("fast", "cohort"):
                    seconds, received, cohorts, _ = whole_run(config, partition, engine, args.updates)
                    rates[engine].append(received / seconds)
                    sizes += cohorts
                rates["raw"].append(len(recorder.jobs) / raw())
            fast, cohort, rawm = (statistics.median(rates[k]) for k in ("fast", "cohort", "raw"))
            pairs = [c / r for c, r in zip(rates["cohort"], rates["raw"])]
            vs_fast.append(cohort / fast)
            vs_raw[partition, config] = cohort / rawm
            print(
                f"{config:<12}{partition:<11}{fast:>11.0f}{cohort:>13.0f}{rawm:>10.0f}{cohort / fast:>11.2f}x"
                f"{cohort / rawm:>10.2f}x{f'{min(pairs):.2f}-{max(pairs):.2f}':>11}{np.mean(sizes):>12.1f}"
            )
    print(f"cohort_vs_fast_min={min(vs_fast):.2f} cohort_vs_fast_max={max(vs_fast):.2f}")
    whole = {}
    for flight in (50, 10):
        ratios = [r for (part, config), r in vs_raw.items() if part == "dirichlet" and IN_FLIGHT[config] == flight]
        whole[flight] = f"{statistics.median(ratios):.2f}" if ratios else "nan"
    print(f"cohort_vs_raw_whole_50={whole[50]} cohort_vs_raw_whole_10={whole[10]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--whole-runs", action="store_true", help="time whole runs: fast, cohort, raw loop")
    parser.add_argument("--updates", type=int, default=600, help="whole runs: updates per run (about)")
    parser.add_argument("--configs", nargs="+", choices=list(WHOLE_RUNS), default=list(WHOLE_RUNS))
    parser.add_argument("--partitions", nargs="+", choices=["iid", "dirichlet"], default=["iid", "dirichlet"])
    parser.add_argument("--clients", type=int, default=80, help="IID clients (80 gives ~18 samples each)")
    parser.add_argument("--jobs", type=int, default=100, help="updates per repeat (client = job %% clients)")
    parser.add_argument("--cohort", type=int, default=50, help="jobs per cohort of the cohort engine")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=None, help="default: 7, whole runs 3")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--onednn", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--compile", action="store_true", help="add the torch.compile'd cohort (compiles first)")
    args = parser.parse_args()
    if args.whole_runs:
        args.repeats = args.repeats or 3
        return whole_runs(args)  # each trainer sets its own thread count (1) and kernel choice
    args.repeats = args.repeats or 7
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
