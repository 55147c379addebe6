"""What FedFa, CA2FL and FADAS share as presets: determinism and exact resume, refused settings, the papers'
compositions, the comparison spec and configs that run. Each algorithm's replayed run: test_fedfa.py, test_ca2fl.py,
test_fadas.py; their mechanisms: server/test_sliding_window.py, server/test_calibration.py,
server/test_update_cache.py, server/test_adaptive_optimizer.py, functional/test_calibration.py,
functional/test_adaptive.py."""

from __future__ import annotations

import pytest
import yaml
from builders import ROOT, check_config_runs
from conftest import assert_same, check_determinism_and_exact_resume

from lit_asyncfl.algorithms import CA2FL, FADAS, PRESETS, FedFa
from lit_asyncfl.server import (
    CalibratedDeltaAverage,
    DeltaAverage,
    SlidingWindowAverage,
)

# ---------------------------------------------------------------------------------------------------------- formulas


# ------------------------------------------------------------------------------------------- runs replayed by hand


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "fedfa": (lambda: FedFa(window_size=3, concurrency=4), 14),
    "ca2fl": (lambda: CA2FL(buffer_size=3, concurrency=5), 10),
    "fadas": (lambda: FADAS(buffer_size=2, concurrency=5), 10),
}


def server_state_is_midway(name: str, algorithm) -> bool:
    aggregator = algorithm.aggregator
    if name == "fedfa":
        return len(aggregator.window) == aggregator.window_size
    if name == "ca2fl":
        return len(aggregator.cache) > 0 and len(aggregator.residuals) > 0
    return algorithm.server_callbacks[0].steps > 0 and len(aggregator.buffer) > 0


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: server_state_is_midway(name, algorithm)
    )
    a, b = resumed.simulator.server.state_dict(), full.simulator.server.state_dict()
    assert_same(a["aggregator"], b["aggregator"])
    assert_same(a["callbacks"], b["callbacks"])


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: FedFa(window_size=0), r"window_size must be >= 1, got 0"),
        (lambda: FedFa(window_size=2.5), r"window_size must be an integer >= 1, got 2.5"),
        (lambda: FedFa(concurrency=0), r"concurrency must be >= 1, got 0"),
        (lambda: CA2FL(buffer_size=0), r"buffer_size must be >= 1 or None, got 0"),
        (lambda: CA2FL(server_lr=-1.0), r"server_lr must be > 0, got -1.0"),
        (lambda: CA2FL(cache_dtype="int8"), r"unknown cache_dtype 'int8'; allowed: \['bfloat16', 'float16'"),
        (lambda: FADAS(beta1=1.0), r"beta1 must be in \[0, 1\), got 1.0"),
        (lambda: FADAS(beta2=0.0), r"beta2 must be in \(0, 1\), got 0.0"),
        (lambda: FADAS(eps=0.0), r"eps must be > 0, got 0.0"),
        (lambda: FADAS(server_lr=float("nan")), r"server_lr must be a finite number > 0, got nan"),
        (lambda: FADAS(delay_threshold=-1), r"delay_threshold must be >= 0, got -1"),
        (lambda: FADAS(bias_correction="yes"), r"bias_correction must be True or False, got 'yes'"),
        (lambda: FADAS(buffer_size=0), r"buffer_size must be >= 1 or None, got 0"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_presets_are_registered_and_are_the_papers_compositions():
    assert PRESETS["fedfa"] is FedFa and PRESETS["ca2fl"] is CA2FL and PRESETS["fadas"] is FADAS
    fedfa = FedFa()
    assert isinstance(fedfa.aggregator, SlidingWindowAverage) and fedfa.aggregator.window_size == 10
    assert fedfa.server_callbacks == [] and fedfa.scheduler.concurrency == 0.2
    ca2fl = CA2FL()
    assert isinstance(ca2fl.aggregator, CalibratedDeltaAverage) and ca2fl.server_callbacks == []
    assert (ca2fl.aggregator.buffer_size, ca2fl.aggregator.server_lr, ca2fl.scheduler.concurrency) == (10, 1.0, 0.2)
    fadas = FADAS()
    (opt,) = fadas.server_callbacks
    assert type(fadas.aggregator) is DeltaAverage and fadas.aggregator.server_lr == 1.0
    assert (fadas.aggregator.buffer_size, fadas.scheduler.concurrency) == (5, 0.5)
    assert (opt.beta1, opt.beta2, opt.eps, opt.delay_threshold, opt.amsgrad, opt.bias_correction) == (
        0.9, 0.99, 1e-8, 1, True, False)  # fmt: skip


def test_fedadt_comparison_spec_and_the_benchmark_list_include_the_presets():
    spec = yaml.safe_load((ROOT / "configs" / "compare" / "fedadt_table1.yaml").read_text())
    assert {"FedFa", "CA2FL"} <= set(spec["methods"])
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    assert all(f'"{name}"' in text for name in ("FedFa", "CA2FL", "FADAS"))


@pytest.mark.parametrize("name", ["fedfa", "ca2fl", "fadas"])
def test_config_parses_and_runs(tmp_path, name):
    check_config_runs(tmp_path, name, ["--trainer.algorithm.init_args.concurrency=4"])
