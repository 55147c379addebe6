"""What ASO-Fed and FedSA (FedASMU's Table 1 baselines, as third parties re-implemented them) share as presets:
determinism and exact resume, refused settings, the cohort engine's refusal, the compositions, the comparison spec
and configs that run. Each algorithm's own checks: test_asofed.py, test_fedsa.py; their formulas and mechanisms:
functional/test_asofed.py, functional/test_fedsa.py, client_callbacks/test_staleness.py,
server/test_data_fraction.py."""

from __future__ import annotations

import math

import pytest
import yaml
from builders import ROOT, check_config_runs
from conftest import assert_same, check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import PRESETS, ASOFed, FedSA
from lit_asyncfl.client.callbacks import ProximalTerm
from lit_asyncfl.client.staleness_callbacks import DecayedCorrection, DelayAdaptiveStepSize, ParticipationLearningRate
from lit_asyncfl.schedulers import BufferedConcurrency, KeepConcurrency
from lit_asyncfl.server import DataSizeWeight, DeltaAverage, ModelAverage, StalenessBound
from lit_asyncfl.server.data_fraction import DataFractionWeight

LR = 0.05  # conftest's LeNet5(lr=0.05)


# ---------------------------------------------------------------------------------------------------------- formulas


# ------------------------------------------------------------------------------------------- runs replayed by hand


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "asofed": (lambda: ASOFed(concurrency=4, log_base=2.0), 16),
    "fedsa": (lambda: FedSA(buffer_size=3, concurrency=6, max_staleness=2), 10),
    "fedsa_count": (lambda: FedSA(buffer_size=3, concurrency=6, max_staleness=2, frequency="count"), 10),
}


def state_is_midway(name: str, algorithm) -> bool:
    if name == "asofed":  # some client has a history (h, previous pseudo-gradient, delays) to carry over
        return any(j >= 2 for j in algorithm.client_callbacks[0].jobs.values())
    if name.startswith("fedsa"):  # "share" also carries the counts taken at the in-flight jobs' dispatches
        lr = algorithm.client_callbacks[0]
        return (
            len(algorithm.aggregator.buffer) > 0
            and any(c >= 2 for c in lr.participations.values())
            and (lr.frequency == "count" or any(t > 0 for _, t in lr.dispatched.values()))
        )
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: state_is_midway(name, algorithm)
    )
    a, b = resumed.simulator.server.state_dict(), full.simulator.server.state_dict()
    assert_same(a["aggregator"], b["aggregator"])
    assert_same(a["callbacks"], b["callbacks"])
    for x, y in zip(resumed.algorithm.client_callbacks, full.algorithm.client_callbacks):
        assert_same(x.state_dict(), y.state_dict())


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ASOFed(lam=-0.1), r"lam must be >= 0, got -0.1"),
        (lambda: ASOFed(beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
        (lambda: ASOFed(log_base=1.0), r"log_base must be > 1, got 1.0"),
        (lambda: ASOFed(concurrency=0), r"concurrency must be >= 1, got 0"),
        (lambda: FedSA(buffer_size=0), r"buffer_size must be >= 1, got 0"),
        (lambda: FedSA(max_staleness=-1), r"max_staleness must be >= 0, got -1"),
        (lambda: FedSA(base_lr=0.0), r"base_lr must be a finite number > 0 or None, got 0.0|base_lr must be > 0"),
        (lambda: FedSA(concurrency=1.5), r"concurrency"),
        (lambda: DecayedCorrection(beta=float("nan")), r"beta must be a finite number in \[0, 1\], got nan"),
        (lambda: DelayAdaptiveStepSize(log_base=float("inf")), r"log_base must be a finite number > 1, got inf"),
        (lambda: ParticipationLearningRate(base_lr=-1.0), r"base_lr must be > 0, got -1.0"),
        (lambda: FedSA(frequency="mean"), r"unknown frequency 'mean'; allowed: \['share', 'count'\]"),
        (lambda: ParticipationLearningRate(frequency=3), r"unknown frequency 3; allowed: \['share', 'count'\]"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("make", [ASOFed, FedSA])
def test_the_cohort_engine_refuses_the_stateful_client_callbacks_naming_the_alternative(tmp_path, make):
    with pytest.raises(ValueError, match=r"cannot run the client callback \w+ .*engine='fast'"):
        run(tmp_path, make(), max_versions=2, engine="cohort")


def test_presets_are_registered_and_are_the_re_implementations_compositions():
    assert PRESETS["asofed"] is ASOFed and PRESETS["fedsa"] is FedSA
    aso = ASOFed()
    assert type(aso.scheduler) is KeepConcurrency and aso.scheduler.concurrency == 1.0  # the paper: all
    assert type(aso.aggregator) is DeltaAverage
    assert (aso.aggregator.buffer_size, aso.aggregator.server_lr, aso.aggregator.normalize) == (1, 1.0, False)
    assert [type(cb) for cb in aso.server_callbacks] == [DataFractionWeight]
    step, prox, corr = aso.client_callbacks
    assert isinstance(step, DelayAdaptiveStepSize) and step.log_base == math.e
    assert type(prox) is ProximalTerm and prox.mu == 0.01
    assert isinstance(corr, DecayedCorrection) and corr.beta == 0.5
    assert not any(cb.runs_on_workers for cb in (step, corr))
    sa = FedSA()
    assert type(sa.scheduler) is BufferedConcurrency and (sa.scheduler.concurrency, sa.scheduler.max_staleness) == (
        1.0,
        None,
    )
    assert type(sa.aggregator) is ModelAverage and sa.aggregator.buffer_size == 30
    bound, size = sa.server_callbacks
    assert type(bound) is StalenessBound and bound.max_staleness == 3 and type(size) is DataSizeWeight
    (lr,) = sa.client_callbacks
    assert isinstance(lr, ParticipationLearningRate) and lr.base_lr is None and not lr.runs_on_workers
    assert lr.frequency == "share" and FedSA(frequency="count").client_callbacks[0].frequency == "count"
    assert ASOFed.__doc__.splitlines()[0].endswith("as re-implemented by AFL-Lib and FedOpt (not the authors).")
    assert "as re-implemented by a third-party Flower" in FedSA.__doc__.splitlines()[0]


def test_fedasmu_comparison_spec_and_the_benchmark_suite_include_the_presets():
    spec = yaml.safe_load((ROOT / "configs" / "compare" / "fedasmu_table1.yaml").read_text())
    assert spec["methods"]["ASO-Fed"][0] == "--trainer.algorithm=ASOFed"
    assert spec["methods"]["FedSA"][0] == "--trainer.algorithm=FedSA"
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    suite = text[text.index('"fedasmu": {') : text.index('"fedadt": {')]
    assert all(f'"{name}"' in suite for name in ("ASOFed", "FedSA"))


@pytest.mark.parametrize("name, overrides", [
    ("asofed", ["--trainer.algorithm.init_args.concurrency=4"]),
    ("fedsa", ["--trainer.algorithm.init_args.concurrency=6", "--trainer.algorithm.init_args.buffer_size=2"]),
])  # fmt: skip
def test_config_parses_and_runs(tmp_path, name, overrides):
    check_config_runs(tmp_path, name, overrides)
