"""What the Ray executor buys: updates per wall second, sequential vs Ray workers, with identical final weights.

Two whole runs, each with the sequential executor and with Ray, measured in the same process one after the other.
Ray trains with ``--workers`` parallel trainers in two ways: ``--workers - 1`` workers plus the simulation's own
process (``train_locally=True``: on a machine whose cores the workers share with it, it keeps every core training
without oversubscribing them; the last line reports this one), and ``--workers`` workers (plus the simulation's
process, which then shares their cores). The workloads:

* ``heavy``: a compute-heavy offline workload — ``SimpleCNN`` (FedASMU's CNN) on CIFAR-shaped tensors generated here
  (3x32x32, 10 classes, each class a noisy pattern of its own), split over 20 clients by Dirichlet(0.5) label skew
  (unequal non-IID shards), FedAsync with 8 clients in flight; one client update takes a noticeable fraction of a
  second on a CPU core.
* ``heavy-fedasmu``: the same model, data and clients under FedASMU (8 in flight): every job asks the server for
  the fresh model mid-training, so on Ray it trains in parts: up to its request ahead; at the request event the
  merge, whose learning the simulation waits for; the rest of the job on the same worker meanwhile, waited for at
  its arrival.
* ``digits``: the quickstart (FedAsync, LeNet-5, 100 clients, Dirichlet(0.5) digits, 10 in flight), where one update
  takes about a millisecond: Ray's per-job overhead (shipping the job, a remote call, the result back) dominates.

Ray's workers are started (and warmed on a short run) before the timed runs, which then reuse them; the start-up is
reported apart (``ray_start_seconds``). The timed Ray run's wall time includes everything else.

    python scripts/bench_parallel.py                        # heavy and heavy-fedasmu, 3 repeats: ~15 min on 2 cores
    python scripts/bench_parallel.py --workload heavy --versions 200
    python scripts/bench_parallel.py --gpus-per-worker 0.5  # GPU workers (needs CUDA), two per GPU

For each Ray run it prints where the trainers' time went: the run's fixed costs (before the first job and after the
last update of the run's loop: building the run, the final evaluation and plots, when nothing can train in parallel,
and, for FedASMU, the rests of the jobs past their request that the end-of-run checkpoint waits for), this process's
time waiting for a worker's result, its other work per update (simulation, evaluations during the run, shipping,
receiving), the trainers' busy share of the rest, the workers' alone, and how long a job trained on a worker and
here on average; and a local step's CPU time (each trainer thread's own, so that waiting for a core does not
count; the merges of FedASMU's jobs apart, printed per merge) sequentially and on Ray, with the CPU time Ray's
processes used per update besides training (raylet, GCS, agents, the workers' task handling, idle workers). After
the limit (below) it prints how much more CPU time a step
took in the raw loops at once and in the Ray runs (``train_locally``): the part of the gap to the limit that is the
jobs computing slower side by side. The last lines are machine-readable, one per heavy workload (``heavy-fedasmu``
last): ``speedup=<Ray / sequential updates per second, median> limit=<this machine's limit> efficiency=<speedup / limit>
weights identical`` (or ``weights differ``), for the first Ray configuration (``train_locally``; with GPU workers,
the other one). The limit is measured in the same run, between the runs it is the reference of: ``--workers`` raw
PyTorch loops of the heavy workload's SGD step at once against one, each loop on the workload's data, measured before
each workload's first repeat and after each of its repeats (``--repeats`` + 1 measurements; the workload's limit is
their median; each workload also prints each repeat's speedup over the mean of the limits measured just before and
after it, which pairs a run with its moment's machine more closely than the medians do). Ray's idle processes are
running then, as during the runs (about 2-3% of one core, mostly the raylet). This VM's limit moved between 1.41x
and 1.97x within minutes on a quiet 27 November; a limit measured once, after every run, compared the runs with
another moment's machine.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import FedASMU, FedAsync
from lit_asyncfl.client.ray_executor import RayExecutor, release_workers
from lit_asyncfl.data import DigitsDataModule, PartitionedDataModule
from lit_asyncfl.models import LeNet5, SimpleCNN


class CifarShaped(L.LightningDataModule):
    """``n`` CIFAR-shaped images generated from a seed: class ``c`` is a fixed random pattern plus noise."""

    def __init__(self, n: int = 2000, seed: int = 0, batch_size: int = 10) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        patterns = torch.randn(10, 3, 32, 32, generator=g)
        self.y = torch.randint(0, 10, (n,), generator=g)
        self.x = patterns[self.y] + 1.5 * torch.randn(n, 3, 32, 32, generator=g)
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x[:500], self.y[:500]), batch_size=250)


def workload(name: str) -> dict[str, Any]:
    """The model, data and trainer settings of a workload."""
    if name in ("heavy", "heavy-fedasmu"):
        algorithm = (
            (lambda: FedAsync(concurrency=8))
            if name == "heavy"
            else (lambda: FedASMU(period=20.0, clients_per_trigger=8, max_parallel=8))
        )
        return {
            "model": lambda: SimpleCNN(in_channels=3, input_size=32, lr=0.01),
            "data": lambda: PartitionedDataModule(CifarShaped(), partition="dirichlet", alpha=0.5),
            "trainer": {"algorithm": algorithm, "num_clients": 20, "eval_every": 1000},
        }
    return {
        "model": lambda: LeNet5(input_size=8, lr=0.05),
        "data": lambda: DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10),
        "trainer": {"algorithm": lambda: FedAsync(alpha=0.6, a=0.5, concurrency=10), "num_clients": 100,
                    "eval_every": 1000},
    }  # fmt: skip


class Trace:
    """Records what the sequential executor is asked, in order, with the wall time of each job's training and of
    the simulation's own work between the calls: the run's schedule, replayed by :func:`ideal_wall`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, float, float]] = []  # (call, job id, arrival time, seconds)
        self._since = time.perf_counter()
        self.cpu_seconds = 0.0  # this thread's CPU time in the calls that train jobs, and their local steps
        self.steps = 0
        self.merge_cpu_seconds = 0.0  # of which in the jobs' merges (FedASMU's: they train no step), and how many
        self.merges = 0

    def __enter__(self) -> Trace:
        from lit_asyncfl.client.sequential import SequentialExecutor
        from lit_asyncfl.engines.base import LocalEngine

        self._fresh_model = fresh_model = LocalEngine.fresh_model

        def timed_fresh_model(engine: Any, *args: Any) -> None:
            cpu = time.thread_time()
            try:
                fresh_model(engine, *args)
            finally:
                trace.merge_cpu_seconds += time.thread_time() - cpu
                trace.merges += 1

        LocalEngine.fresh_model = timed_fresh_model
        self._saved = (
            SequentialExecutor.submit, SequentialExecutor.result, SequentialExecutor.cancel, SequentialExecutor.request,
        )  # fmt: skip
        submit, result, cancel, request = self._saved
        trace = self

        def between() -> float:  # the simulation's work since the last call
            now = time.perf_counter()
            gap, trace._since = now - trace._since, now
            return gap

        def traced_submit(executor: Any, job: Any, start: Any) -> None:
            trace.calls.append(("driver", -1, 0.0, between()))
            submit(executor, job, start)
            trace.calls.append(("submit", job.job_id, job.arrival_time, 0.0))
            trace._since = time.perf_counter()

        def traced_result(executor: Any, job_id: int, fresh: Any = None) -> Any:
            requested = job_id in executor._after  # (trained at its request event: nothing to train now)
            trace.calls.append(("driver", -1, 0.0, between()))
            cpu = time.thread_time()
            update = result(executor, job_id, fresh)
            trace.cpu_seconds += time.thread_time() - cpu
            trace.steps += update.num_steps
            trace.calls.append(("driver" if requested else "result", job_id, 0.0, between()))
            return update

        def traced_request(executor: Any, job_id: int, fresh: Any) -> None:  # (a whole job, as a result)
            trace.calls.append(("driver", -1, 0.0, between()))
            cpu = time.thread_time()
            request(executor, job_id, fresh)
            trace.cpu_seconds += time.thread_time() - cpu
            trace.calls.append(("result", job_id, 0.0, between()))

        def traced_cancel(executor: Any, job_id: int) -> None:
            cancel(executor, job_id)
            trace.calls.append(("cancel", job_id, 0.0, 0.0))

        SequentialExecutor.submit, SequentialExecutor.result, SequentialExecutor.cancel, SequentialExecutor.request = (
            traced_submit, traced_result, traced_cancel, traced_request,
        )  # fmt: skip
        return self

    def __exit__(self, *exc: Any) -> None:
        from lit_asyncfl.client.sequential import SequentialExecutor
        from lit_asyncfl.engines.base import LocalEngine

        LocalEngine.fresh_model = self._fresh_model
        (
            SequentialExecutor.submit, SequentialExecutor.result, SequentialExecutor.cancel, SequentialExecutor.request,
        ) = self._saved  # fmt: skip


def ideal_wall(trace: Trace, workers: int, window: int) -> float:
    """The traced part of the run's wall time with ``workers`` perfect workers: no shipping or start-up cost, each
    job trained as fast as sequentially, at most ``window`` results computed ahead (a job due now goes anyway), a
    free worker taking the job due first among those dispatched by then. What is left is the run's own limit: a job
    cannot start before its dispatch, and the simulation waits for the update due next."""
    clock, free = 0.0, [0.0] * workers
    cost = {job: seconds for call, job, _, seconds in trace.calls if call == "result"}
    queue: list[tuple[float, int, float]] = []  # dispatched jobs not started: (arrival, job id, dispatched at)
    finish: dict[int, float] = {}  # started jobs not consumed -> when they finish

    def take(until: float, needed: int | None = None) -> None:
        """Workers free by ``until`` take jobs; ``needed``: until that job has started, whatever ``until``."""
        while queue:
            w = min(range(workers), key=free.__getitem__)
            at = max(free[w], min(q[2] for q in queue))
            if (at > until or len(finish) >= window) and (needed is None or needed in finish):
                return
            job = min(q for q in queue if q[2] <= at)
            queue.remove(job)
            free[w] = finish[job[1]] = at + cost.get(job[1], 0.0)

    for call, job, arrival, seconds in trace.calls:
        if call == "driver":
            clock += seconds
        elif call == "submit":
            take(clock)
            queue.append((arrival, job, clock))
        elif call == "cancel":
            queue = [q for q in queue if q[1] != job]
            finish.pop(job, None)
        else:
            take(clock, needed=job)
            clock = max(clock, finish.pop(job))
    return clock


RAW_LOOP = """
import sys, time, torch
torch.set_num_threads(1)
sys.path.insert(0, {scripts!r})
from bench_parallel import CifarShaped
from lit_asyncfl.models import SimpleCNN
data = CifarShaped()  # the workload's data, built as the run builds it (see limit_pair)
model = SimpleCNN(in_channels=3, input_size=32, lr=0.01)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
order = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(0))
for step in range(20 + {steps}):
    if step == 20:
        start, cpu = time.perf_counter(), time.thread_time()
    i = order[(10 * step) % (len(order) - 10) :][:10]
    x, y = data.x[i], data.y[i]
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
print(time.perf_counter() - start, time.thread_time() - cpu)
"""


def limit_pair(processes: int, steps: int = 400) -> tuple[float, float]:
    """One measurement of this machine's own limit for ``processes`` parallel trainings: the heavy workload's SGD step
    in a raw PyTorch loop, one thread, run alone and then in ``processes`` processes at once (all at this process's
    priority, as the Ray workers since they run at their node's); returns their summed throughput over the lone one's
    (``processes`` on ideal cores; less where the cores share caches, memory bandwidth or a host) and how much more CPU
    time a step took in the loops at once than in the lone one (the ratio minus one: what sharing the machine costs a
    step's computation itself, apart from waiting for a core). :func:`main` takes these pairs between the runs they
    are the reference of: this VM's limit moved between 1.58x and 1.95x within minutes on a quiet afternoon (27
    November), so a limit measured after the runs measured another machine.

    Each loop builds the workload's data (:class:`CifarShaped`) and draws its batches from it, as the jobs do. That
    matters beyond the data: building it frees tens of MB of temporaries, which raises glibc's malloc threshold for
    mmap (it follows the largest freed block, up to 32 MiB), so a step's activations are then reused from the heap,
    not mapped afresh (page faults, pages zeroed) at every step. Every run's processes are in that state (their
    data, their evaluations); a loop of one fixed batch in a fresh process was not: there the same step took 7.3-7.8
    ms of CPU against 3.9-4.7 ms, and its page faults, which two processes take in parallel without sharing caches,
    read a limit of 1.77-2.00x against 1.67-1.77x for the step as the jobs run it (three alternating pairs each, 27
    November, quiet 2-core VM)."""
    import subprocess
    import sys

    def launch() -> subprocess.Popen:
        code = RAW_LOOP.format(steps=steps, scripts=str(Path(__file__).resolve().parent))
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    alone, alone_cpu = map(float, launch().communicate()[0].split())
    together = [launch() for _ in range(processes)]
    measured = [tuple(map(float, p.communicate()[0].split())) for p in together]
    return sum(alone / wall for wall, _ in measured), statistics.mean(cpu for _, cpu in measured) / alone_cpu - 1


def ray_cpu_seconds() -> float:
    """CPU seconds used so far by the Ray node this process started (raylet, GCS, agents) and every process they
    started (the workers, idle ones included); 0 where ``/proc`` cannot be read (not Linux)."""
    import os

    import ray

    try:
        node = ray._private.worker._global_node
        pids = {info.process.pid for infos in node.all_processes.values() for info in infos}
        parents, tick = {}, os.sysconf("SC_CLK_TCK")
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                    parents[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    except (AttributeError, OSError):
        return 0.0
    grown = True
    while grown:  # the descendants
        more = {pid for pid, (parent, _) in parents.items() if parent in pids} - pids
        pids |= more
        grown = bool(more)
    return sum(parents[pid][1] for pid in pids if pid in parents)


class Span:
    """When the run's first job was submitted and its last update received in the run's loop (outside: the run's fixed
    costs), the Ray node's CPU seconds at the first submit (:func:`ray_cpu_seconds`: after the workers built the
    run's engine), and the executor's statistics when the loop ended (``loop_stats``).

    The loop ends at the final evaluation. After it, writing the end-of-run checkpoint collects the updates of the
    jobs past their request (FedASMU's rests, which the sequential executor trained at their request events): those
    come after the final evaluation, so counting them as the last update put the final evaluation, when nothing
    trains in parallel, inside the middle of a FedASMU run (0.35-0.5 s of its 7-9 s, 27 November 2026) and not of a
    FedAsync one."""

    def __init__(self) -> None:
        self.first = self.last = None
        self.ray_cpu = 0.0
        self.ended = False
        self.loop_stats: dict[str, float] | None = None

    def __enter__(self) -> Span:
        self._saved = RayExecutor.submit, RayExecutor.result, RayExecutor.pause
        submit, result, pause = self._saved
        span = self

        def timed_submit(executor: Any, job: Any, start: Any) -> None:
            if span.first is None:
                span.ray_cpu = ray_cpu_seconds()
                span.first = time.perf_counter()
            submit(executor, job, start)

        def timed_result(executor: Any, job_id: int, fresh: Any = None) -> Any:
            update = result(executor, job_id, fresh)
            if not span.ended:
                span.last = time.perf_counter()
            return update

        def timed_pause(executor: Any, final: bool = False) -> Any:
            if final and not span.ended:  # (the loop is over: the final evaluation)
                span.ended, span.loop_stats = True, dict(executor.stats)
            return pause(executor, final)

        RayExecutor.submit, RayExecutor.result, RayExecutor.pause = timed_submit, timed_result, timed_pause
        return self

    def __exit__(self, *exc: Any) -> None:
        RayExecutor.submit, RayExecutor.result, RayExecutor.pause = self._saved


def fit(name: str, versions: int, executor: Any) -> tuple[float, int, torch.Tensor, dict[str, float]]:
    """One run: wall seconds, client updates received, final weights, and (Ray) the executor's statistics with the
    run's fixed costs (``fixed_seconds``: before the first job and after the last update)."""
    spec = workload(name)
    settings = {**spec["trainer"], "algorithm": spec["trainer"]["algorithm"]()}
    trainer = FederatedTrainer(
        **settings, max_versions=versions, seed=0, logger=False, enable_progress_bar=False, print_summary=False,
        default_root_dir=tempfile.mkdtemp(), checkpoint_every_seconds=None, executor=executor,
    )  # fmt: skip
    model = spec["model"]()
    # Each run starts with the garbage of the runs before it collected: else a full collection (0.28 s in this
    # process, whose heap holds ~530k objects: torch, Lightning, Ray) falls in whichever run crosses Python's
    # threshold, with the cyclic garbage of the earlier runs' plots (~12k objects a run; in a FedASMU Ray run on 28
    # November, 3.6% of its wall time, in its last plot).
    gc.collect()
    with Span() as span:
        start = time.perf_counter()
        trainer.fit(model, spec["data"]())
        end = time.perf_counter()
    if (trainer.stop_reason or "").startswith("interrupted"):  # (a signal stopped the run early: not a figure)
        raise SystemExit(f"{name}: the run was {trainer.stop_reason}; no figures from a cut run")
    weights = torch.cat([p.detach().flatten() for p in model.state_dict().values() if p.is_floating_point()])
    stats = dict(trainer.summary.get("executor", {}))
    # (the trainers' intra-op threads: the CPU time per step counts only the thread running a task)
    stats["threads"] = getattr(executor, "num_threads", None) or trainer.effective_num_threads
    if span.first is not None:
        stats["fixed_seconds"] = (span.first - start) + (end - span.last)
        stats["loop"] = span.loop_stats or dict(stats)  # (the executor's statistics at the loop's end)
        stats["ray_cpu_seconds"] = ray_cpu_seconds() - span.ray_cpu  # (from the first job; its training included)
    return end - start, trainer.summary["updates_received"], weights, stats


def cpu_per_step(stats: dict[str, float], trace: Trace, extra: list[float], ray_updates: int) -> None:
    """Print a Ray run's CPU time per local step against the sequential run's (``trace``) and append its extra share
    to ``extra``. The CPU times are ``time.thread_time()``, the thread that runs a task only: they mean something
    only with one intra-op thread on CPU workers (the caller prints this only then). The merges of jobs with a
    request (FedASMU's: two forward passes and a backward each, no step) are left out on both sides and printed apart:
    with ``train_locally`` this process computes most of them (from the state of the jobs parked on a busy worker),
    and counted in its steps they read as 25-30% slower steps here than on the workers (27 November 2026); the few
    merges computed on a worker stay in its CPU time (under 0.1 ms a step)."""
    here = stats["local_cpu_seconds"] - stats["merge_cpu_seconds"]
    cpu_step = (stats["worker_cpu_seconds"] + here) / max(stats["worker_steps"] + stats["local_steps"], 1)
    seq_step = (trace.cpu_seconds - trace.merge_cpu_seconds) / max(trace.steps, 1)
    extra.append(cpu_step / seq_step - 1)
    merges = stats["merges_here"] - stats["merges_from_state"]  # (each computed here; from the state, see below)
    print(
        f"    CPU time per local step: sequential {seq_step * 1e3:.2f} ms; Ray "
        f"{stats['worker_cpu_seconds'] / max(stats['worker_steps'], 1) * 1e3:.2f} ms on the workers"
        + (f", {here / stats['local_steps'] * 1e3:.2f} ms here" if stats["local_steps"] else "")
        + f" ({cpu_step / seq_step - 1:+.0%}: computing beside the other trainers, not counting waits for a core)"
        + (
            f"; merges apart: sequential {trace.merge_cpu_seconds / trace.merges * 1e3:.1f} ms of CPU each, here "
            f"{stats['merge_cpu_seconds'] / stats['merges_here'] * 1e3:.1f} ms ({stats['merges_here']} of them, "
            f"{stats['merges_from_state']} from a parked job's state, {merges} on this process's own engines)"
            if trace.merges and stats["merges_here"]
            else ""
        )
        + (
            "; from the first job on, Ray's processes besides training used "
            f"{(stats['ray_cpu_seconds'] - stats['worker_cpu_seconds']) / max(ray_updates, 1) * 1e3:.1f} "
            "ms of CPU per update (raylet, GCS, agents, the workers' task handling, idle workers)"
            if stats["ray_cpu_seconds"] > 0  # (0: not readable here)
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--workload", choices=("heavy", "heavy-fedasmu", "digits", "both", "all"), default="both",
        help="both: heavy and heavy-fedasmu; all: and digits",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="parallel trainers (the cores to use)")
    parser.add_argument(
        "--versions", type=int, default=400, help="global versions of the heavy run (its fixed costs, evaluations and "
        "plots, are paid once a run in this process: a short run measures them more than the executor)",
    )  # fmt: skip
    parser.add_argument("--digits-versions", type=int, default=1500, help="global versions of the digits run")
    parser.add_argument("--gpus-per-worker", type=float, default=0.0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="sequential and Ray runs alternate this many times per workload; the "
        "last line gives the median ratio (this shared 2-core VM's speed drifts by 10-15%% within minutes)",
    )  # fmt: skip
    args = parser.parse_args()
    import ray

    configurations = {  # (what is printed, the executor); the first is the one the last line reports
        f"Ray with {args.workers - 1} worker(s) + this process (train_locally)": lambda: RayExecutor(
            num_workers=args.workers - 1, num_gpus_per_worker=args.gpus_per_worker, train_locally=True
        ),
        f"Ray with {args.workers} workers": lambda: RayExecutor(
            num_workers=args.workers, num_gpus_per_worker=args.gpus_per_worker
        ),
    }
    if args.workers < 2 or args.gpus_per_worker > 0:  # (this process trains on the CPU: not with GPU workers)
        del configurations[next(iter(configurations))]
    start = time.perf_counter()
    # (a Ray of its own; the CPUs it counts let the idle workers of both configurations wait side by side: those of
    # train_locally run at this process's priority, the others below it, so they are not the same workers)
    ray.init(address="local", num_cpus=2 * args.workers - 1, include_dashboard=False, log_to_driver=False)
    for executor in configurations.values():  # starts the workers (they import torch and Lightning), kept
        fit("digits", 5, executor())
    print(f"ray_start_seconds={time.perf_counter() - start:.1f} (Ray and its workers, once per process)")
    names = {"both": ("heavy", "heavy-fedasmu"), "all": ("heavy", "heavy-fedasmu", "digits")}.get(
        args.workload, (args.workload,)
    )
    results: dict[str, tuple[list[float], bool]] = {}
    steps: dict[str, list[float]] = {name: [] for name in names}  # a step's extra CPU time on Ray (train_locally)
    pairs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}  # the limit, between the runs
    for name in names:
        versions = args.digits_versions if name == "digits" else args.versions
        pairs[name].append(limit_pair(args.workers))
        for repeat in range(args.repeats):  # sequential and Ray alternate: the machine's drift hits both alike
            with Trace() as trace:
                seq_wall, seq_updates, seq_weights, _ = fit(name, versions, "sequential")
            traced = sum(seconds for call, *_, seconds in trace.calls if call in ("driver", "result"))
            limit = seq_wall / (seq_wall - traced + ideal_wall(trace, args.workers, 4 * args.workers))
            seq_rate = seq_updates / seq_wall
            print(
                f"{name} #{repeat + 1}: {seq_updates} updates; sequential {seq_wall:.1f}s ({seq_rate:.1f} updates/s, "
                f"{seq_wall / max(seq_updates, 1) * 1e3:.1f} ms of wall time per update); this run's own limit "
                f"with {args.workers} perfect trainers {limit:.2f}x"
            )
            for index, (label, executor) in enumerate(configurations.items()):
                ray_wall, ray_updates, ray_weights, stats = fit(name, versions, executor())
                trained = stats["worker_seconds"] + stats["local_seconds"]
                identical = torch.equal(seq_weights, ray_weights) and seq_updates == ray_updates
                ray_rate = ray_updates / ray_wall
                ratios, all_identical = results.get(name, ([], True))  # (identical: every configuration's)
                results[name] = ([*ratios, ray_rate / seq_rate] if index == 0 else ratios, all_identical and identical)
                print(
                    f"  {label}: {ray_wall:.1f}s ({ray_rate:.1f} updates/s): {ray_rate / seq_rate:.2f}x, weights "
                    f"{'identical' if identical else 'DIFFER'}; trainers busy "
                    f"{trained / (ray_wall * args.workers):.0%} of the run, "
                    f"{trained / max(ray_updates, 1) * 1e3:.1f} ms of training per update"
                )
                loop = stats["loop"]  # (the middle's shares: up to the loop's end, the final evaluation)
                fixed, wait, local = stats["fixed_seconds"], loop["wait_seconds"], loop["local_seconds"]
                driver = ray_wall - fixed - wait - local
                middle = ray_wall - fixed
                print(
                    f"    where the time went: fixed costs {fixed:.1f}s ({fixed / ray_wall:.0%} of the run, no "
                    f"parallel training); between the first job and the last update of the run's loop ({middle:.1f}s) "
                    f"the trainers were busy {(loop['worker_seconds'] + local) / (middle * args.workers):.0%}; this "
                    f"process waited for a result {wait:.1f}s, trained {local:.1f}s and spent "
                    f"{driver / max(ray_updates, 1) * 1e3:.1f} ms per update on the rest (simulation, evaluations "
                    f"during the run, shipping, receiving); jobs computed here at their events: {stats['jobs_local']}"
                )
                remote, here = stats["jobs_remote"], stats["jobs_trained_locally"]
                workers = args.workers - 1 if "train_locally" in label else args.workers
                print(
                    f"    the workers were busy {loop['worker_seconds'] / (middle * workers):.0%} of those "
                    f"{middle:.1f}s; a job trained {stats['worker_seconds'] / max(remote, 1) * 1e3:.0f} ms on a "
                    f"worker ({remote} jobs)"
                    + (f", {stats['local_seconds'] / here * 1e3:.0f} ms here ({here} jobs)" if here else "")
                    + " on average"
                )
                if stats["threads"] == 1 and args.gpus_per_worker == 0:  # (thread_time: one thread, on CPUs)
                    cpu_per_step(stats, trace, steps[name] if index == 0 else [], ray_updates)
                if stats.get("request_seconds"):  # (jobs with a request: FedASMU)
                    print(
                        f"    at request events this process waited (or trained) {stats['request_seconds']:.1f}s in "
                        "all for the merges' learning; the rest of each job trained on its worker meanwhile"
                    )
            pairs[name].append(limit_pair(args.workers))  # (after the repeat's runs: before the next repeat's)
        ratios = sorted(results[name][0])
        listed = ", ".join(f"{r:.2f}x" for r in ratios)
        print(f"{name}, {next(iter(configurations))}: {listed}; median {statistics.median(ratios):.2f}x")
        print(
            f"{name}: this machine's own limit, measured before, between and after these runs: {args.workers} raw "
            f"PyTorch loops of the heavy workload's step at once train "
            + ", ".join(f"{ratio:.2f}x" for ratio, _ in pairs[name])
            + " one loop's steps per second; a step took "
            + ", ".join(f"{slower:+.0%}" for _, slower in pairs[name])
            + " CPU time in the loops at once"
        )
        limits = [ratio for ratio, _ in pairs[name]]  # each repeat against the limits just before and after it
        bracketed = [
            speedup / ((before + after) / 2)
            for speedup, before, after in zip(results[name][0], limits[:-1], limits[1:], strict=True)
        ]
        print(
            f"{name}: each repeat's speedup over the mean of the limits measured just before and after it: "
            + ", ".join(f"{e:.2f}" for e in bracketed)
            + f" (median {statistics.median(bracketed):.2f}; the last line divides the medians instead)"
        )
    release_workers()
    ray.shutdown()
    for name in names:
        if not steps[name]:  # (not measured: more than one intra-op thread, or GPU workers)
            continue
        slower = statistics.median(s for _, s in pairs[name])
        print(
            f"a local step of {name} took {statistics.median(steps[name]):+.0%} CPU time on Ray "
            f"({next(iter(configurations))}) against sequentially (median): beside the limit's {slower:+.0%} (median), "
            "what training at once costs the jobs themselves"
        )
    for name in names:  # (heavy-fedasmu last, with the default workloads)
        if name == "digits" and len(names) > 1:
            continue
        ratios, identical = results[name]
        speedup = statistics.median(ratios)
        limit = statistics.median(ratio for ratio, _ in pairs[name])
        print(
            f"speedup={speedup:.2f} limit={limit:.2f} efficiency={speedup / limit:.2f} weights "
            f"{'identical' if identical else 'differ'} ({name})"
        )


if __name__ == "__main__":
    main()
