"""The benchmark scripts' reporting: win tables and effect sizes, the tuning grid, and generated headers that name
a commit (never "+dirty") and no path of the measuring machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
import statistics
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str, folder: Path = ROOT / "scripts"):
    spec = importlib.util.spec_from_file_location(f"{name}_{abs(hash(folder))}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = load_script("bench_algorithms")
compare = load_script("compare")


def _row(method, seed, final, time=None):
    return {"method": method, "seed": seed, "alpha": 0.1, "final_accuracy": final, "time_to_target": time}


def test_win_table_pairs_seeds_and_gives_the_paired_effect_size():
    rows = [
        _row("A", 0, 0.90, 100.0), _row("A", 1, 0.80, None), _row("A", 2, 0.70, 300.0),
        _row("B", 0, 0.85, 200.0), _row("B", 1, 0.82, 150.0), _row("B", 2, 0.60, None),
    ]  # fmt: skip
    line = bench.win_rows(rows, "A", "B", 0.1, 0.8)
    diffs = [0.05, -0.02, 0.10]  # by hand: A - B per seed
    d = statistics.mean(diffs) / statistics.stdev(diffs)
    # accuracy wins: seeds 0 and 2; time wins: seed 0 (100 < 200) and seed 2 (300 < never), not seed 1 (never)
    assert line == (f"| A | B | 2/3 | 2/3 | {statistics.mean(diffs):+.3f} ± {statistics.stdev(diffs):.3f} | {d:+.2f} |")
    assert bench.win_rows(rows, "A", "C", 0.1, 0.8) is None  # no common seed
    f32 = lambda x: float(np.float32(x))  # noqa: E731  (summaries hold float32 accuracies)
    same = [_row("A", s, f32(0.9 + s / 360), 1.0) for s in (0, 1, 2)]
    same += [_row("B", s, f32(0.85 + s / 360), 2.0) for s in (0, 1, 2)]
    assert bench.win_rows(same, "A", "B", 0.1, 0.8).endswith("| +0.050 ± 0.000 | inf |")  # not 1e5 from float noise


def test_grid_points_give_algorithm_arguments_only_to_the_presets_that_take_them():
    grid = {"lr": [0.02, 0.05], "server_lr": [0.5, 1.0]}
    assert bench.grid_points("FedAsync", grid) == [{"lr": 0.02}, {"lr": 0.05}]  # FedAsync has no server_lr
    assert len(bench.grid_points("FedBuff", grid)) == 4
    assert {"lr": 0.05, "server_lr": 1.0} in bench.grid_points("FedHist-noINA", grid)  # an ablation's **kwargs
    assert bench.parse_grid(["lr=0.02,0.1"]) == {"lr": [0.02, 0.1]}
    with pytest.raises(SystemExit, match="expected KEY=V1,V2"):
        bench.parse_grid(["lr"])
    cli = compare.parse_grid(["model.init_args.lr=0.02,0.05", "trainer.algorithm.init_args.server_lr=1"])
    points = compare.grid_points("configs/quickstart.yaml", [], cli)  # the quickstart runs FedAsync
    assert points == [{"model.init_args.lr": "0.02"}, {"model.init_args.lr": "0.05"}]
    assert len(compare.grid_points("configs/quickstart.yaml", ["--trainer.algorithm=FedBuff"], cli)) == 2
    assert compare.point_label(points[0]) == "lr=0.02"


def test_the_tuning_criterion_is_the_mean_accuracy_over_the_last_quarter_of_virtual_time():
    history = [{"virtual_time": t, "accuracy": a} for t, a in [(0, 0.1), (700, 0.9), (760, 0.5), (1000, 0.7)]]
    assert compare.late_accuracy(history) == pytest.approx((0.5 + 0.7) / 2)  # 760 and 1000 are >= 750


def test_compare_tunes_each_method_on_separate_seeds_and_reports_the_chosen_point(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "cmp"
    argv = [
        "--base", "configs/quickstart.yaml", "--presets", "FedAsync", "FedBuff", "--seeds", "0", "--baseline",
        "FedAsync", "--out", str(out), "--grid", "model.init_args.lr=0.01,0.2",
        "trainer.algorithm.init_args.server_lr=1", "--tune-seeds", "100",
        "--set", "trainer.num_clients=10", "trainer.max_versions=4", "trainer.max_virtual_time=null",
        "trainer.eval_every=2", "trainer.algorithm.init_args.concurrency=3",
    ]  # fmt: skip
    assert compare.main(argv) == 0
    tuned = {p.parent.parent.name for p in (out / "runs" / "FedBuff" / "tune").glob("*/seed_100/result.json")}
    assert tuned == {"lr=0.01,server_lr=1", "lr=0.2,server_lr=1"}
    assert {p.name for p in (out / "runs" / "FedAsync" / "tune").iterdir()} == {"lr=0.01", "lr=0.2"}
    runs = out / "runs" / "FedAsync"
    scores = {
        label: compare.late_accuracy(
            json.loads((runs / "tune" / label / "seed_100" / "result.json").read_text())["history"]
        )
        for label in ("lr=0.01", "lr=0.2")
    }
    best = max(scores, key=scores.get)
    reported = json.loads((runs / "seed_0" / "result.json").read_text())
    assert f"--model.init_args.lr={best.split('=')[1]}" in reported["arguments"]
    table = (out / "comparison.md").read_text()
    assert "Tuning grid" in table and f"FedAsync: {best}" in table and "| FedBuff | " in table
    with pytest.raises(SystemExit, match="overlap the reported seeds"):
        compare.main([*argv, "--tune-seeds", "0"])


def _copy_docs_tables(tmp_path: Path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "docs_tables.py", tmp_path / "scripts")
    (tmp_path / "docs" / "benchmarks").mkdir(parents=True)
    (tmp_path / "docs" / "benchmarks" / "old.md").write_text("old\n")
    (tmp_path / "code.py").write_text("x = 1\n")

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=t@t", "-c", "user.name=t", "add", ".")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    return load_script("docs_tables", tmp_path / "scripts")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_docs_tables_refuse_uncommitted_code_but_not_their_own_tables(tmp_path):
    tables = _copy_docs_tables(tmp_path)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True)
    (tmp_path / "docs" / "benchmarks" / "old.md").write_text("regenerated\n")  # a table the scripts rewrote
    (tmp_path / "untracked.txt").write_text("scratch\n")
    assert tables.clean_commit() == head.stdout.strip()
    (tmp_path / "code.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match=r"commit or stash these changes first(.|\n)*code\.py"):
        tables.clean_commit()
    path = tables.write_docs_table("t", "| a |", argv=[str(tmp_path / "scripts" / "bench.py")], commit="abc1234")
    assert "commit abc1234." in path.read_text() and "+dirty" not in path.read_text()


def test_generated_headers_carry_no_machine_paths(tmp_path):
    tables = load_script("docs_tables")
    argv = ["--out", str(tmp_path / "deep" / "fedasmu"), f"--spec={ROOT / 'configs' / 'compare' / 'x.yaml'}"]
    assert tables.portable(argv) == ["--out", "fedasmu", "--spec=configs/compare/x.yaml"]
    for page in (ROOT / "docs" / "benchmarks").glob("*.md"):
        header = page.read_text().split("\n\n", 2)[:2]
        assert "/work/" not in "".join(header) and str(tmp_path.anchor + "tmp") not in "".join(header), page.name
        assert "+dirty" not in "".join(header), page.name


def test_report_has_the_grid_the_chosen_points_and_the_work_per_virtual_second():
    cfg = {"target": 0.8, "partition": None, "grid": {"lr": [0.05]}, "chosen": {"A|0.1": {"lr": 0.05}}}
    rows = [
        {**_row(m, s, f, 10.0), "best_accuracy": f, "versions_to_target": 3, "updates_received": 500,
            "updates_discarded": 50,
         "history": [{"virtual_time": 0.0, "accuracy": 0.1}, {"virtual_time": 2000.0, "accuracy": f}]}
        for m, s, f in [("A", 0, 0.9), ("A", 1, 0.8), ("B", 0, 0.7), ("B", 1, 0.75)]
    ]  # fmt: skip
    text = bench.report(rows, ["A", "B"], [0.1], cfg, "HEADER", ["A"])
    assert "| Dirichlet 0.1 | A | 0.8500 ± 0.0707 |" in text and "| 250.0 | 10.0% | lr=0.05 |" in text
    assert "| B |" in text and "| suite default |" in text
    assert "| A | B | 2/2 | 0/2 | +0.125 ± 0.106 |" in text  # diffs 0.2, 0.05; equal times are no win
