"""Nothing silently accepted: every public constructor refuses bad settings, naming the parameter and the value.

The cases come from ``scripts/fuzz_settings.py`` (``python scripts/fuzz_settings.py`` prints the figures): every
numeric, count, bool and string parameter of the presets, server callbacks, schedulers, controllers, client
callbacks, device models, partitioners, data modules, models and ``FederatedTrainer`` gets bad values; each must
raise at construction naming the parameter and the value, or be listed as meaningful in the script's ``ALLOWED``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "fuzz_settings.py"


def _load_fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_settings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_settings"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()
CASES = list(fuzz.cases())


def test_the_fuzz_covers_every_family_of_constructors():
    names = {case.target.name for case in CASES}
    assert {"FedASMU", "FedHist", "FedADT", "ASFL", "SAFA"} <= names  # presets
    assert {"DistillationCorrection", "HistoryAwareWeight", "DeltaAverage"} <= names  # server
    assert {"PeriodicTrigger", "SemiAsyncRounds", "KAsync"} <= names  # schedulers
    assert {"TimeSlotSelector", "FreshModelMerge", "ProximalTerm"} <= names  # client callbacks
    assert {"UniformResponse", "MobileEdgeDevices"} <= names  # device models
    assert {"DigitsDataModule", "SyntheticDataModule", "CIFAR10DataModule", "Dirichlet"} <= names  # data
    assert {"LeNet5", "VGG11", "TextCNN", "LinearRegression"} <= names  # models
    assert "FederatedTrainer" in names
    assert len(CASES) > 2000


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_bad_setting_is_refused_naming_it_or_is_listed_as_meaningful(case):
    outcome, detail = fuzz.run(case)
    assert outcome in ("raised", "allowed"), f"{outcome}: {detail}"


def test_every_allow_list_entry_is_used_and_figures_add_up():
    result = fuzz.figures()
    assert result["unused_allowed"] == []
    assert result["unclear"] == result["silent"] == 0, result["failures"]
    assert result["raised"] + result["allowed"] == result["cases"] == len(CASES)
    assert result["raised"] > 8 * result["allowed"]  # most bad values are bad: the allow-list is the exception


@pytest.mark.parametrize(
    ("value", "expected"),
    [(float("nan"), True), (1.5, True), (0, False), ("nan", True)],
)
def test_the_message_check_needs_the_parameter_and_the_value(value, expected):
    message = f"lambda0 must be a finite number > 0, got {value!r}" if expected else "something else, got 0"
    assert fuzz.names_parameter_and_value(message, "lambda0", value) is expected
    assert not fuzz.names_parameter_and_value(f"xlambda0 must be > 0, got {value!r}", "lambda0", value)
    assert not fuzz.names_parameter_and_value("a finite number, got nan", "a", float("nan"))  # 'a' as a word
