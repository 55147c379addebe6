"""The documentation in docs/ stays true: its examples run, every public hook and every preset is documented, the
generated algorithm pages are current, and the paths it names exist. (The site build itself, with warnings as
errors, runs in .ci/run after the tests.)"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
PAGES = [*sorted(p for p in DOCS.glob("*.md")), ROOT / "README.md"]
TESTED_BLOCKS = {
    "python-api",
    "callbacks",
    "custom-algorithm",
    "preset",
    "device-model",
    "partitioner",
    "privacy",
    "flower",
}  # flower: run by tests/data/test_flower.py
TESTED_BLOCKS |= {"per-client"}
TESTED_BLOCKS |= {"ditto"}  # run by tests/test_ditto.py


def _text(name: str) -> str:
    return (DOCS / name).read_text()


def _block(text: str, tag: str) -> str:
    match = re.search(rf"<!-- test: {tag} -->\n```python\n(.*?)```", text, re.S)
    assert match, f"block {tag!r} not found"
    return match.group(1)


def _run(page: str, tag: str) -> dict:
    namespace: dict = {"__name__": f"docs_{tag.replace('-', '_')}"}
    exec(compile(_block(_text(page), tag), f"docs/{page}", "exec"), namespace)
    return namespace


def _generator():
    spec = importlib.util.spec_from_file_location("algorithm_pages", DOCS / "_ext" / "algorithm_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_python_block_is_run_or_compiled():
    """A Python block in the README or a docs page is either run by a test here (``<!-- test: tag -->``) or, when it
    needs what a test cannot have (GPUs, a cluster), marked ``<!-- compile-only: why -->``: it is compiled and its
    imports are executed, so the names it uses exist."""
    seen = set()
    for page in PAGES:
        text = page.read_text()
        for match in re.finditer(r"(<!-- (test|compile-only): ([^>]*?) -->\n)?```python\n(.*?)```", text, re.S):
            assert match.group(1), f"{page.name}: a Python block without <!-- test: tag --> or <!-- compile-only -->"
            code = match.group(4)
            compile(code, page.name, "exec")
            if match.group(2) == "test":
                seen.add(match.group(3))
            else:
                imports = "\n".join(ln for ln in code.splitlines() if ln.startswith(("import ", "from ")))
                exec(compile(imports, page.name, "exec"), {})
    assert seen == TESTED_BLOCKS, f"blocks without a test here, or tests without a block: {seen ^ TESTED_BLOCKS}"


def test_custom_algorithm_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = _run("extending.md", "custom-algorithm")
    trainer = namespace["trainer"]
    assert trainer.algorithm.name == "MyAsync" and trainer.summary["versions"] == 200
    assert trainer.summary["best_accuracy"] > 0.5
    assert (tmp_path / "runs" / "MyAsync").is_dir()
    assert namespace["LossAwareWeight"]().state_dict() == {"mean_loss": None}


def test_callbacks_example_keeps_a_loadable_best_global_model(tmp_path, monkeypatch):
    from lit_asyncfl.data import DigitsDataModule

    monkeypatch.chdir(tmp_path)
    namespace = _run("callbacks.md", "callbacks")
    trainer, best, model = namespace["trainer"], namespace["best"], namespace["model"]
    assert best.best_model_score == trainer.summary["best_accuracy"] > 0.5
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5)
    assert trainer.validate(model, dm, verbose=False)[0]["val_acc"] == best.best_model_score
    assert trainer.summary["stop_reason"] in ("early_stopping", "max_virtual_time")


def test_privacy_example_reports_epsilon(capsys):
    pytest.importorskip("opacus")
    namespace = _run("privacy.md", "privacy")
    summary = namespace["trainer"].summary
    assert 0 < summary["dp_epsilon"] < float("inf") and summary["dp_steps"] == 5
    assert capsys.readouterr().out.split() == [str(summary["dp_epsilon"]), "1e-05"]


def test_per_client_example_reports_the_clients_and_personalized_accuracy(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = _run("per_client.md", "per-client")
    assert namespace["trainer"].summary["clients_evaluated"] == 20
    assert len(capsys.readouterr().out.split()) == 3


def test_preset_example_records_and_checks_its_arguments():
    namespace = _run("extending.md", "preset")
    algorithm, cls = namespace["algorithm"], namespace["MyAsync"]
    assert algorithm.hparams["max_staleness"] == 5 and algorithm.server_callbacks[0].max_staleness == 5
    with pytest.raises(ValueError, match="max_staleness"):
        cls(max_staleness=-1)


def test_device_model_example(capsys):
    namespace = _run("extending.md", "device-model")
    assert capsys.readouterr().out.strip() == "[0.5, 5.0]"
    profiles = namespace["profiles"]
    slow = profiles.time_per_sample == 5.0
    assert 0.15 < slow.mean() < 0.25  # 20% of the devices are slow
    assert np.allclose(profiles.bandwidth[slow], 1e5 / 10) and np.allclose(profiles.bandwidth[~slow], 1e5)


def test_partitioner_example_gives_every_sample_to_one_client_of_its_class():
    namespace = _run("extending.md", "partitioner")
    targets = np.repeat(np.arange(10), 7)
    parts = namespace["OneClassEach"]()(targets, 20, np.random.default_rng(0))
    assert len(parts) == 20 and sorted(np.concatenate(parts).tolist()) == list(range(len(targets)))
    for client, part in enumerate(parts):
        assert set(targets[part].tolist()) == {client % 10}
    assert namespace["dm"] is not None


def _hooks(cls: type) -> list[str]:
    return [
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


@pytest.mark.parametrize(
    "path",
    [
        "lit_asyncfl.server.base.ServerCallback",
        "lit_asyncfl.server.aggregators.Aggregator",
        "lit_asyncfl.client.callbacks.ClientCallback",
        "lit_asyncfl.callbacks.base.Callback",
    ],
)
def test_every_public_hook_is_documented(path):
    """Every public hook of the extension points is named on the Extending page (a new hook fails here until the
    page says when it is called)."""
    module, name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    page = _text("extending.md")
    missing = [hook for hook in _hooks(cls) if f"`{hook}" not in page]
    assert not missing, f"{name} hooks missing from docs/extending.md: {missing}"


def test_algorithm_pages_are_current():
    """Every preset has its generated page, and the committed pages are what the generator writes."""
    from lit_asyncfl.algorithms import PRESETS

    generator = _generator()
    wanted = generator.pages()
    assert {p.stem for p in wanted} == {*PRESETS, "index"}
    stale = [p.name for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    assert not stale, f"docs/algorithms pages missing or stale: {stale}; run python docs/_ext/algorithm_pages.py"
    extra = [p.name for p in (DOCS / "algorithms").glob("*.md") if p not in wanted]
    assert not extra, f"pages of presets that are gone: {extra}; run python docs/_ext/algorithm_pages.py"


def test_paths_named_in_the_docs_exist():
    """Every config, script and docs file a page names exists."""
    for page in [*PAGES, *(DOCS / "algorithms").glob("*.md")]:
        for path in re.findall(
            r"(?<![\w/.])((?:configs|scripts|docs|lit_asyncfl)/[\w./-]+\.(?:yaml|py|md|png|pt))", page.read_text()
        ):
            if not re.search(r"/[A-Z]+\.", path):  # a placeholder such as docs/benchmarks/NAME.md
                assert (ROOT / path).exists(), f"{page.name} names {path}, which does not exist"


def test_benchmark_tables_say_how_when_and_where_they_were_measured():
    tables = sorted((DOCS / "benchmarks").glob("*.md"))
    assert tables
    for table in tables:
        text = table.read_text()
        assert re.search(r"\*Measured by `python scripts/\w+\.py [^`]*` on .+\b\d{4}-\d{2}-\d{2}\b", text), table.name
        assert "\n| " in text, f"{table.name} has no table"


def test_docstrings_cite_only_the_repository():
    """Docstrings do not send the reader to documents outside the repository."""
    pattern = re.compile(r"algorithms\.md|design\.md|\.\./shared|/work/shared|\(spec\b|\bthe spec\b|spec's|\bspec\)")
    for path in (ROOT / "lit_asyncfl").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
