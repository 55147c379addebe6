"""Per-update time of each local-training engine against a raw PyTorch loop doing the same SGD steps.

The raw loop (``raw_update`` of ``bench_overhead.py``: one reused model, client shards pre-sliced as tensors, a
fresh SGD optimizer per update) is the physical limit for the same work. Every engine runs the same jobs (same
start weights, same batch order) under the same kernel choice, interleaved in one process and repeated; medians
per update are compared. The row ``raw, oneDNN on`` shows what the automatic kernel choice is worth.

    python scripts/bench_engines.py                  # digits, LeNet-5, ~18 samples per client, E=1, batch 10
    python scripts/bench_engines.py --epochs 5 --threads 2

The cohort engine gets all jobs in flight at once and computes them ``--cohort`` at a time. The last line is
machine-readable: ``fast_vs_raw=<x> lightning_vs_raw=<x> cohort50_vs_raw=<x>``.

``--whole-runs`` measures instead whole ``FederatedTrainer`` runs (100 clients, LeNet-5, batch 10, E = 1, 1 thread) with
``engine="fast"`` and ``engine="cohort"``, where cohorts are only as large as the jobs pending when an update is first
needed: FedAsync and FedBuff (buffer 10) at 10 and 50 clients in flight and FedAvg with 10 and 50 clients per round, on
an IID and a Dirichlet(0.5) split of the digits. Each configuration also times a **raw PyTorch loop over the same
updates**: the client jobs whose updates the ``fast`` run received (recorded in its warm-up run: same clients, same
seeds, so the same shards, batch order and number of SGD steps), trained one after another by a plain loop without the
simulator (one reused LeNet-5, each client's shard pre-sliced as tensors, the start weights copied in, a fresh
``torch.optim.SGD``, ``randperm`` batches, ``F.cross_entropy``, backward, step, the weights read out as one vector),
under the kernel choice the engines make. It does only the local training: no server, aggregation, event queue or
evaluation, and every job starts from the initial weights (the cost of a step does not depend on them). The runs
interleave (fast, cohort, free engine below, raw, fast, ...) so machine load affects them alike; the global model is
evaluated only at the start and the end of the engines' runs. It prints updates per wall second (engines: from
``on_fit_start`` to ``on_fit_end``, so without building the trainer and writing the plots, about a second per run that
both engines pay alike; raw: the loop), medians over repeats, the ratios cohort/fast and cohort/raw of the medians
(above 1: cohort faster), the range of cohort/raw over the repeats and the mean cohort size.

Two floors come with them. **The simulator floor**: each configuration also runs, interleaved, with a free engine
(:class:`FreeEngine`: every job's update is its start weights plus a deterministic tiny delta, without training, so the
event queue, scheduler, server and evaluation do their normal work); raw-loop time per update divided by the free run's
is the ratio no engine can beat with today's simulator, server and evaluation (column ``floor``), and the free run's
time splits into simulator and scheduler, server (``receive``/``flush``: checks, aggregation), global evaluation and the
free engine itself. **The compute floor of training**: the FLOPs of one update's matmuls and convolutions
(``torch.utils.flop_counter`` over the raw loop's updates of 50 recorded jobs) at the throughput this CPU reaches on the
batched step's GEMMs at the run's mean cohort size (``bmm`` of the forward and backward products of every layer,
convolutions as im2col products; the best any batched kernel could do, ignoring im2col, pooling, activations and the
optimizer), with a large matmul's GFLOP/s for reference. ``ceiling`` = raw ms / (free ms + compute floor ms) bounds
cohort/raw. Before the last line: ``floor_vs_raw_whole_50=X floor_vs_raw_whole_10=Y`` and ``ceiling_vs_raw_whole_50=X
ceiling_vs_raw_whole_10=Y`` (medians as below). The last line is ``cohort_vs_raw_whole_50=X cohort_vs_raw_whole_10=Y``:
raw-loop time per update divided by the cohort's, on the Dirichlet(0.5) split, each the median over FedAsync, FedBuff
and FedAvg with 50 (X) or 10 (Y) clients in flight:

    python scripts/bench_engines.py --whole-runs                   # ~600 updates per run, 3 repeats: 3-6 minutes
    python scripts/bench_engines.py --whole-runs --partitions dirichlet --repeats 5

``--split`` adds, per repeat, one more cohort run with timers around its parts (:class:`CohortSplit`) and prints its
milliseconds per update: batched calls, the rest of the batched steps, single-job steps, per-job work, the executor,
server, evaluation and simulator (the run is a little slower than untimed; the table's figures come from the untimed
runs):

    python scripts/bench_engines.py --whole-runs --configs fedasync50 fedasync10 --partitions dirichlet --split

``--device cuda`` trains on a GPU instead: the engines keep the clients' data and weights there, the raw loop too
(its batch order drawn on the CPU and moved to the GPU once per epoch, as the engines do), and every timing ends with
the device's work (``torch.cuda.synchronize``); the whole runs' compute floor (a CPU's GEMM rate) is not measured there
(``nan``), and ``--split``, ``--step`` and ``--compile`` are refused:

    python scripts/bench_engines.py --device cuda
    python scripts/bench_engines.py --whole-runs --device cuda --partitions dirichlet

``--step`` times one batched step of the cohort engine at 5, 10, 20 and 50 jobs (10 samples each, whole and padded
batches), interleaved, medians of process time (CPU time: robust to a shared machine's other processes, as the step runs
on one thread), four ways: the step before the channels-last kernels (gradient inside ``vmap``), the engine's step
without its routed kernels (``vmap``'s own rules, gradient outside ``vmap``), the engine's step as it was before
``F.linear`` and ``F.cross_entropy`` were routed and the call bound the weights itself (``vmap`` of ``functional_call``,
convolutions and max-pooling routed), and the engine's step. The last lines are ``step_speedup_5=X ...
step_speedup_50=X`` (whole batches: the first's time divided by the engine's) and ``step_vs_conv_routed_5=X ...``
(whole batches: the third's time divided by the engine's).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from bench_overhead import raw_update
from torch import Tensor

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import Algorithm, FedAsync, FedAvg, FedBuff
from lit_asyncfl.callbacks import Callback
from lit_asyncfl.client.engines import ENGINES, build_executor
from lit_asyncfl.client.kernels import OneDNN
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming, derive_seed
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.shards import steps_per_epoch
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
        _synchronize()
        self.start = time.perf_counter()

    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        _synchronize()
        self.seconds = time.perf_counter() - self.start


def _device_name(device: str) -> str:
    """The device's name as printed: ``cpu`` or the GPU's name."""
    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def _synchronize() -> None:
    """Wait for the GPU's queued work (timings on CUDA end when the device's work does; nothing on a CPU run)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class JobRecorder(Callback):
    """The (client, seed, SGD steps) of every update the server receives, in order."""

    def __init__(self) -> None:
        self.jobs: list[tuple[int, int, int]] = []

    def on_client_update(self, trainer: FederatedTrainer, update: ClientUpdate, aggregated: bool) -> None:
        self.jobs.append((update.job.client, update.job.seed, update.num_steps))


class _Timed:
    """Wall seconds spent in calls of a function (the outermost call only: a call from inside another timed call of
    the same :class:`_Timed` is not counted twice)."""

    def __init__(self) -> None:
        self.seconds, self.depth = 0.0, 0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return fn(*args, **kwargs)
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.depth -= 1

        return timed


class FreeEngine(Callback):
    """Bench-only: the ``fast`` run's local training replaced by a free one, to measure the simulator floor.

    At fit start the run's executor returns, for each job, its start weights plus a deterministic tiny delta (a fixed
    random vector times a factor drawn from the job's seed) with the number of steps the ``fast`` engine would take,
    without training; everything else (event queue, scheduler, the server's checks and aggregation, evaluation) does
    its normal work. The run's wall time then splits into :attr:`server` (``receive``/``flush``: checks,
    aggregation, new versions), :attr:`evaluation` (the global evaluations), :attr:`engine` (the free updates
    themselves, with the executor around them) and the rest, the simulator and scheduler (:meth:`split`).
    """

    def __init__(self) -> None:
        self.server, self.evaluation, self.engine = _Timed(), _Timed(), _Timed()

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        sim = trainer.simulator
        assert sim is not None
        engine = sim.executor.trainer
        start = engine.flat.read()
        delta = torch.randn(start.shape, generator=torch.Generator().manual_seed(0), dtype=start.dtype) * 1e-4
        delta = delta.to(start.device)

        def free_train(job: ClientJob, start_weights: Tensor, fresh: Any = None) -> ClientUpdate:
            per_epoch = steps_per_epoch(engine.shards.num_samples(job.client), engine.batch_size)
            steps = per_epoch * job.local_epochs
            steps = steps if job.local_steps is None else min(steps, job.local_steps)
            weights = torch.add(start_weights, delta, alpha=1 + job.seed % 7)
            return engine.make_update(job, weights, start_weights, steps, float(steps), {"lr": engine.lr})

        def free_result(job_id: int, fresh: Any = None) -> ClientUpdate:
            # No generators_kept around each job (a per-job cost of the sequential executor that a cohort pays once
            # per cohort): the free update draws no random numbers.
            job, start_weights = sim.executor._pending.pop(job_id)
            return free_train(job, start_weights)

        engine.lr = 0.05
        sim.executor.result = self.engine.wrap(free_result)
        sim.server.receive = self.server.wrap(sim.server.receive)
        sim.server.flush = self.server.wrap(sim.server.flush)
        trainer.evaluation.run = self.evaluation.wrap(trainer.evaluation.run)

    def split(self, seconds: float) -> dict[str, float]:
        """The run's ``seconds`` as shares: simulator and scheduler, server, evaluation, free engine."""
        parts = {"server": self.server.seconds, "evaluation": self.evaluation.seconds, "engine": self.engine.seconds}
        return {"simulator": 1 - sum(parts.values()) / seconds, **{k: v / seconds for k, v in parts.items()}}


class CohortSplit(Callback):
    """Bench-only: where a ``cohort`` run's wall time goes, per update (``--split``): the batched calls (the
    ``vmap``'d step), the rest of the batched steps (batches, gradients, optimizer, logging), the steps run one job
    at a time, the per-job work of a cohort (plans, stacking, updates), the executor around the cohort (saving and
    restoring the global generators), the server (``receive``/``flush``), the global evaluation, and the rest (the
    simulator and scheduler). Timers wrap the engine's methods, so the run itself is a little slower than untimed."""

    PARTS = ("call", "group", "one", "train", "result", "server", "evaluation")

    def __init__(self) -> None:
        self.timed = {name: _Timed() for name in self.PARTS}

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        sim = trainer.simulator
        assert sim is not None
        executor, t = sim.executor, self.timed
        engine = executor.trainer
        engine._step, engine._padded_step = t["call"].wrap(engine._step), t["call"].wrap(engine._padded_step)
        engine._step_group, engine._step_one = t["group"].wrap(engine._step_group), t["one"].wrap(engine._step_one)
        engine.train_many = t["train"].wrap(engine.train_many)
        executor.result = t["result"].wrap(executor.result)
        sim.server.receive = t["server"].wrap(sim.server.receive)
        sim.server.flush = t["server"].wrap(sim.server.flush)
        trainer.evaluation.run = t["evaluation"].wrap(trainer.evaluation.run)

    def split(self, seconds: float, updates: int) -> dict[str, float]:
        """Milliseconds per update of each part of a run of ``seconds`` that received ``updates``."""
        t = {name: timed.seconds for name, timed in self.timed.items()}
        parts = {
            "whole": seconds,
            "batched calls": t["call"],
            "rest of batched steps": t["group"] - t["call"],
            "single-job steps": t["one"],
            "per-job work": t["train"] - t["group"] - t["one"],
            "executor": t["result"] - t["train"],
            "server": t["server"],
            "evaluation": t["evaluation"],
            "simulator": seconds - t["result"] - t["server"] - t["evaluation"],
        }
        return {name: value / updates * 1e3 for name, value in parts.items()}


def whole_run(
    config: str,
    partition: str,
    engine: str,
    updates: int,
    recorder: JobRecorder | None = None,
    free: FreeEngine | CohortSplit | None = None,
    accelerator: str = "cpu",
) -> tuple[float, int, list[int], FederatedTrainer]:
    """One run: (wall seconds of the run, updates received, cohort sizes, the trainer). With ``free`` a
    :class:`FreeEngine`, the ``fast`` engine's training is replaced by free updates; a :class:`CohortSplit` times the
    parts of a ``cohort`` run."""
    make, per_version = WHOLE_RUNS[config]
    versions = max(1, updates // per_version)
    timer = RunTimer()
    extra = [c for c in (recorder, free) if c is not None]
    trainer = FederatedTrainer(
        make(),
        num_clients=100,
        max_versions=versions,
        eval_every=versions,  # evaluated at the start and the end only: the engines' share of the run shows
        monitor="val_acc",
        seed=0,
        engine=engine,
        accelerator=accelerator,
        logger=False,
        enable_progress_bar=False,
        print_summary=False,
        checkpoint_every_seconds=None,
        default_root_dir=tempfile.mkdtemp(),
        callbacks=[timer, *extra],
    )
    alpha = {"alpha": 0.5} if partition == "dirichlet" else {}
    data = DigitsDataModule(partition=partition, batch_size=10, **alpha)
    torch.manual_seed(0)
    model = LeNet5(lr=0.05)
    gc.collect()  # (the earlier runs' garbage: a full collection costs ~0.3 s here, more than a short run's engine)
    trainer.fit(model, datamodule=data)
    if (trainer.stop_reason or "").startswith("interrupted"):  # (a signal stopped the run early: not a figure)
        raise SystemExit(f"{config}: the run was {trainer.stop_reason}; no figures from a cut run")
    assert trainer.simulator is not None
    sizes = list(getattr(trainer.simulator.executor, "cohort_sizes", []))
    return timer.seconds, trainer.summary["updates_received"], sizes, trainer


def raw_whole(
    trainer: FederatedTrainer, jobs: list[tuple[int, int, int]]
) -> tuple[Callable[[], float], Callable[[int, int, int], Tensor]]:
    """The raw loop over the recorded ``jobs`` on the shards and kernel choice of the ``fast`` run ``trainer``:
    a function timing one pass (seconds), and the raw update of one job ``(client, seed, steps)``."""
    assert trainer.simulator is not None
    engine = trainer.simulator.executor.trainer
    shards, onednn = engine.shards, engine.onednn  # (the shards on the run's device)
    torch.manual_seed(0)
    model = LeNet5(lr=0.05).to(engine.device)
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
            order = torch.randperm(len(y), generator=generator).to(y.device)  # (once per epoch, as the engines)
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
                _synchronize()
                t0 = time.perf_counter()
                for client, seed, steps in jobs:
                    update(client, seed, steps)
                _synchronize()
                return time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)

    return timed, update


#: The GEMMs of one LeNet-5 step on 8x8 digits for a batch of ``B`` samples (``M``, ``K``, ``N`` per sample-row
#: factor): the convolutions as im2col products (conv1: 64 output positions x 25 taps -> 6 channels; conv2: 16
#: positions x 150 -> 16), the three linear layers. Forward ``[M, K] @ [K, N]``; backward the input gradient
#: ``[M, N] @ [N, K]`` and the weight gradient ``[K, M] @ [M, N]``, the same FLOPs each.
LENET_GEMMS = [(64, 25, 6), (16, 150, 16), (1, 64, 120), (1, 120, 84), (1, 84, 10)]


def _gflops(fn: Callable[[], Any], flops: float, repeats: int = 30) -> float:
    """GFLOP/s of ``fn`` (``flops`` per call): the best of ``repeats`` calls after a warm-up, one thread."""
    fn()
    best = min(_seconds(fn) for _ in range(repeats))
    return flops / best / 1e9


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def gemm_throughput(jobs: int, batch: int = 10) -> float:
    """GFLOP/s of the batched step's GEMMs (:data:`LENET_GEMMS`, forward and both backward products) as ``bmm``
    over ``jobs`` stacked jobs of ``batch`` samples each: the best any batched kernel reaches at the cohort's
    shapes on this CPU (no im2col, pooling, activations or optimizer: a floor, not a plan)."""
    calls, flops = [], 0.0
    for m, k, n in LENET_GEMMS:
        m *= batch
        for a, b in (((m, k), (k, n)), ((m, n), (n, k)), ((k, m), (m, n))):
            x, y = torch.randn(jobs, *a), torch.randn(jobs, *b)
            calls.append((x, y))
            flops += 2.0 * jobs * a[0] * a[1] * b[1]
    return _gflops(lambda: [torch.bmm(x, y) for x, y in calls], flops)


def flops_per_update(update: Callable[[int, int, int], Tensor], jobs: list[tuple[int, int, int]]) -> float:
    """FLOPs of the matmuls and convolutions (forward and backward) of one update: ``torch.utils.flop_counter``
    over the raw loop's ``update`` of ``jobs`` (client, seed, steps), per job."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        for job in jobs:
            update(*job)
    return counter.get_total_flops() / len(jobs)


def whole_runs(args: argparse.Namespace) -> None:
    print(
        f"whole runs on {_device_name(args.device)}: 100 clients, LeNet-5, batch 10, E=1, 1 thread, ~{args.updates} "
        "updates per run, "
        f"{args.repeats} interleaved repeats (fast, cohort, free engine, raw loop); updates per wall second (median)"
    )
    header = f"{'run':<12}{'partition':<11}{'fast upd/s':>11}{'cohort upd/s':>13}{'free upd/s':>11}{'raw upd/s':>10}"
    print(f"{header}{'cohort/fast':>12}{'cohort/raw':>11}{'range':>11}{'floor':>7}{'mean cohort':>12}")
    vs_fast, vs_raw, floor, ceiling, splits, compute = [], {}, {}, {}, {}, {}
    cohort_splits: dict[tuple[str, str], list[dict[str, float]]] = {}
    rate_at: dict[int, float] = {}  # GEMM GFLOP/s at a number of stacked jobs
    for partition in args.partitions:
        for config in args.configs:
            rates: dict[str, list[float]] = {"fast": [], "cohort": [], "free": [], "raw": []}
            sizes: list[int] = []
            shares: list[dict[str, float]] = []
            recorder = JobRecorder()
            *_, fast_trainer = whole_run(config, partition, "fast", args.updates, recorder, accelerator=args.device)
            whole_run(config, partition, "cohort", 50, accelerator=args.device)  # warm-up (first calls of vmap)
            raw, update = raw_whole(fast_trainer, recorder.jobs)
            for _ in range(args.repeats):
                for engine in ("fast", "cohort"):
                    seconds, received, cohorts, _ = whole_run(
                        config, partition, engine, args.updates, accelerator=args.device
                    )
                    rates[engine].append(received / seconds)
                    sizes += cohorts
                free = FreeEngine()
                seconds, received, *_ = whole_run(
                    config, partition, "fast", args.updates, free=free, accelerator=args.device
                )
                rates["free"].append(received / seconds)
                shares.append(free.split(seconds) | {"ms": seconds / received * 1e3})
                rates["raw"].append(len(recorder.jobs) / raw())
                if args.split:
                    split = CohortSplit()
                    seconds, received, *_ = whole_run(
                        config, partition, "cohort", args.updates, free=split, accelerator=args.device
                    )
                    cohort_splits.setdefault((partition, config), []).append(split.split(seconds, received))
            fast, cohort, freem, rawm = (statistics.median(rates[k]) for k in ("fast", "cohort", "free", "raw"))
            pairs = [c / r for c, r in zip(rates["cohort"], rates["raw"])]
            vs_fast.append(cohort / fast)
            vs_raw[partition, config] = cohort / rawm
            floor[partition, config] = freem / rawm
            splits[partition, config] = {k: statistics.median(s[k] for s in shares) for k in shares[0]}
            # The compute floor: this run's FLOPs per update at the GEMM throughput of its mean cohort size (on the
            # CPU: the GEMM rate measured is a CPU's; on a GPU the floor is not measured, nan).
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                flops = flops_per_update(update, recorder.jobs[:50])
                k = max(1, round(np.mean(sizes)))
                rate_at.setdefault(k, gemm_throughput(k) if args.device == "cpu" else float("nan"))
            finally:
                torch.set_num_threads(threads)
            floor_ms = flops / rate_at[k] / 1e6
            compute[partition, config] = (1e3 / rawm, flops / 1e6, k, rate_at[k], floor_ms)
            ceiling[partition, config] = (1e3 / rawm) / (1e3 / freem + floor_ms)
            print(
                f"{config:<12}{partition:<11}{fast:>11.0f}{cohort:>13.0f}{freem:>11.0f}{rawm:>10.0f}"
                f"{cohort / fast:>11.2f}x{cohort / rawm:>10.2f}x{f'{min(pairs):.2f}-{max(pairs):.2f}':>11}"
                f"{freem / rawm:>6.1f}x{np.mean(sizes):>12.1f}"
            )
    print(
        "simulator floor: the free engine's ms per update and the shares of its run (median over repeats"
        + ("; on CUDA the shares' timers do not wait for the GPU: indicative only)" if args.device == "cuda" else ")")
    )
    print(f"{'run':<12}{'partition':<11}{'ms/update':>10}{'simulator':>10}{'server':>8}{'evaluation':>11}{'engine':>8}")
    for (partition, config), split in splits.items():
        print(
            f"{config:<12}{partition:<11}{split['ms']:>10.3f}{split['simulator']:>10.0%}{split['server']:>8.0%}"
            f"{split['evaluation']:>11.0%}{split['engine']:>8.0%}"
        )
    big = torch.randn(1024, 1024)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    large = _gflops(lambda: big @ big, 2.0 * 1024**3, repeats=10)
    torch.set_num_threads(threads)
    print(
        "compute floor: FLOPs per update (flop_counter over 50 recorded jobs: matmuls and convolutions, forward and "
        "backward) at the GEMM throughput of the mean cohort's stacked shapes (bmm, 1 thread); ceiling = raw ms / "
        f"(free ms + compute floor ms); large matmul (1024^3, 1 thread): {large:.1f} GFLOP/s"
    )
    print(
        f"{'run':<12}{'partition':<11}{'raw ms':>8}{'MFLOP':>7}{'jobs':>6}{'GFLOP/s':>9}{'floor ms':>10}{'ceiling':>9}"
    )
    for key, (raw_ms, mflop, k, rate, floor_ms) in compute.items():
        print(
            f"{key[1]:<12}{key[0]:<11}{raw_ms:>8.3f}{mflop:>7.2f}{k:>6}{rate:>9.1f}{floor_ms:>10.3f}"
            f"{ceiling[key]:>8.1f}x"
        )
    if cohort_splits:
        print("cohort split (--split): ms per update of a timed cohort run, median over repeats")
        names = list(next(iter(cohort_splits.values()))[0])
        print(f"{'run':<12}{'partition':<11}" + "".join(f"{name:>{max(len(name), 6) + 1}}" for name in names))
        for (partition, config), rows in cohort_splits.items():
            cells = "".join(f"{statistics.median(r[name] for r in rows):>{max(len(name), 6) + 1}.3f}" for name in names)
            print(f"{config:<12}{partition:<11}{cells}")
    print(f"cohort_vs_fast_min={min(vs_fast):.2f} cohort_vs_fast_max={max(vs_fast):.2f}")
    whole, floors, ceilings = {}, {}, {}
    for flight in (50, 10):
        for out, table in ((whole, vs_raw), (floors, floor), (ceilings, ceiling)):
            ratios = [r for (part, config), r in table.items() if part == "dirichlet" and IN_FLIGHT[config] == flight]
            out[flight] = f"{statistics.median(ratios):.2f}" if ratios else "nan"
    print(f"floor_vs_raw_whole_50={floors[50]} floor_vs_raw_whole_10={floors[10]}")
    print(f"ceiling_vs_raw_whole_50={ceilings[50]} ceiling_vs_raw_whole_10={ceilings[10]}")
    print(f"cohort_vs_raw_whole_50={whole[50]} cohort_vs_raw_whole_10={whole[10]}")


STEP_JOBS = (5, 10, 20, 50)


def batched_steps(args: argparse.Namespace) -> None:
    """``--step``: one batched step of the cohort engine (LeNet-5, digits, 10 samples per job, whole and padded
    batches) at 5, 10, 20 and 50 jobs, four ways, interleaved (see the module's docstring)."""
    from torch.func import grad_and_value, vmap

    from lit_asyncfl.engines import CohortEngine
    from lit_asyncfl.engines.cohort_kernels import BatchedKernels

    class ConvRouted(BatchedKernels):
        """The kernels before ``F.linear`` and ``F.cross_entropy`` were routed."""

        def _linear(self, *args: Any, **kwargs: Any) -> None:
            return None

        def _cross_entropy(self, *args: Any, **kwargs: Any) -> None:
            return None

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dm = DigitsDataModule(partition="iid", batch_size=10)
    dm.setup("fit")
    shards = dm.client_shards(args.clients, seed=0)
    engine = CohortEngine(LeNet5(lr=0.05), shards, 10)
    batched, start = engine.batched, engine.flat.read()
    inside = {
        False: vmap(grad_and_value(batched.loss, has_aux=True), in_dims=(0, 0, None), randomness="different"),
        True: vmap(grad_and_value(batched.padded_loss, has_aux=True), in_dims=(0, 0, 0, None), randomness="different"),
    }
    by_name = {
        False: vmap(batched.loss, in_dims=(0, 0, None), randomness="different"),
        True: vmap(batched.padded_loss, in_dims=(0, 0, 0, None), randomness="different"),
    }
    conv_routed = {  # the step recorded by vmap of functional_call, its parameters by name
        padded: batched._gradients(lambda params, *a, f=f: f(dict(zip(batched.names, params)), *a))
        for padded, f in by_name.items()
    }
    kernels, conv_kernels = batched.kernels, ConvRouted()
    print(
        f"one batched step, LeNet-5, digits, 10 samples per job, {args.threads} thread(s), {args.repeats} repeats, "
        "process time"
    )
    header = ("jobs", 4), ("batches", 8), ("grad in vmap ms", 16), ("vmap kernels ms", 16), ("conv routed ms", 15)
    print(" ".join(f"{text:>{width}}" for text, width in header), f"{'engine ms':>10} {'speedup':>8} {'vs conv':>8}")
    speedups, vs_conv = {}, {}
    for jobs in STEP_JOBS:
        weights = start + 0.01 * torch.randn(jobs, start.numel())
        batch = [shards.inputs[: jobs * 10].view(jobs, 10, 1, 8, 8), shards.targets[: jobs * 10].view(jobs, 10)]
        loss_weights = torch.full((jobs, 10), 0.1)
        for padded in (False, True):
            args_ = (batch, loss_weights, 0) if padded else (batch, 0)
            engine_step = batched.padded_step if padded else batched.step

            def before(p: dict[str, Tensor], *a: Any, padded: bool = padded) -> Any:
                return inside[padded](p, *a)

            def unrouted(p: dict[str, Tensor], *a: Any, step: Any = engine_step) -> Any:
                batched.kernels_off_because = "bench_engines --step: vmap's own kernels"
                try:
                    return step(p, *a)
                finally:
                    batched.kernels_off_because = None

            def previous(p: dict[str, Tensor], *a: Any, step: Any = conv_routed[padded]) -> Any:
                batched.kernels = conv_kernels
                try:
                    return step(p, *a)
                finally:
                    batched.kernels = kernels

            ways = {"before": before, "unrouted": unrouted, "previous": previous, "engine": engine_step}
            times: dict[str, list[float]] = {name: [] for name in ways}
            with OneDNN(engine.onednn), batched.stand_ins():
                for step in ways.values():
                    step(batched.params(weights), *args_)  # warm-up
                for _ in range(args.repeats):
                    for name, step in ways.items():
                        t0 = time.process_time()
                        for _ in range(5):
                            step(batched.params(weights), *args_)
                        times[name].append((time.process_time() - t0) / 5)
            med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
            speedups[(jobs, padded)] = med["before"] / med["engine"]
            vs_conv[(jobs, padded)] = med["previous"] / med["engine"]
            print(
                f"{jobs:>4} {'padded' if padded else 'whole':>8} {med['before']:>16.2f} {med['unrouted']:>16.2f} "
                f"{med['previous']:>15.2f} {med['engine']:>10.2f} {speedups[(jobs, padded)]:>7.2f}x "
                f"{vs_conv[(jobs, padded)]:>7.2f}x"
            )
    print(" ".join(f"step_speedup_{jobs}={speedups[(jobs, False)]:.2f}" for jobs in STEP_JOBS))
    print(" ".join(f"step_vs_conv_routed_{jobs}={vs_conv[(jobs, False)]:.2f}" for jobs in STEP_JOBS))


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
    parser.add_argument("--split", action="store_true", help="whole runs: also time where a cohort run's time goes")
    parser.add_argument("--step", action="store_true", help="time one batched cohort step three ways (see its doc)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the engines and the raw loop train (cuda: "
        "data and weights on the GPU, the raw loop too; the whole runs' compute floor is measured on the CPU only)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available here; use --device cpu")
    if args.device == "cuda" and (args.step or args.compile or args.split):
        parser.error("--step, --compile and --split time the CPU's work part by part: use them with --device cpu")
    if args.step:
        args.repeats = args.repeats or 9
        return batched_steps(args)
    if args.whole_runs:
        args.repeats = args.repeats or 3
        return whole_runs(args)  # each trainer sets its own thread count (1) and kernel choice
    args.repeats = args.repeats or 7
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    dm = DigitsDataModule(partition="iid", batch_size=args.batch_size)
    dm.setup("fit")
    device = torch.device(args.device)
    shards = dm.client_shards(args.clients, seed=0).to(device)
    model = LeNet5(lr=0.05)
    onednn = {"auto": None, "on": True, "off": False}[args.onednn]
    executors = {
        name: build_executor(name, model, shards, args.batch_size, device=device, onednn=onednn) for name in ENGINES
    }
    executors["cohort"].max_cohort = args.cohort
    engines = list(ENGINES)
    if args.compile:
        executors["cohort, compiled"] = build_executor("cohort", model, shards, args.batch_size, compile_cohort=True)
        executors["cohort, compiled"].max_cohort = args.cohort
        engines.append("cohort, compiled")
    kernels = executors["fast"].trainer.onednn  # the (automatic) choice, the same for every engine
    raw_model = LeNet5(lr=0.05).to(device)
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
                out = [
                    raw_update(raw_model, *sliced[j.client], start_views, j.seed, args.epochs, args.batch_size, 0.05)
                    for j in jobs
                ]
                _synchronize()
                return out

        return run

    def run_engine(name: str):
        executor = executors[name]

        def run():
            for j in jobs:  # all in flight at once; the cohort engine computes them max_cohort at a time
                executor.submit(j, start)
            out = [executor.result(j.job_id).weights for j in jobs]
            _synchronize()
            return out

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
        f"{_device_name(args.device)}: {len(jobs)} updates x {args.repeats} repeats, {samples:.1f} samples/client, "
        f"E={args.epochs}, "
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
