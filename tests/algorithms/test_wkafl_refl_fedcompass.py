"""What WKAFL, REFL and FedCompass share as presets: determinism and exact resume, refused settings, the papers'
compositions, the comparison specs and configs that run. Each algorithm's own checks: test_wkafl.py, test_refl.py,
test_fedcompass.py; the mechanisms they brought: engines/test_job_steps.py, availability/test_prediction.py,
schedulers/test_compass.py, functional/test_compass.py."""

from __future__ import annotations

import pytest
import yaml
from builders import ROOT, check_config_runs
from conftest import check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import PRESETS, REFL, WKAFL, FedCompass
from lit_asyncfl.schedulers.compass import CompassScheduler
from lit_asyncfl.schedulers.deadline_rounds import DeadlineRounds
from lit_asyncfl.server.grouped import GroupedDeltaStep
from lit_asyncfl.server.stale_aware import StaleAwareAverage
from lit_asyncfl.server.two_stage import TwoStageWeightedStep

DATA = {"partition": "dirichlet"}


# ---------------------------------------------------------------------------------------------------------- formulas


# ------------------------------------------------------------------------------- per-job local steps (the mechanism)


# ------------------------------------------------------------------------------------------- runs replayed by hand


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "wkafl": (lambda: WKAFL(k=3), {}, 8),
    "refl": (lambda: REFL(clients_per_round=4, deadline=30.0, prohibit_reselect=1), {}, 8),
    "fedcompass": (lambda: FedCompass(q_min=2, q_max=7, latest_time_factor=1.3), {}, 14),
}


def server_state_is_midway(name: str, algorithm) -> bool:
    aggregator = algorithm.aggregator
    if name == "wkafl":
        return aggregator.previous is not None and len(aggregator.buffer) > 0
    if name == "refl":
        return len(aggregator.buffer) > 0 and algorithm.scheduler.round > 1
    return bool(aggregator.held) and any(g["arrived"] for g in algorithm.scheduler.groups.values())


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, extra, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: server_state_is_midway(name, algorithm), data=DATA,
        fractions=(0.45, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8), num_clients=8, **extra,
    )  # fmt: skip
    assert resumed.algorithm.scheduler.state_dict().keys() == full.algorithm.scheduler.state_dict().keys()


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: WKAFL(k=0), r"buffer_size must be >= 1, got 0|k must be >= 1, got 0"),
        (lambda: WKAFL(k=0.5), r"buffer_size must be an integer >= 1, got 0.5"),
        (lambda: WKAFL(momentum=1.5), r"momentum must be in \[0, 1\], got 1.5"),
        (lambda: WKAFL(threshold=1.0), r"threshold must be in \[-1, 1\), got 1.0"),
        (lambda: WKAFL(first_clip=0.0), r"first_clip must be > 0, got 0.0"),
        (lambda: WKAFL(server_lr=float("nan")), r"server_lr must be a finite number > 0, got nan"),
        (lambda: REFL(deadline=0.0), r"deadline must be > 0 virtual seconds, got 0.0"),
        (lambda: REFL(beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
        (lambda: REFL(scale=0.5), r"scale must be >= 1, got 0.5"),
        (lambda: REFL(prohibit_reselect=-1), r"prohibit_reselect must be >= 0, got -1"),
        (lambda: REFL(confidence=1.0), r"confidence must be in \(0, 1\), got 1.0"),
        (lambda: REFL(ips="yes"), r"ips must be True or False, got 'yes'"),
        (lambda: REFL(clients_per_round=0), r"clients_per_round must be >= 1, got 0"),
        (lambda: FedCompass(q_min=0), r"q_min must be >= 1, got 0"),
        (lambda: FedCompass(q_min=50, q_max=20), r"q_min.*50.*q_max.*20"),
        (lambda: FedCompass(speed_momentum=0.0), r"speed_momentum must be in \(0, 1\], got 0.0"),
        (lambda: FedCompass(latest_time_factor=0.9), r"latest_time_factor must be >= 1, got 0.9"),
        (lambda: FedCompass(alpha=0.0), r"alpha must be > 0, got 0.0"),
        (lambda: FedCompass(staleness_exponent=-1.0), r"staleness_exponent must be >= 0, got -1.0"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_schedulers_refuse_an_aggregator_they_cannot_drive(tmp_path):
    from lit_asyncfl.algorithms import Algorithm
    from lit_asyncfl.server import DeltaAverage

    with pytest.raises(ValueError, match="needs the GroupedDeltaStep aggregator, got DeltaAverage"):
        run(tmp_path / "c", Algorithm(CompassScheduler(2, 4), DeltaAverage(None)), num_clients=4, max_versions=2)
    with pytest.raises(ValueError, match=r"flush-only aggregator \(buffer_size=None\), got buffer_size=5"):
        run(tmp_path / "r", Algorithm(DeadlineRounds(2, 10.0), DeltaAverage(5)), num_clients=4, max_versions=2)


def test_presets_are_registered_and_are_the_papers_compositions():
    assert PRESETS["wkafl"] is WKAFL and PRESETS["refl"] is REFL and PRESETS["fedcompass"] is FedCompass
    w = WKAFL()
    assert isinstance(w.aggregator, TwoStageWeightedStep) and w.scheduler.k == 10 and w.server_callbacks == []
    agg = w.aggregator
    assert (agg.buffer_size, agg.server_lr, agg.momentum, agg.first_clip, agg.second_clip, agg.threshold,
            agg.temperature, agg.lr_decay) == (10, 1.0, 0.1, 100.0, 10.0, 0.3, 10.0, 0.1)  # fmt: skip
    r = REFL()
    assert isinstance(r.aggregator, StaleAwareAverage) and isinstance(r.scheduler, DeadlineRounds)
    assert (r.aggregator.beta, r.aggregator.scale, r.scheduler.deadline, r.scheduler.prohibit_reselect) == (
        0.35, 1.0, 100.0, 5)  # fmt: skip
    assert r.scheduler.selection.predictor is r.scheduler.predictor
    assert type(REFL(ips=False).scheduler.selection).__name__ == "Selection"
    c = FedCompass()
    assert isinstance(c.aggregator, GroupedDeltaStep) and isinstance(c.scheduler, CompassScheduler)
    s = c.scheduler
    assert (s.q_min, s.q_max, s.speed_momentum, s.latest_time_factor, c.aggregator.alpha,
            c.aggregator.staleness_exponent) == (20, 100, 0.9, 1.5, 0.9, 0.5)  # fmt: skip


def test_comparison_specs_and_the_benchmark_suites_include_the_presets():
    fedhist = yaml.safe_load((ROOT / "configs" / "compare" / "fedhist_table1.yaml").read_text())
    assert {"WKAFL", "REFL"} <= set(fedhist["methods"])
    fedadt = yaml.safe_load((ROOT / "configs" / "compare" / "fedadt_table1.yaml").read_text())
    assert "FedCompass" in fedadt["methods"]
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", ROOT / "scripts" / "bench_algorithms.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert {"WKAFL", "REFL"} <= set(bench.SUITES["fedhist"]["methods"])
    assert "FedCompass" in bench.SUITES["fedadt"]["methods"]


@pytest.mark.parametrize("name", ["wkafl", "refl", "fedcompass"])
def test_config_parses_and_runs(tmp_path, name):
    overrides = {
        "wkafl": ["--trainer.algorithm.init_args.k=4"],
        "refl": ["--trainer.algorithm.init_args.clients_per_round=4", "--trainer.algorithm.init_args.deadline=40.0"],
        "fedcompass": ["--trainer.algorithm.init_args.q_max=4"],
    }[name]
    check_config_runs(tmp_path, name, overrides)
