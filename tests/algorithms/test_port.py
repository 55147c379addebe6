"""PORT (a FedASMU Table 1 baseline): a whole run replayed by hand from the recorded uploads, determinism, exact
resume, refused settings, the paper's composition, configs that run (its formulas: functional/test_port.py,
server/test_similarity_weight.py; its scheduler: schedulers/test_buffered_concurrency.py)."""

from __future__ import annotations

import pytest
import torch
import yaml
from builders import ROOT, check_config_runs, close, cosine
from conftest import RecordsVersions, assert_same, check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import PORT, PRESETS
from lit_asyncfl.schedulers import BufferedConcurrency
from lit_asyncfl.server import DataSizeWeight, ModelAverage

# ---------------------------------------------------------------------------------------------------------- formulas


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
    overrides = ["--trainer.algorithm.init_args.concurrency=4", "--trainer.algorithm.init_args.buffer_size=2"]
    check_config_runs(tmp_path, name, overrides)
