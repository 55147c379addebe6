"""The Ray executor: jobs computed on Ray workers give exactly the sequential executor's weights.

Every test runs on one simulated two-node Ray cluster (``ray.cluster_utils.Cluster``, one CPU per node) started
once for the module; the workers are reused from run to run (``reuse_workers``), so a run costs a worker start only
once. Skipped where Ray is not installed (the ``ray`` extra; CI installs it).
"""

from __future__ import annotations

import copy
import os
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ray = pytest.importorskip("ray", reason="the Ray executor needs the ray extra: pip install 'lit-asyncfl[ray]'")

from conftest import global_weights, make_trainer  # noqa: E402

from lit_asyncfl.algorithms import ASFL, FedAsync, get_algorithm  # noqa: E402
from lit_asyncfl.callbacks import Callback  # noqa: E402
from lit_asyncfl.client.ray_executor import RayExecutor  # noqa: E402
from lit_asyncfl.core.simulator import ExecutorError  # noqa: E402
from lit_asyncfl.data import DigitsDataModule  # noqa: E402
from lit_asyncfl.executors.ray import pipe, placement, wire  # noqa: E402
from lit_asyncfl.executors.ray.wire import _Wire  # noqa: E402
from lit_asyncfl.mobility import MobileEdgeDevices  # noqa: E402
from lit_asyncfl.models import ClassificationModule, LeNet5  # noqa: E402
from lit_asyncfl.rl import FixedAction  # noqa: E402

PRESETS = ("fedasync", "fedbuff", "fedavg", "fedhist", "fedadt", "fedasmu", "asfl")


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine, one CPU each; the tests' module is importable on the workers."""
    from ray.cluster_utils import Cluster

    if ray.is_initialized():  # pragma: no cover (another module's Ray)
        ray.shutdown()
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    nodes.add_node(num_cpus=1)
    here = os.path.dirname(os.path.dirname(__file__))  # tests/: this module is executors.test_ray
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(address=nodes.address, runtime_env={"env_vars": {"PYTHONPATH": path}}, log_to_driver=False)
    nodes.wait_for_nodes()
    yield nodes
    from lit_asyncfl.client.ray_executor import release_workers

    release_workers()
    ray.shutdown()
    nodes.shutdown()


def fit(tmp_path, algorithm, executor=None, ckpt_path=None, model=None, **kwargs):
    """A LeNet-5 (or ``model``) run on digits, sequential unless an ``executor`` is given."""
    kwargs.setdefault("max_versions", 6)
    kwargs.setdefault("checkpoint_every_seconds", None)
    if executor is not None:
        kwargs["executor"] = executor
    trainer = make_trainer(tmp_path, get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm, **kwargs)
    trainer.fit(model if model is not None else LeNet5(lr=0.05), DigitsDataModule(), ckpt_path=ckpt_path)
    return trainer


def preset_run(tmp_path, preset, executor=None):
    if preset != "asfl":
        return fit(tmp_path, preset, executor)
    asfl = ASFL(controller=FixedAction(2, 1), selected=4, rounds=6, max_latency=300.0)
    return fit(tmp_path, asfl, executor, num_clients=12, device_model=MobileEdgeDevices())


@pytest.mark.parametrize("preset", PRESETS)
def test_ray_gives_the_sequential_weights_for_every_seed_algorithm(tmp_path, cluster, preset):
    sequential = preset_run(tmp_path / "seq", preset)
    on_ray = preset_run(tmp_path / "ray", preset, RayExecutor(num_workers=2))
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["versions"] == sequential.summary["versions"] == 6
    stats = on_ray.summary["executor"]
    jobs = stats["jobs_remote"] + stats["jobs_local"]
    assert jobs >= on_ray.summary["updates_received"] > 0
    assert stats["jobs_local"] == 0  # (FedASMU's jobs too: in two parts around their request, issue 30)


def test_the_lightning_engine_on_ray_gives_the_sequential_weights(tmp_path, cluster):
    sequential = fit(tmp_path / "seq", "fedasync", engine="lightning", max_versions=3)
    on_ray = fit(tmp_path / "ray", "fedasync", RayExecutor(num_workers=2), engine="lightning", max_versions=3)
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["executor"]["jobs_remote"] > 0


def test_the_workers_run_on_both_nodes_of_the_cluster(tmp_path, cluster):
    executor = RayExecutor(num_workers=2)
    trainer = fit(tmp_path, "fedbuff", executor)
    assert trainer.summary["executor"]["jobs_remote"] > 0
    executor.start(lambda device: None, torch.device("cpu"))  # the same (reused) workers, to ask where they run
    try:
        nodes = {node for node, _ in ray.get([w.where.remote() for w in executor.workers])}
    finally:
        executor.stop()
    assert nodes == {n["NodeID"] for n in ray.nodes() if n["Alive"]} and len(nodes) == 2


def test_workers_beside_a_training_simulation_run_at_its_priority_and_yield_to_it_otherwise(tmp_path, cluster):
    """Ray starts workers 15 below its node processes' priority (``nice``; here this process started them): with
    ``train_locally`` the workers are this process's peers (else a worker beside it loses the cores it shares);
    without, this process's work is the run's serial path and they keep Ray's default. The pools of idle workers
    are apart (a worker's priority cannot be raised again), and one makes room for the other on a full cluster."""

    def priorities(executor):
        executor.start(lambda device: None, torch.device("cpu"))
        try:
            pids = [pid for _, pid in ray.get([w.where.remote() for w in executor.workers])]
        finally:
            executor.stop()
        return [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids]

    here = os.getpriority(os.PRIO_PROCESS, 0)
    assert priorities(RayExecutor(num_workers=1, train_locally=True)) == [here]
    lower = priorities(RayExecutor(num_workers=2))  # (both CPUs of the cluster: the idle peer is ended first)
    assert len(lower) == 2 and all(p > here for p in lower)
    assert priorities(RayExecutor(num_workers=1, train_locally=True)) == [here]


@pytest.mark.parametrize(("first", "second"), [("ray", "ray"), ("ray", "sequential"), ("sequential", "ray")])
def test_a_run_resumes_exactly_across_executors(tmp_path, cluster, first, second):
    def executor(name):
        return RayExecutor(num_workers=2) if name == "ray" else "sequential"

    full = fit(tmp_path / "full", "fedbuff", max_versions=8)
    half = fit(tmp_path / "half", "fedbuff", executor(first), max_versions=4)
    assert half.simulator.in_flight  # jobs in flight at the checkpoint: resubmitted at the resume
    ckpt = next((tmp_path / "half").rglob("last.ckpt"))
    resumed = fit(tmp_path / "resumed", "fedbuff", executor(second), max_versions=8, ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert [r["accuracy"] for r in resumed.history] == [r["accuracy"] for r in full.history]


def test_at_most_max_ahead_results_wait_and_each_version_is_sent_inline_once_then_put_once(
    tmp_path, cluster, monkeypatch
):
    """Through Ray (no shared memory: workers on other nodes)."""
    monkeypatch.setattr(wire, "SHARED_MEMORY", None)
    executor = RayExecutor(num_workers=2, max_ahead=3)
    puts, inline = [], []
    real_put, real_inline = ray.put, placement._inline

    def counting_put(value, *args, **kwargs):
        puts.append(value)
        return real_put(value, *args, **kwargs)

    def counting_inline(tensors):
        inline.extend(t.clone() for t in tensors)
        return real_inline(tensors)

    ray.put, placement._inline = counting_put, counting_inline
    try:
        trainer = fit(tmp_path, "fedbuff", executor, num_clients=40, max_versions=4)  # 8 in flight, K = 10
    finally:
        ray.put, placement._inline = real_put, real_inline
    stats = trainer.summary["executor"]
    assert stats["max_results_waiting"] <= 3 + 1  # the window, plus a job needed before the window had room
    starts = [p.tensor() for p in puts if isinstance(p, _Wire)]  # (a start model travels as its bytes)

    def versions(tensors):
        return {(t.sum().item(), t.abs().sum().item()) for t in tensors}

    assert len(starts) == len(versions(starts)) and len(inline) == len(versions(inline))  # each at most once
    assert versions(starts) <= versions(inline)  # put only once a job started from it went inline
    assert 1 < len(starts) <= len(inline) <= trainer.summary["versions"] + 1 < stats["jobs_remote"]


def test_a_start_model_sent_inside_its_task_is_rebuilt_bit_for_bit():
    for size in (0, 1, 24_575, 24_576, 24_577, 300_001):  # (pieces of 96 KiB: 24576 float32)
        tensor = torch.randn(size)
        stand_ins, pieces = placement._inline([tensor])
        assert len(stand_ins) == 1 and len(pieces) == -(-size * 4 // wire.PIECE_BYTES)
        assert all(piece.nbytes <= wire.PIECE_BYTES for piece in pieces)
        back = wire._joined([*stand_ins, *pieces])
        assert back.dtype == tensor.dtype and torch.equal(back.view(torch.int32), tensor.view(torch.int32))
        tensor.zero_()  # (the arrays share the tensor's memory here) the rebuilt tensor is its own
        assert size < 2 or not torch.equal(back, tensor)


def test_tensors_sent_inside_a_task_in_pieces_are_rebuilt_bit_for_bit_and_too_many_bytes_go_whole(monkeypatch):
    """A merge's effects (the weights and the job-info tensors a rest's task carries) travel as stand-ins and pieces
    of at most 96 KiB, each tensor's own; over the inline budget each tensor goes whole (Ray's object store)."""
    tensors = [torch.randn(60_001), torch.arange(5), torch.randn(3, 2).to(torch.bfloat16), torch.empty(0, 4),
               torch.randn(24_576)]  # fmt: skip
    stand_ins, pieces = wire._inline(tensors)
    for piece in pieces:  # (as Ray hands them to the worker)
        piece.setflags(write=False)
    assert [s.count for s in stand_ins] == [3, 1, 1, 0, 1]  # (60_001 float32 in pieces of 24_576)
    assert all(piece.nbytes <= wire.PIECE_BYTES for piece in pieces) and len(pieces) == 6
    backs = [wire._resolved(s, pieces) for s in stand_ins]
    for back, tensor in zip(backs, tensors):
        assert back.dtype == tensor.dtype and back.shape == tensor.shape
        assert torch.equal(back.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))  # (bits)
    tensors[0].zero_()  # the rebuilt tensors are their own
    assert not torch.equal(backs[0], tensors[0])
    monkeypatch.setattr(wire, "INLINE_BYTES", 60_000 * 4)
    stand_ins, pieces = wire._inline(tensors)
    assert pieces == [] and all(isinstance(s, _Wire) for s in stand_ins)
    assert torch.equal(wire._resolved(stand_ins[4], pieces), tensors[4])


needs_shared_memory = pytest.mark.skipif(
    not os.path.isdir("/dev/shm"), reason="no shared memory (/dev/shm) here: tensors go through Ray"
)


@needs_shared_memory
def test_tensors_handed_over_in_shared_memory_are_read_bit_for_bit_and_their_files_removed_by_their_reader():
    tensors = [torch.randn(60_001), torch.arange(5), torch.randn(3, 2).to(torch.bfloat16), torch.empty(0, 4),
               torch.tensor(2.5, dtype=torch.float64), torch.tensor([True, False])]  # fmt: skip
    files = wire._SharedFiles.create()
    assert files is not None and os.path.isdir(files.directory)
    try:
        taken = [files.write(t, taken=True) for t in tensors]
        kept = files.write(tensors[0], taken=False)
        tensors[0].zero_()  # (written: a later change to the tensor is not read)
        assert all(isinstance(w, wire._Shared) for w in [*taken, kept])
        backs = [w.tensor() for w in taken]
        for back, tensor, w in zip(backs, tensors, taken):
            assert back.dtype == tensor.dtype and back.shape == tensor.shape
            assert not os.path.exists(w.path)  # (its reader removed it)
        for back, tensor in zip(backs[1:], tensors[1:]):
            assert torch.equal(back.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))  # (bits)
        assert not torch.equal(backs[0], tensors[0]) and backs[0].abs().sum() > 0
        first, second = kept.tensor(), kept.tensor()  # (a start model: read by several tasks, kept by its writer)
        assert torch.equal(first, backs[0]) and torch.equal(second, backs[0]) and os.path.exists(kept.path)
        first.zero_()  # each read is its own tensor
        assert torch.equal(second, backs[0])
        assert wire._SharedFiles.attach(files.at).directory == files.directory
        assert wire._SharedFiles.attach((files.directory, "another node's token")) is None
        assert wire._SharedFiles.attach(("/nonexistent/lit_asyncfl", files.token)) is None
        assert wire._SharedFiles.attach(None) is None
        dropped = files.write(tensors[1], taken=True)  # (a cancelled job's result: nobody reads it)
        wire._dropped([(object(), dropped, []), kept])
        assert not os.path.exists(dropped.path) and os.path.exists(kept.path)  # (only what its reader removes)
        kept.discard()
        assert os.listdir(files.directory) == ["token"]
        other = wire._SharedFiles.attach(files.at)  # (another process: its names never meet these)
        names = {files.write(tensors[1], taken=True).path for _ in range(3)}
        names |= {other.write(tensors[1], taken=True).path for _ in range(3)}
        assert len(names) == 6
    finally:
        files.remove()
    assert not os.path.exists(files.directory)
    fallback = files.write(tensors[2], taken=True)  # (the directory gone, or shared memory full: Ray's route)
    assert isinstance(fallback, _Wire) and files.full
    assert torch.equal(fallback.tensor().view(torch.int16), tensors[2].view(torch.int16))
    os.mkdir(files.directory)  # (writable again: the run's tensors keep Ray's route, not a failed write each)
    try:
        assert isinstance(files.write(tensors[1], taken=True), _Wire) and os.listdir(files.directory) == []
    finally:
        os.rmdir(files.directory)


@needs_shared_memory
def test_the_directory_a_killed_run_left_in_shared_memory_is_removed_by_the_next_run_not_a_live_run_s():
    import tempfile

    killed = tempfile.mkdtemp(prefix=wire._PREFIX, dir=wire.SHARED_MEMORY)  # (its token file no longer locked)
    for name in ("token", "1f2e-0"):
        with open(os.path.join(killed, name), "w") as file:
            file.write("x")
    live = wire._SharedFiles.create()
    try:
        assert not os.path.exists(killed)
        later = wire._SharedFiles.create()  # (another run while this one lives: its lock keeps its directory)
        assert os.path.exists(live.directory) and later.directory != live.directory
        later.remove()
    finally:
        live.remove()
    assert not os.path.exists(live.directory)


def shared_paths(value):
    """The paths of the files in shared memory a task's result holds."""
    if isinstance(value, wire._Shared):
        return {value.path}
    if isinstance(value, (list, tuple)):
        return set().union(*map(shared_paths, value)) if value else set()
    weights = getattr(value, "weights", None)  # (a job's state at its request)
    return shared_paths(weights) if weights is not None else set()


def run_files(executor_type, monkeypatch):
    """Record, for a run, the files this process writes in shared memory (``written``: taken, and the tensor) and,
    when the executor stops, after the tasks still on workers have finished, the files left in the run's directory
    (``left``) and those among them that nobody would read or remove (``orphans``: neither the token, nor a start
    model still held, nor a result of those tasks)."""
    seen = {"written": [], "left": None, "orphans": None, "directory": None}
    real_write, real_stop = wire._SharedFiles.write, executor_type.stop

    def write(files, tensor, taken):
        seen["written"].append((taken, tensor.clone()))
        return real_write(files, tensor, taken)

    def stop(executor):
        if executor._files is not None and seen["left"] is None:
            refs = list(executor._running)  # (Ray's, and tasks through the workers' sockets: pipe._Call)
            calls = [ref for ref in refs if isinstance(ref, pipe._Call)]
            while not all(call.done for call in calls):
                pipe._finished(calls, block=True)
            rays = [ref for ref in refs if not isinstance(ref, pipe._Call)]
            ray.wait(rays, num_returns=len(rays), timeout=60)
            results = set()
            for ref in refs:
                try:
                    value = ref.result()[0] if isinstance(ref, pipe._Call) else ray.get(ref)[0]
                except Exception:  # (a task that raised wrote nothing)
                    continue
                results |= shared_paths(value)
            seen["directory"] = directory = executor._files.directory
            seen["left"] = sorted(os.listdir(directory))
            held = {os.path.join(directory, "token")} | {f.path for f in executor._shared_starts.values()}
            held |= set(executor._sockets.values())  # (the workers' sockets, removed with the directory)
            seen["orphans"] = {os.path.join(directory, n) for n in seen["left"]} - held - results
        return real_stop(executor)

    monkeypatch.setattr(wire._SharedFiles, "write", write)
    monkeypatch.setattr(executor_type, "stop", stop)
    return seen


@needs_shared_memory
@pytest.mark.parametrize("preset", ["fedbuff", "asfl"])
def test_workers_on_this_machine_get_each_start_model_once_through_shared_memory_and_no_file_is_left(
    tmp_path, cluster, monkeypatch, preset
):
    """Both nodes of the test cluster run on this machine: after their engine is built, their tasks' start models
    are files in shared memory, each version written once for every job starting from it; the tensors that go to a
    worker to be read once and the workers' results are removed by their readers, those of cancelled jobs (ASFL
    cancels jobs) when they arrive, so at the run's end only the start models still held and the results of the
    tasks still on workers are left, and the run's directory goes with the run."""
    seen = run_files(RayExecutor, monkeypatch)
    sequential = preset_run(tmp_path / "seq", preset)
    trainer = preset_run(tmp_path / "ray", preset, RayExecutor(num_workers=2))
    assert torch.equal(global_weights(trainer), global_weights(sequential))
    starts = [tensor for taken, tensor in seen["written"] if not taken]
    versions = {(t.sum().item(), t.abs().sum().item()) for t in starts}
    assert 1 < len(starts) == len(versions) < trainer.summary["executor"]["jobs_remote"]  # each once, jobs share
    assert seen["orphans"] == set() and "token" in seen["left"]
    assert not os.path.exists(seen["directory"])


@needs_shared_memory
def test_workers_that_do_not_see_the_run_s_shared_memory_get_their_tensors_through_ray(tmp_path, cluster, monkeypatch):
    """A worker on another machine does not find the run's directory with its token: it says so when its engine is
    built, and its tasks' tensors (start models, merges, results) keep Ray's routes, with the same weights."""
    real_create = wire._SharedFiles.create.__func__

    def elsewhere(cls):  # (the directory the workers are told of holds another token: as on another machine)
        files = real_create(cls)
        with open(os.path.join(files.directory, "token"), "w") as file:
            file.write("another machine's")
        return files

    monkeypatch.setattr(wire._SharedFiles, "create", classmethod(elsewhere))
    seen = run_files(RayExecutor, monkeypatch)
    kwargs, model = {"max_versions": 12}, BatchNormCNN()
    sequential = fit(tmp_path / "seq", merging_fedasmu(), model=copy.deepcopy(model), **kwargs)
    on_ray = fit(tmp_path / "ray", merging_fedasmu(), RayExecutor(num_workers=2), model=model, **kwargs)
    assert seen["written"] == [] and seen["left"] == ["token"]
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


class RemoveTheSharedFiles(Callback):
    """At an event, removes every file of the run's shared-memory directory but its token (as systemd-logind's
    ``RemoveIPC=yes`` does to a user's files at logout)."""

    def __init__(self, executor, at_event):
        self.executor, self.at_event, self.removed = executor, at_event, 0

    def on_event_end(self, trainer):
        files = self.executor._files
        if trainer.simulator.events_processed == self.at_event and files is not None:
            for name in os.listdir(files.directory):
                if name != "token":
                    os.unlink(os.path.join(files.directory, name))
                    self.removed += 1


@needs_shared_memory
def test_files_removed_from_shared_memory_during_a_run_are_computed_again_through_ray_with_the_same_weights(
    tmp_path, cluster
):
    """The tasks that were to read a removed file (a start model, a merge's effects, a result) start over from what
    this process holds, through Ray from then on: same weights, nothing lost."""
    kwargs, model = {"max_versions": 12}, BatchNormCNN()
    sequential = fit(tmp_path / "seq", merging_fedasmu(), model=copy.deepcopy(model), **kwargs)
    executor = RayExecutor(num_workers=2)
    remove = RemoveTheSharedFiles(executor, at_event=12)
    on_ray = fit(tmp_path / "ray", merging_fedasmu(), executor, model=model, callbacks=[remove], **kwargs)
    assert remove.removed > 0 and on_ray.summary["executor"]["jobs_recomputed"] > 0
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


class SlowLeNet(LeNet5):
    """LeNet-5 whose steps take a while, so that a worker killed mid-run has jobs queued or running."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


class KillAWorker(Callback):
    def __init__(self, executor, at_event):
        self.executor, self.at_event, self.killed = executor, at_event, 0

    def on_event_end(self, trainer):
        if trainer.simulator.events_processed == self.at_event:
            ray.kill(self.executor.workers[0], no_restart=True)
            self.killed += 1


def test_a_killed_worker_is_replaced_and_its_jobs_recomputed_with_the_same_result(tmp_path, cluster):
    def slow(seed=0):
        torch.manual_seed(seed)
        return SlowLeNet(lr=0.05)

    sequential = fit(tmp_path / "seq", "fedbuff", model=slow(), num_clients=40, max_versions=2)
    executor = RayExecutor(num_workers=2, max_ahead=8)  # 8 in flight: about 4 queued on each worker
    kill = KillAWorker(executor, at_event=3)
    on_ray = fit(tmp_path / "ray", "fedbuff", executor, model=slow(), num_clients=40, max_versions=2, callbacks=[kill])
    assert kill.killed == 1
    stats = on_ray.summary["executor"]
    assert stats["worker_restarts"] == 1 and stats["jobs_recomputed"] >= 2  # one replacement for all its jobs
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


@pytest.mark.parametrize("at_event", [6, 20])
def test_a_killed_worker_with_fedasmu_jobs_parked_on_it_is_replaced_with_the_same_result(tmp_path, cluster, at_event):
    """Jobs parked at their request, their merges on the worker that died or learned here and their rests waiting
    for it: merged again from the start elsewhere, or trained again whole with the same answer, their merges not
    learned twice."""

    def slow(seed=0):
        torch.manual_seed(seed)
        return SlowLeNet(lr=0.05)

    sequential = fit(tmp_path / "seq", merging_fedasmu(), model=slow(), max_versions=20)
    executor = RayExecutor(num_workers=2)
    kill = KillAWorker(executor, at_event=at_event)
    on_ray = fit(tmp_path / "ray", merging_fedasmu(), executor, model=slow(), max_versions=20, callbacks=[kill])
    stats = on_ray.summary["executor"]
    assert kill.killed == 1 and stats["worker_restarts"] == 1 and stats["jobs_recomputed"] > 0
    assert stats["merges_here"] + stats["merges_on_workers"] == 13
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


def test_the_cohort_engine_on_ray_is_deterministic_and_agrees_with_the_sequential_cohort(tmp_path, cluster):
    def cohort_run(name, executor):
        return fit(tmp_path / name, "fedbuff", executor, engine="cohort", num_clients=20, max_versions=6)

    sequential = cohort_run("seq", None)
    a = cohort_run("a", RayExecutor(num_workers=2, cohort_size=4))
    b = cohort_run("b", RayExecutor(num_workers=2, cohort_size=4))
    assert torch.equal(global_weights(a), global_weights(b))
    torch.testing.assert_close(global_weights(a), global_weights(sequential), rtol=0, atol=1e-5)
    assert a.summary["executor"]["jobs_remote"] > 0


def test_a_job_that_raises_on_a_worker_fails_the_run_as_sequentially(tmp_path, cluster):
    from lit_asyncfl.core.simulator import ClientJobError

    with pytest.raises(ClientJobError, match=r"raised ValueError: broken on a worker") as caught:
        fit(tmp_path, "fedasync", RayExecutor(num_workers=2), model=BrokenOnWorkers(os.getpid()))
    assert isinstance(caught.value.__cause__, ValueError)  # the job's own exception, not Ray's wrapper


class BrokenOnWorkers(LeNet5):
    """Trains in this process (the fit-start probe passes) and raises in any other."""

    def __init__(self, driver_pid):
        super().__init__()
        self.driver_pid = driver_pid

    def training_step(self, batch, batch_idx):
        if os.getpid() != self.driver_pid:
            raise ValueError("broken on a worker")
        return super().training_step(batch, batch_idx)


class UnbuildableOnWorkers(LeNet5):
    """A module that unpickles in this process only (as one whose class a worker cannot import)."""

    def __init__(self, driver_pid):
        super().__init__()
        self.driver_pid = driver_pid

    def __setstate__(self, state):
        if os.getpid() != state["driver_pid"]:
            raise ImportError("no module named 'my_private_models'")
        super().__setstate__(state)


def test_an_engine_that_cannot_be_built_on_a_worker_fails_naming_the_cause(tmp_path, cluster):
    with pytest.raises(RuntimeError, match=r"(?s)building the engine on a Ray worker failed: .*my_private_models"):
        fit(tmp_path, "fedasync", RayExecutor(num_workers=2), model=UnbuildableOnWorkers(os.getpid()))


def test_an_engine_that_cannot_be_built_stops_the_run_even_where_failing_jobs_are_dropped(tmp_path, cluster):
    # Without validation data the build is first checked when a job's result is read: the failure is the executor's
    # (ExecutorError), raised as it is, not a job error that on_client_error="drop" would drop (the run then waited
    # forever on a stopped executor).
    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(200, 1, 8, 8, generator=g), torch.randint(0, 10, (200,), generator=g)),
                      batch_size=10)  # fmt: skip
    trainer = make_trainer(tmp_path, get_algorithm("fedasync"), executor=RayExecutor(num_workers=2),
                           on_client_error="drop", max_versions=6, checkpoint_every_seconds=None)  # fmt: skip
    with pytest.raises(ExecutorError, match=r"(?s)building the engine on a Ray worker failed: .*my_private_models"):
        trainer.fit(UnbuildableOnWorkers(os.getpid()), train_dataloaders=data)
    assert sum(trainer.simulator.dropped.values()) == 0  # (no job was blamed for it)


class BuiltOnceAFileExists(LeNet5):
    """A module that unpickles on a worker only once ``path`` exists (a minute at most)."""

    def __init__(self, driver_pid, path):
        super().__init__()
        self.driver_pid, self.path = driver_pid, path

    def __setstate__(self, state):
        deadline = time.monotonic() + 60
        while os.getpid() != state["driver_pid"] and not os.path.exists(state["path"]):
            if time.monotonic() > deadline:
                raise TimeoutError("the run waited for the engine's build on the workers")
            time.sleep(0.01)
        super().__setstate__(state)


class CreateAFile(Callback):
    def __init__(self, path):
        self.path = path

    def on_fit_start(self, trainer):
        open(self.path, "w").close()


def test_the_run_goes_on_while_the_workers_build_their_engine(tmp_path, cluster):
    """The simulation builds the run, dispatches the first jobs and evaluates the initial model while the workers
    build the engine (here: only once ``on_fit_start``, after the executor's start, lets them)."""
    model = BuiltOnceAFileExists(os.getpid(), str(tmp_path / "go"))
    sequential = fit(tmp_path / "seq", "fedasync", model=copy.deepcopy(model))
    on_ray = fit(tmp_path / "ray", "fedasync", RayExecutor(num_workers=2), model=model,
                 callbacks=[CreateAFile(str(tmp_path / "go"))])  # fmt: skip
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["executor"]["jobs_remote"] > 0


class WatchTheWorkers(Callback):
    """Records, after every event, the most tasks placed on one worker and the results waiting to be consumed."""

    def __init__(self, executor):
        self.executor, self.most_placed, self.most_waiting = executor, 0, 0

    def on_event_end(self, trainer):
        self.most_placed = max(self.most_placed, *self.executor._busy)
        self.most_waiting = max(self.most_waiting, len(self.executor._shipped))


def test_each_worker_holds_at_most_two_tasks_and_the_rest_wait_here(tmp_path, cluster):
    from lit_asyncfl.client.ray_executor import TASKS_PER_WORKER

    executor = RayExecutor(num_workers=2, max_ahead=8)
    executor.pause = None  # (no pause at evaluations: see the next test)
    watch = WatchTheWorkers(executor)
    trainer = fit(tmp_path, "fedbuff", executor, num_clients=40, max_versions=3, callbacks=[watch])
    assert TASKS_PER_WORKER == 2 and watch.most_placed == 2  # 8 shipped jobs, at most 2 on each worker
    assert watch.most_waiting > 4  # so some waited in this process
    stats = trainer.summary["executor"]
    assert 0 < stats["worker_seconds"] < trainer.summary["wall_seconds"] * 2


class WatchTheFirstEvaluation(Callback):
    """Records the tasks placed on each worker and the shipped jobs when the initial model's evaluation ends."""

    def __init__(self, executor):
        self.executor, self.placed, self.shipped = executor, None, None

    def on_evaluation_end(self, trainer, row):
        if self.placed is None:
            self.placed, self.shipped = list(self.executor._busy), len(self.executor._shipped)


def test_workers_get_every_shipped_job_before_the_first_evaluation(tmp_path, cluster):
    """This process evaluates the initial model after the first dispatches; only it gives the workers tasks, so
    before that evaluation (whose length is not known yet) they get every shipped job instead of two each."""
    executor = RayExecutor(num_workers=2, max_ahead=8)
    watch = WatchTheFirstEvaluation(executor)
    sequential = fit(tmp_path / "seq", "fedbuff", num_clients=40, max_versions=3)
    trainer = fit(tmp_path / "ray", "fedbuff", executor, num_clients=40, max_versions=3, callbacks=[watch])
    assert watch.shipped == 8 and sum(watch.placed) == 8 and max(watch.placed) > 2  # (without the pause: 2 + 2)
    assert torch.equal(global_weights(trainer), global_weights(sequential))


def test_the_worker_has_enough_to_train_while_this_process_trains(tmp_path, cluster):
    """With ``train_locally``, before this process trains a task, the worker gets tasks queued behind the one it
    trains for at least as many local steps (at the measured paces; here taken as equal), where enough wait: two
    tasks alone may be shorter (clients of unequal sizes)."""
    from lit_asyncfl.executors.ray.placement import _steps

    executor = RayExecutor(num_workers=1, train_locally=True, max_ahead=8)
    seen = []
    train_here = executor._train_here

    def watched(task):
        others = sum(_steps(entry[2]) for entry in executor._waiting)
        seen.append((_steps(task), executor._queued_steps(0), others, executor._busy[0]))
        train_here(task)

    executor._train_here = watched
    executor._pace_ratio = lambda: 1.0
    executor.pause = None  # (which gives the worker every waiting task: see the test above)

    def run(name, executor=None):
        trainer = make_trainer(tmp_path / name, FedAsync(concurrency=8), max_versions=20, num_clients=20,
                               checkpoint_every_seconds=None, executor=executor or "sequential")  # fmt: skip
        trainer.fit(LeNet5(lr=0.05), DigitsDataModule(partition="dirichlet", alpha=0.5, batch_size=10))
        return trainer

    sequential, trainer = run("seq"), run("ray", executor)
    assert seen and all(queued >= steps or waiting == 0 for steps, queued, waiting, _ in seen)
    assert any(placed > 2 for *_, placed in seen)  # (more than TASKS_PER_WORKER: the reserve placed them)
    assert torch.equal(global_weights(trainer), global_weights(sequential))


class DtypeSensitiveLeNet(LeNet5):
    """Adds k * sum(weights) to its loss, k = (torch.tensor(0.1).item() - 0.1) * 1e6: 0 when the default dtype is
    float64, 1.5e-3 when it is float32 (the model and data stay float32 either way)."""

    def training_step(self, batch, batch_idx):
        k = (torch.tensor(0.1).item() - 0.1) * 1e6
        return super().training_step(batch, batch_idx) + k * sum(p.sum() for p in self.parameters())


def test_workers_train_with_this_process_default_dtype(tmp_path, cluster):
    def run(name, executor):
        torch.manual_seed(0)
        model = DtypeSensitiveLeNet(lr=0.05)  # (float32)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return fit(tmp_path / name, "fedasync", executor, model=model, max_versions=4)
        finally:
            torch.set_default_dtype(previous)

    sequential, on_ray = run("seq", None), run("ray", RayExecutor(num_workers=2))
    assert torch.equal(global_weights(on_ray), global_weights(sequential))  # (float32 workers' steps differ)


class DrawAtEveryEvent(Callback):
    """Draws from this process's global generators (torch, NumPy, Python) after every event, as user code may."""

    def __init__(self):
        self.draws = []

    def on_event_end(self, trainer):
        import random

        import numpy as np

        self.draws.append((torch.rand(1).item(), np.random.rand(), random.random()))


@pytest.mark.parametrize("algorithm", ["fedasync", "fedbuff"])
def test_training_locally_gives_the_sequential_weights_and_user_code_draws_alike_under_every_executor(
    tmp_path, cluster, algorithm
):
    watch = DrawAtEveryEvent()
    sequential = fit(tmp_path / "seq", algorithm, num_clients=40, max_versions=20, callbacks=[watch])
    draws = {"sequential": watch.draws}
    for name, executor in [("workers", RayExecutor(num_workers=2)), ("local", RayExecutor(1, train_locally=True))]:
        watch = DrawAtEveryEvent()
        on_ray = fit(tmp_path / name, algorithm, executor, num_clients=40, max_versions=20, callbacks=[watch])
        assert torch.equal(global_weights(on_ray), global_weights(sequential))
        draws[name] = watch.draws
    stats = on_ray.summary["executor"]
    assert stats["jobs_trained_locally"] > 0 and stats["jobs_remote"] > 0 and stats["local_seconds"] > 0
    assert stats["jobs_trained_locally"] + stats["jobs_remote"] >= on_ray.summary["updates_received"]
    # a job seeds the generators it trains with: here they are restored, so user code drawing from them in this
    # process sees what it sees when every job trains on a worker, whenever the jobs trained here ran
    assert len(draws["local"]) > 10 and draws["local"] == draws["workers"] == draws["sequential"]


def test_training_locally_keeps_the_cohorts_their_results_and_this_process_onednn_setting(tmp_path, cluster):
    def cohort_run(name, executor):
        return fit(tmp_path / name, "fedbuff", executor, engine="cohort", num_clients=40, max_versions=15)

    torch.backends.mkldnn.enabled = False  # set by the user: the workers and the jobs trained here take it over
    try:
        on_workers = cohort_run("workers", RayExecutor(num_workers=2, cohort_size=4))
        mixed = cohort_run("mixed", RayExecutor(num_workers=1, cohort_size=4, train_locally=True))
    finally:
        torch.backends.mkldnn.enabled = True
    assert torch.equal(global_weights(mixed), global_weights(on_workers))
    assert mixed.summary["executor"]["jobs_trained_locally"] > 0


def test_the_cohort_and_fedasmu_executors_leave_this_process_generators(tmp_path, cluster):
    for name, algorithm, kwargs in [("cohort", "fedbuff", {"engine": "cohort"}), ("fedasmu", "fedasmu", {})]:
        draws = []
        for executor in (None, RayExecutor(num_workers=2)):
            watch = DrawAtEveryEvent()
            fit(tmp_path / f"{name}-{executor is None}", algorithm, executor, callbacks=[watch], **kwargs)
            draws.append(watch.draws)
        assert len(draws[0]) > 5 and draws[0] == draws[1], name


class CountsItsEvaluations(LeNet5):
    """A module whose training depends on state its hooks change on the global model: a job must train from the
    module as it was when the run started, wherever it trains."""

    def __init__(self):
        super().__init__(lr=0.05)
        self.evaluations = 0

    def on_validation_epoch_end(self):
        self.evaluations += 1

    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx) * (1 + self.evaluations)


@pytest.mark.parametrize("algorithm", ["fedasync", "fedasmu"])
def test_jobs_trained_here_start_from_the_module_the_run_started_with(tmp_path, cluster, algorithm):
    def run(name, executor):
        torch.manual_seed(0)
        return fit(tmp_path / name, algorithm, executor, model=CountsItsEvaluations(), num_clients=40,
                   max_versions=10, eval_every=2)  # fmt: skip

    sequential = run("seq", None)
    executor = RayExecutor(num_workers=1, train_locally=True)
    here = run("here", executor)
    assert torch.equal(global_weights(here), global_weights(sequential))
    assert executor.stats["jobs_trained_locally"] > 0


class RaisesOnSomeBatches(LeNet5):
    """Raises (with gradients on: the fit-start probe passes) when a job's first batch starts with a 7: the same
    jobs fail wherever they train."""

    def training_step(self, batch, batch_idx):
        if torch.is_grad_enabled() and batch_idx == 0 and int(batch[1][0]) == 7:
            raise ValueError("a 7 first")
        return super().training_step(batch, batch_idx)


def test_jobs_that_raise_while_trained_here_are_dropped_as_sequentially(tmp_path, cluster):
    def run(name, executor):
        torch.manual_seed(0)
        return fit(tmp_path / name, "fedasync", executor, model=RaisesOnSomeBatches(lr=0.05), num_clients=40,
                   max_versions=20, on_client_error="drop")  # fmt: skip

    sequential = run("seq", None)
    executor = RayExecutor(num_workers=1, train_locally=True)
    here = run("here", executor)
    dropped = sequential.summary["drop_reasons"]["client_error"]
    assert dropped > 0 and here.summary["drop_reasons"]["client_error"] == dropped
    assert torch.equal(global_weights(here), global_weights(sequential))
    assert executor.stats["jobs_trained_locally"] > 0


def test_a_tensor_travels_to_and_from_workers_bit_for_bit_in_every_dtype():
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64):
        tensor = (torch.randn(2, 3, 5) * 1e3).to(dtype)
        if dtype.is_floating_point:
            tensor.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=dtype)
        bits = tensor.reshape(-1).view(torch.uint8).clone()
        wire = _Wire.of(tensor)
        assert wire.data.dtype == "uint8" and wire.data.nbytes == tensor.numel() * tensor.element_size()
        back = wire.tensor()
        assert back.dtype == dtype and back.shape == tensor.shape
        assert torch.equal(back.reshape(-1).view(torch.uint8), bits)  # the same bits (NaN, inf, -0.0 too)
        wire.data[:] = 0  # (as the object store's buffer is reused) the received tensor is its own copy
        assert torch.equal(back.reshape(-1).view(torch.uint8), bits)
    empty = _Wire.of(torch.empty(0, 3, dtype=torch.bfloat16)).tensor()
    assert empty.shape == (0, 3) and empty.dtype == torch.bfloat16
    transposed = torch.arange(6.0).reshape(2, 3).t()  # (not contiguous)
    assert torch.equal(_Wire.of(transposed).tensor(), transposed)


def test_training_locally_beside_gpu_workers_is_refused_on_a_cpu_run(tmp_path, cluster):
    executor = RayExecutor(num_workers=1, num_gpus_per_worker=0.5, train_locally=True)
    with pytest.raises(ValueError, match=r"train_locally=True trains jobs on this process's device \(cpu\) and the "
                       r"workers train on cuda.*set train_locally=False"):  # fmt: skip
        fit(tmp_path, "fedasync", executor)


class BrokenHere(LeNet5):
    """Trains on the workers and raises in this process's training (its fit-start probe, without gradients, passes)."""

    def __init__(self, driver_pid):
        super().__init__()
        self.driver_pid = driver_pid

    def training_step(self, batch, batch_idx):
        if os.getpid() == self.driver_pid and torch.is_grad_enabled():
            raise ValueError("broken here")
        return super().training_step(batch, batch_idx)


def test_a_job_that_raises_while_trained_locally_fails_the_run_as_sequentially(tmp_path, cluster):
    from lit_asyncfl.core.simulator import ClientJobError

    executor = RayExecutor(num_workers=1, train_locally=True)
    with pytest.raises(ClientJobError, match=r"raised ValueError: broken here") as caught:
        fit(tmp_path, "fedasync", executor, model=BrokenHere(os.getpid()), num_clients=40, max_versions=20)
    assert isinstance(caught.value.__cause__, ValueError)


@pytest.mark.parametrize("executor", ["workers", "here"])
def test_a_fedasmu_job_failing_after_its_merge_fails_at_its_arrival_as_sequentially(
    tmp_path, cluster, monkeypatch, executor
):
    """On Ray the merge's learning comes back while the rest of the job trains on its worker (or here, with
    ``train_locally``): a job that raises after its merge keeps what the merge taught and is dropped at its arrival,
    as sequentially; a checkpoint written while its failure waits for its arrival resumes on either executor."""
    from core.test_job_failures import fedasmu_failing_after_the_merge

    from lit_asyncfl.core.simulator import ClientJobError
    from lit_asyncfl.rl import TimeSlotSelector

    def ray_executor():
        return RayExecutor(num_workers=2) if executor == "workers" else RayExecutor(num_workers=1, train_locally=True)

    def run(name, failing=(), executor=None, **kwargs):
        kwargs.setdefault("max_versions", 8)
        if executor is not None:
            kwargs["executor"] = executor
        return fedasmu_failing_after_the_merge(tmp_path, name, failing, model=LeNet5(lr=0.05), **kwargs)

    rewarded = []
    reward = TimeSlotSelector.reward
    monkeypatch.setattr(TimeSlotSelector, "reward", lambda self, j, r: rewarded.append(j) or reward(self, j, r))
    _, _, merged = run("healthy")
    failing = sorted(merged)[len(merged) // 2]
    rewarded.clear()
    sequential, fail, _ = run("seq", {failing}, on_client_error="drop")
    drops, learned = fail.drops, list(rewarded)
    rewarded.clear()
    on_ray, fail, _ = run("ray", {failing}, ray_executor(), on_client_error="drop")
    assert failing in learned and rewarded == learned  # learned at the request event, in the same order
    assert fail.drops == drops and drops[0][1] == drops[0][3]  # dropped at its arrival
    assert torch.equal(global_weights(on_ray), global_weights(sequential))
    assert on_ray.summary["executor"]["jobs_local"] == 0

    with pytest.raises(ClientJobError, match=rf"boom after the merge of job {failing}"):
        run("failing", {failing}, ray_executor())
    last = str(next((tmp_path / "failing").rglob("last.ckpt")))
    resumed, fail, _ = run("resumed", ckpt_path=last, on_client_error="drop")
    assert [d[0] for d in fail.drops] == [failing]
    assert torch.equal(global_weights(resumed), global_weights(sequential))


def test_a_fedasmu_job_failing_in_a_later_callbacks_merge_teaches_nothing_as_sequentially(
    tmp_path, cluster, monkeypatch
):
    """A job whose merge a later callback's ``on_fresh_model`` fails is dropped at its request event and teaches the
    slot policy nothing, under both executors (before, the sequential executor learned from the merge that failed:
    FreshModelMerge learned inside its own ``on_fresh_model``)."""
    from core.test_job_failures import fedasmu_failing_after_the_merge, rewards_and_a_merged_job

    def run(name, executor=None):
        kwargs = {"max_versions": 8, "on_client_error": "drop", "in_merge": True}
        if executor is not None:
            kwargs["executor"] = executor
        return fedasmu_failing_after_the_merge(tmp_path, name, {failing}, model=LeNet5(lr=0.05), **kwargs)

    rewarded, failing = rewards_and_a_merged_job(tmp_path, monkeypatch, model=LeNet5(lr=0.05), max_versions=8)
    sequential, fail, _ = run("seq")
    drops, learned = fail.drops, list(rewarded)
    rewarded.clear()
    on_ray, fail, _ = run("ray", RayExecutor(num_workers=2))
    assert failing not in learned and rewarded == learned
    assert fail.drops == drops and drops[0][0] == failing and drops[0][1] == drops[0][2]  # at its request
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


def fedasmu_with_participation_rates():
    """FedASMU with FedSA's participation-share learning rate: a second carried callback, which learns from a
    job's end (the counts :math:`c_i, C` later dispatches read)."""
    from lit_asyncfl.client_callbacks.staleness import ParticipationLearningRate

    algo = get_algorithm("fedasmu")
    algo.client_callbacks.append(ParticipationLearningRate(frequency="share"))
    return algo


def test_fedasmu_with_a_callback_learning_at_the_job_end_gives_the_sequential_weights(tmp_path, cluster):
    """Sequentially a job with a request trains whole at its request event, so a carried callback's ``on_train_end``
    learns there; on Ray such a job is collected at its request and its result committed there (before: at its
    arrival, and later dispatches read other participation counts)."""
    kwargs = {"num_clients": 60, "max_versions": 15}
    torch.manual_seed(0)
    sequential = fit(tmp_path / "seq", fedasmu_with_participation_rates(), **kwargs)
    torch.manual_seed(0)
    on_ray = fit(tmp_path / "ray", fedasmu_with_participation_rates(), RayExecutor(num_workers=2), **kwargs)
    stats = on_ray.summary["executor"]
    assert stats["jobs_local"] == 0 and stats["merges_here"] + stats["merges_on_workers"] > 0
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


@pytest.mark.parametrize("rates", [False, True])
def test_writing_checkpoints_does_not_change_a_ray_run_with_requests(tmp_path, cluster, rates):
    """A checkpoint settles the jobs past their request: it must commit nothing that the run would not have
    committed by then (before, it committed their results at the checkpoint instead of at their arrival)."""
    kwargs = {"num_clients": 60, "max_versions": 15}

    def algorithm():
        return fedasmu_with_participation_rates() if rates else get_algorithm("fedasmu")

    torch.manual_seed(0)
    plain = fit(tmp_path / "plain", algorithm(), RayExecutor(num_workers=2), **kwargs)
    torch.manual_seed(0)
    written = fit(tmp_path / "ckpt", algorithm(), RayExecutor(num_workers=2), checkpoint_every=1, **kwargs)
    assert torch.equal(global_weights(written), global_weights(plain))


def test_only_a_jobs_own_error_after_its_merge_counts_as_its_failure_after_the_request():
    """What a checkpoint records as a job's failure after its merge (``failed_after_request``): the error the job
    raised, never its workers' deaths (that error propagates from the checkpoint)."""
    from lit_asyncfl.executors.ray.placement import _Failed

    executor = RayExecutor(num_workers=1)
    raised, lost = ValueError("boom after the merge"), RuntimeError("a Ray worker died 3 times computing job 2")
    executor._after = {1: _Failed(raised), 2: _Failed(lost, lost=True), 3: object()}
    assert [executor.failed_after_request(k) for k in (1, 2, 3, 4)] == [raised, None, None, None]


def test_fedsa_jobs_are_not_taken_for_jobs_that_ask_the_server(tmp_path, cluster, caplog):
    """FedSA's ParticipationLearningRate overrides ``request_step`` only to record each dispatch
    (``asks_server = False``): no merge runner is built for its runs, and no warning says that its jobs ask the
    server mid-training (before, with ``engine="lightning"``, one did)."""
    from lit_asyncfl.client_callbacks import FreshModelMerge
    from lit_asyncfl.client_callbacks.staleness import ParticipationLearningRate
    from lit_asyncfl.executors.ray.executor import _asks_server

    assert [_asks_server(cb) for cb in (FreshModelMerge(), ParticipationLearningRate())] == [True, False]
    built = []
    executor = RayExecutor(num_workers=1)
    start = RayExecutor.start

    def started(self, *args, **kwargs):
        out = start(self, *args, **kwargs)
        built.append(self._merge_runner is not None)
        return out

    with caplog.at_level("WARNING", logger="lit_asyncfl"):
        RayExecutor.start = started
        try:
            for engine in ("fast", "lightning"):
                fit(tmp_path / engine, "fedsa", executor, engine=engine, num_clients=40, max_versions=2)
        finally:
            RayExecutor.start = start
    assert built == [False, False]
    assert "ask the server mid-training" not in caplog.text


def merging_fedasmu(declared=True):
    """FedASMU with short periods and few slots: most requests find a newer model (13 of 20 in 20 versions)."""
    from lit_asyncfl.algorithms import FedASMU

    algorithm = FedASMU(clients_per_trigger=3, max_parallel=4, num_slots=3, epsilon=0.5, lr_gamma=1e-2)
    algorithm.client_callbacks[0].merges_from_request_state = declared
    return algorithm


def test_each_merge_is_computed_once_here_or_on_the_job_worker_with_the_sequential_weights(tmp_path, cluster):
    """A job's merge is computed once: on its worker when that worker is free, else here from the job's state at
    its request (the worker then trains the rest from what the merge changed), or here on the job's own engine when
    it is parked here (``train_locally``); a callback that does not declare ``merges_from_request_state`` is merged
    where the job is parked. Every way gives the sequential weights."""
    kwargs = {"max_versions": 20}
    sequential = fit(tmp_path / "seq", merging_fedasmu(), **kwargs)
    counts = []
    for i, (executor, declared) in enumerate([
        (RayExecutor(num_workers=2), True),
        (RayExecutor(num_workers=1, train_locally=True), True),
        (RayExecutor(num_workers=2), False),
    ]):  # fmt: skip
        on_ray = fit(tmp_path / str(i), merging_fedasmu(declared), executor, **kwargs)
        assert torch.equal(global_weights(on_ray), global_weights(sequential))
        stats = on_ray.summary["executor"]
        assert stats["merges_here"] + stats["merges_on_workers"] == 13  # (the requests that found a newer model)
        counts.append((stats["merges_here"], stats["merges_from_state"], stats["merges_on_workers"]))
    (here, from_state, on_workers), (here_local, _, _), undeclared = counts
    # Without train_locally no job is parked here: each merge counted here was computed from a job's state at its
    # request while its worker was busy, and that run must take both ways (the delicate one: _Merged.apply).
    assert here == from_state > 0 and on_workers > 0
    assert here_local > 0  # (jobs parked here, train_locally)
    assert undeclared == (0, 0, 13)  # (undeclared: every merge where its job is parked, on the workers)


class BatchNormCNN(ClassificationModule):
    """A tiny CNN on digits with BatchNorm2d (``momentum=None``: a cumulative average, which reads
    ``num_batches_tracked``, so a wrong batch count changes the weights)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__(num_classes=10, lr=lr)
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=None), nn.ReLU(), nn.Flatten(),
            nn.Linear(4 * 8 * 8, 10),
        )  # fmt: skip


@pytest.mark.parametrize("route", ["shared memory", "inside the task", "object store"])
def test_a_merge_computed_here_from_a_job_state_gives_the_sequential_weights_and_batchnorm_counts(
    tmp_path, cluster, monkeypatch, route
):
    """The merges computed here from a job's state at its request while its worker is busy
    (:meth:`_JobRunner.learn_merge`), whose effects (weights, BatchNorm running statistics and counts, random
    state, job info) the worker puts in place before the rest of the job (``_Merged.apply``), give the sequential
    executor's weights, running statistics and ``num_batches_tracked`` bit for bit: as files in shared memory (the
    workers on this machine), carried inside the rest's task in pieces (no shared memory), or (no shared memory,
    over the inline budget: 0 here) whole through Ray's object store."""
    if route != "shared memory":
        monkeypatch.setattr(wire, "SHARED_MEMORY", None)
    if route == "object store":
        monkeypatch.setattr(wire, "INLINE_BYTES", 0)
    seen = run_files(RayExecutor, monkeypatch)
    read, real_tensor = [], wire._Shared.tensor
    monkeypatch.setattr(wire._Shared, "tensor", lambda shared: read.append(shared.taken) or real_tensor(shared))
    kwargs = {"max_versions": 12}
    model = BatchNormCNN()
    sequential = fit(tmp_path / "seq", merging_fedasmu(), model=copy.deepcopy(model), **kwargs)
    on_ray = fit(tmp_path / "ray", merging_fedasmu(), RayExecutor(num_workers=2), model=model, **kwargs)
    assert on_ray.summary["executor"]["merges_from_state"] > 0
    taken = sum(taken for taken, _ in seen["written"])  # (a merge's effects, here: weights and merge jump)
    if route == "shared memory":  # (the merges' effects went as files, the results came back as files)
        assert taken >= 2 * on_ray.summary["executor"]["merges_from_state"] and sum(read) > 0
    else:
        assert seen["written"] == [] and read == []
    assert torch.equal(global_weights(on_ray), global_weights(sequential))  # (running statistics included)
    counts = [run.simulator.server.batches_tracked for run in (on_ray, sequential)]
    assert counts[1] is not None and torch.equal(counts[0], counts[1])


def test_a_rest_sends_back_only_the_merge_tensors_changed_on_the_worker_and_they_are_filled_in_here():
    """The tensors a merge computed here put in the job's info (FedASMU's merge jump, as large as the model) come
    back from the rest's worker as a placeholder (``_Kept``) when the rest left them as they came (the same tensor,
    not changed in place), and this process fills in its own; one a later hook changed in place comes back itself."""
    from types import SimpleNamespace

    import ray.cloudpickle as cloudpickle

    from lit_asyncfl.engines.base import generator_state
    from lit_asyncfl.executors.ray.worker import _Kept, _Merged

    cpu = torch.device("cpu")
    jump, other = torch.arange(300.0), torch.ones(2)
    here = _Merged(None, None, generator_state(cpu), {"merge_jump": jump, "other": other, "beta": 0.5})
    there = cloudpickle.loads(cloudpickle.dumps(here))  # (as it arrives on the worker)
    engine = SimpleNamespace(job_info={"lr": 0.1}, device=cpu)
    there.apply(engine, cpu)
    engine.job_info["other"].add_(1.0)  # (a later hook changes one in place)
    update = SimpleNamespace(info=engine.job_info)
    there.sent_back(update)
    assert isinstance(update.info["merge_jump"], _Kept) and torch.equal(update.info["other"], torch.full((2,), 2.0))
    back = cloudpickle.loads(cloudpickle.dumps(update))  # (the update as it comes back)
    assert len(cloudpickle.dumps(back)) < 1000  # (the jump stayed here)
    here.taken_back(back)
    assert back.info["merge_jump"] is jump and torch.equal(back.info["other"], torch.full((2,), 2.0))
    assert list(back.info) == ["lr", "merge_jump", "other", "beta"] and back.info["beta"] == 0.5


def test_the_final_evaluation_lets_each_worker_train_the_rests_the_last_checkpoint_waits_for(
    tmp_path, cluster, monkeypatch
):
    """The run's final evaluation (after its loop) comes before the end-of-run checkpoint, which waits for every job
    past its request: each worker first gets the waiting rests of the jobs parked on it, as many as wait, and nothing
    else (the jobs before their request stay waiting: nothing waits for them). Where they train leaves the weights."""
    from lit_asyncfl.executors.ray import placement

    monkeypatch.setattr(placement, "TASKS_PER_WORKER", 1)  # (rests wait for the worker: one task at a time)
    executor = RayExecutor(num_workers=1)
    seen = []
    place_rests = executor._place_rests

    def watched():
        def waiting():
            rests = [entry[2] for entry in executor._waiting if entry[2].part == 2 and entry[2].worker >= 0]
            return rests, len(executor._waiting) - len(rests)

        (rests, others), busy = waiting(), executor._busy[0]
        place_rests()
        running = {id(task): task.worker for task in executor._running.values()}
        placed = [running.get(id(rest)) == rest.worker == 0 for rest in rests]
        seen.append((len(rests), others, waiting(), executor._busy[0] - busy, placed))

    executor._place_rests = watched
    sequential = fit(tmp_path / "seq", merging_fedasmu(), max_versions=13)
    on_ray = fit(tmp_path / "ray", merging_fedasmu(), executor, max_versions=13)
    assert len(seen) == 1  # (only the final evaluation: the others give the workers what they can train meanwhile)
    [(rests, others, (rests_after, others_after), added, placed)] = seen
    # every rest is now placed on its worker, however far that worker got meanwhile (added: tasks placed on it)
    assert rests > 0 and rests_after == [] and others_after == others and added == rests and all(placed)
    assert torch.equal(global_weights(on_ray), global_weights(sequential))


class CountedSteps:
    """The local steps each job's tasks add to an executor's ``worker_steps`` and ``local_steps`` (the tasks received
    from the workers, and those this process trained), and each dispatched job's ``num_steps`` (the simulator's)."""

    def __init__(self, executor):
        self.counted, self.planned, submit = {}, {}, executor.submit

        def stats():
            return executor.stats["worker_steps"] + executor.stats["local_steps"]

        def submitted(job, start):
            self.planned[job.job_id] = job.num_steps
            submit(job, start)

        def spied(method):
            def spy(shipped):
                [job_id], before = shipped.batch, stats()
                method(shipped)
                self.counted[job_id] = self.counted.get(job_id, 0) + stats() - before

            return spy

        executor.submit = submitted
        executor._receive, executor._train_here = spied(executor._receive), spied(executor._train_here)


@pytest.mark.parametrize("train_locally", [False, True])
def test_the_stats_count_each_trained_job_steps_once_and_its_cpu_time_within_its_time(tmp_path, cluster, train_locally):
    """``worker_steps + local_steps`` is the sum of the trained jobs' ``num_steps`` (a job counted once, whole), and
    the trainers' CPU time (``time.thread_time``) is positive and within their time."""
    executor = RayExecutor(num_workers=1, train_locally=train_locally)
    steps = CountedSteps(executor)
    fit(tmp_path, "fedasync", executor, num_clients=40, max_versions=20)
    stats = executor.stats
    assert steps.counted and all(steps.counted[k] == steps.planned[k] for k in steps.counted)
    assert stats["worker_steps"] + stats["local_steps"] == sum(steps.planned[k] for k in steps.counted)
    assert isinstance(stats["worker_steps"], int) and isinstance(stats["local_steps"], int)
    assert 0 < stats["worker_cpu_seconds"] <= stats["worker_seconds"] + 1e-3
    if train_locally:
        assert stats["jobs_trained_locally"] > 0 and stats["local_steps"] > 0
        assert 0 < stats["local_cpu_seconds"] <= stats["local_seconds"] + 1e-3


class ConsumedJobs(Callback):
    def __init__(self):
        self.jobs = []

    def on_client_update(self, trainer, update, aggregated):
        self.jobs.append(update.job)


def test_a_fedasmu_job_in_parts_counts_its_steps_once_and_its_merges_here_their_cpu_time(tmp_path, cluster):
    """A job trained in parts around its request counts its ``num_steps`` (its merge trains no step), and the merges
    computed here count in ``local_cpu_seconds`` as in ``local_seconds``, and apart in ``merge_cpu_seconds``."""
    executor = RayExecutor(num_workers=2)
    steps, consumed = CountedSteps(executor), ConsumedJobs()
    fit(tmp_path, merging_fedasmu(), executor, max_versions=20, callbacks=[consumed])
    stats = executor.stats
    parts = [job for job in consumed.jobs if job.request_step is not None]
    assert parts and all(steps.counted[job.job_id] == job.num_steps for job in consumed.jobs)
    assert stats["merges_here"] > 0 and stats["merges_on_workers"] > 0  # (both ways, as in the test above)
    assert 0 < stats["local_cpu_seconds"] <= stats["local_seconds"] + 1e-3
    assert 0 < stats["merge_cpu_seconds"] <= stats["local_cpu_seconds"]  # (no step trained here: all merges)
    assert stats["local_steps"] == 0


def test_the_final_evaluation_gives_the_workers_the_rest_of_a_job_whose_worker_died():
    """A rest whose worker died is trained again whole (part 0, with its answer) on the next free worker: the final
    evaluation places it too; jobs before their request and rests parked here stay waiting."""
    from lit_asyncfl.core.update import ClientJob, JobTiming
    from lit_asyncfl.executors.ray.placement import _Shipped

    def task(job_id, part, worker=-1, request_step=2):
        job = ClientJob(job_id, 0, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1, num_steps=4,
                        request_step=request_step)  # fmt: skip
        shipped = _Shipped([job_id], float(job_id), jobs=[job], starts=[torch.zeros(1)], part=part)
        shipped.worker = worker
        return shipped

    executor = RayExecutor(num_workers=1)
    tasks = {"rest": task(0, 2, worker=0), "again": task(1, 0), "before": task(2, 1), "here": task(3, 2),
             "plain": task(4, 0, request_step=None)}  # fmt: skip
    executor._waiting = [(t.key, i, t) for i, t in enumerate(tasks.values())]
    placed = []
    executor._place = lambda reserve=0.0: placed.extend(entry[2] for entry in executor._waiting)
    executor._place_rests()
    assert sorted(id(t) for t in placed) == sorted(id(tasks[name]) for name in ("rest", "again"))
    assert len(executor._waiting) == 5  # (here nothing was placed: the rests stay with the others)


def test_the_workers_runtime_env_leaves_a_variable_the_job_runtime_env_sets_as_the_user_set_it():
    """Ray merges an actor's env_vars over the job's, so the executor's own (result size, niceness) would override a
    user's setting of the same variable: it sets only those the job's runtime environment leaves unset."""
    from lit_asyncfl.executors.ray.pool import RESULT_RUNTIME_ENV, WORKER_RUNTIME_ENV, _worker_env_vars

    ours = {**RESULT_RUNTIME_ENV["env_vars"], **WORKER_RUNTIME_ENV["env_vars"]}
    assert _worker_env_vars(None, train_locally=True) == ours
    assert _worker_env_vars({}, train_locally=False) == RESULT_RUNTIME_ENV["env_vars"]
    user = {"RAY_worker_niceness": "5", "RAY_max_direct_call_object_size": "1024", "OTHER": "1"}
    assert _worker_env_vars(user, train_locally=True) == {}
    assert _worker_env_vars({"RAY_worker_niceness": "5"}, train_locally=True) == RESULT_RUNTIME_ENV["env_vars"]


def test_the_workers_get_the_job_runtime_env_variables_the_executor_also_sets(tmp_path, cluster, monkeypatch):
    """A run reads the job's runtime environment (``ray.get_runtime_context().runtime_env``) to leave the user's
    variables alone: the workers' actor options then omit them."""
    context = ray.get_runtime_context()
    job_env = {"env_vars": {"RAY_max_direct_call_object_size": "1024"}}

    class Context:
        runtime_env = job_env

        def __getattr__(self, name):
            return getattr(context, name)

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    seen = []
    remote = ray.remote

    def watched(*args, **kwargs):
        seen.append(kwargs.get("runtime_env"))
        return remote(*args, **kwargs)

    monkeypatch.setattr(ray, "remote", watched)
    executor = RayExecutor(num_workers=1, reuse_workers=False)
    executor.start(lambda device: None, torch.device("cpu"))
    executor.stop()
    assert seen == [{"env_vars": {}}]


class _Picky(Exception):
    """An exception that pickles but cannot be unpickled (its class takes two arguments, its args hold one)."""

    def __init__(self, a, b):
        super().__init__(f"{a}{b}")


def test_a_pipe_runs_tasks_in_order_and_loses_those_of_a_worker_that_went(tmp_path):
    """Tasks through a worker's socket run one at a time in the order they came; an error comes back as the error
    (one that cannot be unpickled as a RuntimeError naming it); a worker that closes its end loses every task still
    out (pipe._Lost), which the executor treats as a dead worker's."""
    ran = []

    def run(method, args):
        ran.append(args[0])
        if method == "fail":
            raise ValueError(f"job {args[0]} raised")
        if method == "picky":
            raise _Picky("x", "y")
        if method == "slow":
            time.sleep(0.2)
        return args[0] * 10

    path = str(tmp_path / "w.sock")
    server = pipe._Server(path, run)
    end = pipe._Pipe(path)
    calls = [end.call("add", 1), end.call("fail", 2), end.call("picky", 3), end.call("add", 4)]
    while not all(call.done for call in calls):
        pipe._finished(calls, block=True)
    assert ran == [1, 2, 3, 4] and calls[0].result() == 10 and calls[3].result() == 40
    with pytest.raises(ValueError, match="job 2 raised"):
        calls[1].result()
    with pytest.raises(RuntimeError, match="_Picky: xy"):
        calls[2].result()
    slow, later = end.call("slow", 5), end.call("add", 6)
    time.sleep(0.05)
    server.close(wait=False)  # (the worker's process ends: its socket closes)
    while not (slow.done and later.done):
        pipe._finished([slow, later], block=True)
    assert isinstance(later.error, pipe._Lost) and end.closed
    assert end.call("add", 7).done  # (lost at once)


class _Unreadable:
    """An argument that pickles but raises when unpickled (as a class the worker lacks would)."""

    def __reduce__(self):
        return (_refuse, ())


def _refuse():
    raise ImportError("no such module on the worker")


def test_a_task_the_worker_cannot_read_fails_alone(tmp_path):
    """A task whose message cannot be unpickled on the worker fails with that cause; the pipe goes on."""
    path = str(tmp_path / "w.sock")
    server = pipe._Server(path, lambda method, args: args[0])
    end = pipe._Pipe(path)
    calls = [end.call("echo", 1), end.call("echo", _Unreadable()), end.call("echo", 3)]
    while not all(call.done for call in calls):
        pipe._finished(calls, block=True)
    assert calls[0].result() == 1 and calls[2].result() == 3
    with pytest.raises(RuntimeError, match="no such module on the worker"):
        calls[1].result()
    end.close()
    server.close()


def test_tensors_cross_a_pipe_bit_for_bit_whatever_they_are():
    """Plain tensors go as their bytes; views, quantized tensors, parameters and tensors with attributes
    keep torch's own pickling: each comes back equal, with its kind."""
    import pickle

    tagged = torch.arange(3.0)
    tagged.note = "kept"
    values = {
        "plain": torch.randn(2, 3), "bf16": torch.randn(4).bfloat16(), "view": torch.arange(10.0)[2:5],
        "transposed": torch.randn(3, 2).t(), "param": nn.Parameter(torch.ones(2)), "tagged": tagged,
        "quantized": torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),
        "empty": torch.empty(0), "scalar": torch.tensor(7),
    }  # fmt: skip
    back = pickle.loads(pipe._dumps(values, 0)[pipe._HEADER.size :])
    for key, value in values.items():
        got = back[key]
        assert type(got) is type(value) and got.dtype == value.dtype and got.shape == value.shape, key
        if value.is_quantized:
            assert torch.equal(got.dequantize(), value.dequantize()) and got.q_scale() == value.q_scale()
        else:
            assert torch.equal(got, value), key
    assert back["tagged"].note == "kept"
