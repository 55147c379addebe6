"""The package layout: every public class is exported and documented once; the module paths users imported before
the client package was split keep working and give the same objects."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lit_asyncfl

ROOT = Path(__file__).resolve().parents[1]

#: Each module path of ``lit_asyncfl.client`` before the split (and the old ``lit_asyncfl.validation_loop``) -> the
#: public names it had (recorded from the tree before the move) and where they live now.
OLD_PATHS = {
    "lit_asyncfl.client.callbacks": (
        "lit_asyncfl.client_callbacks.base",
        "ClientCallback LearningRateDecay ProximalTerm",
    ),
    "lit_asyncfl.client.client_state_callbacks": (
        "lit_asyncfl.client_callbacks.client_state",
        "DynamicRegularizer ModelContrastive",
    ),
    "lit_asyncfl.client.cohort": (
        "lit_asyncfl.engines.cohort",
        "CohortExecutor CohortJobTrainer CohortTrainer DEFAULT_MAX_COHORT MIN_BATCHED SUPPORTED_CALLBACKS "
        "check_cohort_support",
    ),
    "lit_asyncfl.client.contract": (
        "lit_asyncfl.loops.contract",
        "DATAMODULE_BATCH_HOOKS TRAINING_HOOKS check_lightning_contract check_model_fits_data",
    ),
    "lit_asyncfl.client.engine_base": ("lit_asyncfl.engines.base", "LocalEngine generators_kept parse_optimizers"),
    "lit_asyncfl.client.engines": (
        "lit_asyncfl.executors.factory",
        "ACCELERATORS DEFAULT_NUM_THREADS ENGINES build_executor check_engine make_local_trainer resolve_device",
    ),
    "lit_asyncfl.client.fast_engine": ("lit_asyncfl.engines.fast", "LocalTrainer parse_optimizers"),
    "lit_asyncfl.client.fresh_merge": ("lit_asyncfl.client_callbacks.fresh_merge", "FreshModelMerge"),
    "lit_asyncfl.client.job_trainer": ("lit_asyncfl.loops.job_trainer", "AVAILABLE JobTrainer"),
    "lit_asyncfl.client.kernels": (
        "lit_asyncfl.engines.kernels",
        "ONEDNN_AUTO_MAX_BATCH ONEDNN_AUTO_MAX_ELEMENTS OneDNN choose_onednn largest_conv_input",
    ),
    "lit_asyncfl.client.lightning_engine": ("lit_asyncfl.engines.lightning", "LightningLocalTrainer TRAINER_FLAGS"),
    "lit_asyncfl.client.ray_executor": (
        "lit_asyncfl.executors.ray",
        "EXECUTORS MAX_WORKER_FAILURES RayExecutor TASKS_PER_WORKER check_executor ray_available release_workers",
    ),
    "lit_asyncfl.client.sequential": ("lit_asyncfl.executors.sequential", "SequentialExecutor"),
    "lit_asyncfl.client.staleness_callbacks": (
        "lit_asyncfl.client_callbacks.staleness",
        "DecayedCorrection DelayAdaptiveStepSize FREQUENCIES ParticipationLearningRate",
    ),
    "lit_asyncfl.client.time_slots": ("lit_asyncfl.rl.time_slots", "ACTIONS SlotPolicy TimeSlotSelector first_request"),
    "lit_asyncfl.validation_loop": ("lit_asyncfl.loops.validation_loop", "EpochLog JobLog STAGES run_evaluation"),
}

#: Each module merged into the module of its concept -> the public names it had (recorded from the tree before the
#: merge) and the module they are in now.
MERGED_PATHS = {
    "lit_asyncfl.core.arrivals": ("lit_asyncfl.core.jobs", "ArrivalQueue"),
    "lit_asyncfl.core.clock": ("lit_asyncfl.core.simulator", "Event EventQueue"),
    "lit_asyncfl.core.seeding": ("lit_asyncfl.core.update", "derive_seed"),
    "lit_asyncfl.engines.kernels": (
        "lit_asyncfl.engines.base",
        "ONEDNN_AUTO_MAX_BATCH ONEDNN_AUTO_MAX_ELEMENTS OneDNN choose_onednn largest_conv_input",
    ),
    "lit_asyncfl.loops.job_trainer": ("lit_asyncfl.loops.stand_in", "AVAILABLE JobTrainer"),
    "lit_asyncfl.loops.log": ("lit_asyncfl.loops.stand_in", "EpochLog JobLog"),
    "lit_asyncfl.server.weights": ("lit_asyncfl.server.aggregators", "DataSizeWeight StalenessWeight"),
}

#: ``lit_asyncfl.client.__all__`` before the split.
OLD_CLIENT_ALL = (
    "ENGINES ClientCallback CohortExecutor CohortTrainer DynamicRegularizer LearningRateDecay LightningLocalTrainer "
    "LocalTrainer ModelContrastive ProximalTerm RayExecutor SequentialExecutor build_executor release_workers"
)

#: Packages outside the rule, and why.
UNEXPORTED_PACKAGES = {
    "lit_asyncfl.client": "the old import paths only (aliases of the modules in their new folders)",
    "lit_asyncfl.core": "the simulation's engine room (simulator, server, clock, flat weights), described on the "
    "design page; its classes reach users as hook arguments",
}

#: Public classes of top-level modules that are not in the API reference, and why.
UNDOCUMENTED = {
    "lit_asyncfl.callbacks.connector.CallbackConnector": "the trainer's own wiring of the simulator to run callbacks",
    "lit_asyncfl.cli.FederatedCLI": "reached through the lit-asyncfl command (docs/cli.md)",
    "lit_asyncfl.evaluation.GlobalEvaluation": "the trainer's evaluation loop (FederatedTrainer's eval_every, monitor)",
    "lit_asyncfl.tracking.WandbRun": "built by the trainer for a WandbLogger (docs/tracking.md)",
}


def _modules():
    for info in pkgutil.walk_packages(lit_asyncfl.__path__, "lit_asyncfl."):
        if info.name.endswith("__main__"):
            continue
        yield info.name, info.ispkg, importlib.import_module(info.name)


def _public_classes():
    for name, is_package, module in _modules():
        for attr, obj in vars(module).items():
            if inspect.isclass(obj) and obj.__module__ == name and not attr.startswith("_"):
                yield (name if is_package else name.rpartition(".")[0]), f"{name}.{attr}", obj


def _documented() -> dict[int, set[str]]:
    """id(object) -> the API reference's directives that document it (an alias in one ``__all__`` counts once)."""
    page = (ROOT / "docs" / "api.md").read_text()
    documented: dict[int, set[str]] = {}
    for kind, target in re.findall(r"^\.\. (automodule|autoclass):: (\S+)", page, re.M):
        if kind == "autoclass":
            module, _, attr = target.rpartition(".")
            documented.setdefault(id(getattr(importlib.import_module(module), attr)), set()).add(target)
            continue
        module = importlib.import_module(target)
        if hasattr(module, "__all__"):
            members = [getattr(module, name) for name in module.__all__]
        else:
            members = [obj for obj in vars(module).values() if getattr(obj, "__module__", None) == target]
        for obj in members:
            documented.setdefault(id(obj), set()).add(target)
    return documented


def test_every_public_class_is_exported_by_its_package_and_documented_once():
    documented = _documented()
    not_exported, not_documented, twice = [], [], []
    for package, path, cls in _public_classes():
        if any(path.startswith(p + ".") for p in UNEXPORTED_PACKAGES) or path in UNDOCUMENTED:
            continue
        if package != "lit_asyncfl":  # a top-level module is its own unit (documented as a whole)
            exported = importlib.import_module(package).__dict__.get("__all__", [])
            if not any(getattr(importlib.import_module(package), name, None) is cls for name in exported):
                not_exported.append(path)
        places = documented.get(id(cls), set())
        if not places:
            not_documented.append(path)
        elif len(places) > 1:
            twice.append(f"{path}: {sorted(places)}")
    assert not not_exported, f"public classes missing from their package's __all__: {not_exported}"
    assert not not_documented, f"public classes missing from docs/api.md: {not_documented}"
    assert not twice, f"documented twice (Sphinx warns of duplicate descriptions): {twice}"


def test_the_rule_sees_a_class_left_out():
    """The check above finds an unexported class (so it can fail)."""
    import lit_asyncfl.engines as engines

    saved = engines.__all__
    engines.__all__ = [name for name in saved if name != "OneDNN"]
    try:
        with pytest.raises(AssertionError, match=r"lit_asyncfl\.engines\.base\.OneDNN"):
            test_every_public_class_is_exported_by_its_package_and_documented_once()
    finally:
        engines.__all__ = saved


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_module_path_is_the_moved_module(old):
    new, names = OLD_PATHS[old]
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    for name in names.split():
        assert getattr(old_module, name) is getattr(new_module, name), f"{old}.{name}"
    if not new.endswith(".ray"):  # (the Ray executor's old module is now a package of four modules)
        assert old_module is new_module


@pytest.mark.parametrize("old", sorted(MERGED_PATHS))
def test_a_merged_module_path_is_the_module_it_was_merged_into(old):
    new, names = MERGED_PATHS[old]
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    assert old_module is new_module
    package, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(package), leaf) is new_module  # ``import a.b.old; a.b.old.X`` works
    for name in names.split():
        assert hasattr(new_module, name), f"{old}.{name}"


def test_merged_modules_are_the_ones_listed():
    assert {old: new for old, (new, _) in MERGED_PATHS.items()} == lit_asyncfl.MERGED_MODULES


@pytest.mark.parametrize(
    ("paths", "more", "shown", "module"),
    [
        (OLD_PATHS, [f"from lit_asyncfl.client import {', '.join(OLD_CLIENT_ALL.split())}"],
         "lit_asyncfl.client.fast_engine.LocalTrainer", "lit_asyncfl.engines.fast"),
        (MERGED_PATHS, [], "lit_asyncfl.server.weights.StalenessWeight", "lit_asyncfl.server.aggregators"),
    ],
    ids=["moved", "merged"],
)  # fmt: skip
def test_the_old_paths_import_in_a_fresh_process(paths, more, shown, module):
    """``from <old path> import <name>`` as a user's script writes it, before anything else was imported, and
    ``import <old path>``."""
    lines = [f"from {old} import {', '.join(names.split())}" for old, (_, names) in paths.items()]
    lines += more
    lines += [f"import {old}" for old in paths]
    lines.append(f"print({shown}.__module__)")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)], cwd=ROOT, capture_output=True, text=True, check=False, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == module


def test_an_old_path_leaves_the_module_it_names_unchanged():
    """Importing an old path gives the merged module itself, whose ``__spec__`` still names its own path (the import
    system sets the old path's spec on the module it is handed; ``importlib.reload`` and tools read it)."""
    import importlib

    for old, (new, _) in MERGED_PATHS.items():
        module = importlib.import_module(old)
        assert module is importlib.import_module(new)
        assert (module.__name__, module.__spec__.name) == (new, new), old


def test_the_old_client_package_exports_what_it_did():
    import lit_asyncfl.client as client

    missing = [name for name in OLD_CLIENT_ALL.split() if name not in client.__all__ or not hasattr(client, name)]
    assert not missing
