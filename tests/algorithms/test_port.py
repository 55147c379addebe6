"""The asynchronous baselines of FedASMU's Table 1 (PORT): formulas against hand values, whole runs replayed by hand
from the recorded uploads, determinism, exact resume, refused settings, configs that run."""

from __future__ import annotations

import pytest
import torch
import yaml
from builders import ROOT
from conftest import RecordsVersions, assert_same, check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import PORT, PRESETS
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.functional.port import port_similarity, port_staleness_factor, port_weight
from lit_asyncfl.schedulers import BufferedConcurrency
from lit_asyncfl.server import DataSizeWeight, ModelAverage, SimilarityStalenessWeight


def make_update(client: int, weights, base, base_version: int = 0, num_samples: int = 10) -> ClientUpdate:
    job = ClientJob(0, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.tensor(weights), torch.tensor(base), num_samples, 1, 0.0)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """An independent cosine: dot over the product of norms, in float64."""
    a, b = a.double(), b.double()
    return float(a @ b / (a.norm() * b.norm()))


# ---------------------------------------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("staleness, bound, expected", [(0, 10, 1.0), (5, 10, 10 / 15), (10, 10, 0.5), (3, 1, 0.25)])
def test_port_staleness_factor_by_hand(staleness, bound, expected):
    assert port_staleness_factor(staleness, bound) == pytest.approx(expected)


def test_port_similarity_and_weight_by_hand():
    g = torch.tensor([3.0, 4.0])
    assert port_similarity(g, torch.tensor([3.0, 4.0])) == pytest.approx(1.0)
    assert port_similarity(g, torch.tensor([-4.0, 3.0])) == pytest.approx(0.5)  # orthogonal
    assert port_similarity(g, torch.tensor([0.0, 5.0])) == pytest.approx((1 + 0.8) / 2)
    assert port_similarity(g, torch.zeros(2)) == pytest.approx(0.5)  # eps-guarded zero vector: cosine 0
    assert port_weight(0.9, 0.5, similarity_weight=1.0, staleness_weight=3.0) == pytest.approx(0.9 + 1.5)
    with pytest.raises(ValueError, match="staleness must be >= 0, got -1"):
        port_staleness_factor(-1, 10)


def test_port_weights_on_a_tiny_server_by_hand():
    weight = SimilarityStalenessWeight(bound=2, similarity_weight=1.0, staleness_weight=3.0)
    server = Server(torch.zeros(2), ModelAverage(buffer_size=2), [DataSizeWeight(), weight], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0, 0.0], [0.0, 0.0], num_samples=10))
    server.receive(make_update(1, [0.0, 2.0], [0.0, 0.0], num_samples=30))
    # round 1: both fresh, similarity 1 and factor 1: p = n * (1 + 3) -> weights 10 : 30
    assert torch.allclose(server.weights, torch.tensor([0.5, 1.5]))
    assert torch.allclose(weight.last_step, torch.tensor([0.5, 1.5]))
    server.version = 3  # two more versions passed (as if other aggregations happened); the last step is kept
    w_t = server.weights
    a = make_update(2, [1.5, 1.5], [0.0, 0.0], base_version=0, num_samples=10)  # staleness 3: similarity counts
    b = make_update(3, [0.5, 3.5], [0.5, 1.5], base_version=2, num_samples=10)  # staleness 1: similarity 1
    server.receive(a)
    server.receive(b)
    sim_a = (1 + cosine(torch.tensor([0.5, 1.5]), torch.tensor([1.5, 1.5]) - w_t)) / 2
    p_a = 10 * (sim_a + 3 * 2 / (3 + 2))
    p_b = 10 * (1.0 + 3 * 2 / (1 + 2))
    expected = (p_a * torch.tensor([1.5, 1.5]) + p_b * torch.tensor([0.5, 3.5])) / (p_a + p_b)
    assert torch.allclose(server.weights, expected)


def test_buffered_concurrency_refuses_fewer_selected_than_the_buffer(tmp_path):
    with pytest.raises(ValueError, match=r"concurrency=3 selects 3 clients, fewer than the aggregator's buffer_size=4"):
        run(tmp_path, PORT(buffer_size=4, concurrency=3), max_versions=2)


# ------------------------------------------------------------------------------------------- runs replayed by hand


class Uploads(RecordsVersions):
    """Put first among the callbacks: records every upload (its weight chain starts at 1) and every new version."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[dict] = []

    def weight_update(self, server, update, weight):
        assert weight == 1.0
        self.uploads.append({"client": update.client, "staleness": update.staleness, "weights": update.weights,
                             "global": server.weights, "n": update.num_samples})  # fmt: skip
        return weight


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_port_run_replayed_from_the_recorded_uploads(tmp_path):
    m, b, sim_w, st_w = 3, 1, 1.0, 3.0
    algorithm = PORT(buffer_size=m, concurrency=6, staleness_bound=b, similarity_weight=sim_w, staleness_weight=st_w)
    record = Uploads()
    algorithm.server_callbacks.insert(0, record)
    trainer = run(tmp_path, algorithm, num_clients=10, max_versions=14, data_kwargs={"partition": "dirichlet"})
    assert [v["count"] for v in record.versions] == [m] * len(record.versions)
    assert algorithm.scheduler.abandoned > 0 and trainer.simulator.cancelled == algorithm.scheduler.abandoned
    assert trainer.summary["abandoned_for_staleness"] == algorithm.scheduler.abandoned
    stale = [u["staleness"] for u in record.uploads]
    assert max(stale) == b + 1  # at most b + 1: the stragglers were restarted
    assert any(s >= 2 for s in stale)  # the similarity term was exercised
    last_step = None
    for r, version in enumerate(record.versions):
        buffered = record.uploads[r * m : (r + 1) * m]
        w_t = version["before"]
        assert all(torch.equal(u["global"], w_t) for u in buffered)
        raw = []
        for u in buffered:
            similarity = 1.0
            if u["staleness"] > 1 and last_step is not None:
                similarity = (1 + cosine(last_step, u["weights"] - w_t)) / 2
            raw.append(u["n"] * (sim_w * similarity + st_w * b / (u["staleness"] + b)))
        expected = sum(p * u["weights"] for p, u in zip(raw, buffered)) / sum(raw)
        assert close(version["after"], expected), r
        last_step = version["after"] - w_t


class CheckedBufferedConcurrency(BufferedConcurrency):
    """Checks, after every processed arrival, who is selected and what happened to the stragglers."""

    def on_fit_start(self, sim):
        self.checked = self.restarted = 0
        super().on_fit_start(sim)

    def on_update(self, sim, job, aggregated):
        before = {j.job_id: j.client for j in sim.in_flight.values()}
        super().on_update(sim, job, aggregated)
        selected = sim.num_training + len(sim.server.aggregator.buffer)
        assert selected == self.count, (selected, self.count)  # buffered clients keep their place, no more
        abandoned = [c for j, c in before.items() if j not in sim.in_flight]
        for client in abandoned:  # each straggler pulled the new model at once
            (restart,) = [j for j in sim.in_flight.values() if j.client == client]
            assert restart.base_version == sim.server.version and restart.dispatch_time == sim.now
        self.restarted += len(abandoned)
        self.checked += 1


def test_buffered_clients_hold_their_place_and_stragglers_restart_from_the_new_model(tmp_path):
    algorithm = PORT(buffer_size=3, concurrency=6, staleness_bound=1)
    algorithm.scheduler = sched = CheckedBufferedConcurrency(6, max_staleness=1)
    run(tmp_path, algorithm, num_clients=10, max_versions=14, data_kwargs={"partition": "dirichlet"})
    assert sched.checked > 14 * 3 - 1 and sched.restarted == sched.abandoned > 0


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "port": (lambda: PORT(buffer_size=3, concurrency=6, staleness_bound=1), 12),
}


def server_state_is_midway(name: str, algorithm) -> bool:
    if name == "port":
        return len(algorithm.aggregator.buffer) > 0 and algorithm.server_callbacks[1].last_step is not None
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: server_state_is_midway(name, algorithm)
    )
    assert resumed.simulator.cancelled == full.simulator.cancelled
    a, b = resumed.simulator.server.state_dict(), full.simulator.server.state_dict()
    assert_same(a["aggregator"], b["aggregator"])
    assert_same(a["callbacks"], b["callbacks"])
    assert resumed.summary.get("abandoned_for_staleness") == full.summary.get("abandoned_for_staleness")


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: PORT(buffer_size=0), r"buffer_size must be >= 1, got 0"),
        (lambda: PORT(buffer_size=2.5), r"buffer_size must be an integer >= 1, got 2.5"),
        (lambda: PORT(concurrency=0), r"concurrency must be >= 1, got 0"),
        (lambda: PORT(staleness_bound=0), r"staleness_bound must be >= 1, got 0"),
        (lambda: PORT(similarity_weight=-1.0), r"similarity_weight must be >= 0, got -1.0"),
        (lambda: PORT(staleness_weight=float("nan")), r"staleness_weight must be a finite number >= 0, got nan"),
        (lambda: PORT(similarity_weight=0.0, staleness_weight=0.0), r"both 0: every weight would be 0"),
        (lambda: BufferedConcurrency(5, max_staleness=-1), r"max_staleness must be >= 0, got -1"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_presets_are_registered_and_are_the_papers_compositions():
    assert PRESETS["port"] is PORT
    port = PORT()
    assert isinstance(port.scheduler, BufferedConcurrency) and type(port.aggregator) is ModelAverage
    assert (port.aggregator.buffer_size, port.scheduler.concurrency, port.scheduler.max_staleness) == (15, 0.3, 10)
    data_size, weight = port.server_callbacks
    assert isinstance(data_size, DataSizeWeight)
    assert (weight.bound, weight.similarity_weight, weight.staleness_weight) == (10, 1.0, 3.0)


def test_fedasmu_comparison_spec_and_the_benchmark_suite_include_the_presets():
    spec = yaml.safe_load((ROOT / "configs" / "compare" / "fedasmu_table1.yaml").read_text())
    assert {"PORT"} <= set(spec["methods"])
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    suite = text[text.index('"fedasmu": {') : text.index('"fedadt": {')]
    assert all(f'"{name}"' in suite for name in ("PORT",))


@pytest.mark.parametrize("name", ["port"])
def test_config_parses_and_runs(tmp_path, name):
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", "--trainer.algorithm.init_args.concurrency=4",
              "--trainer.algorithm.init_args.buffer_size=2",
              "--trainer.eval_every=3", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key not in ("concurrency", "buffer_size"):
            assert algorithm.hparams[key] == value, key
    summary = cli.trainer.summary
    assert summary["versions"] == 3 and summary["stop_reason"] == "max_versions"
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0
