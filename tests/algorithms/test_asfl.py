"""ASFL and its baselines as whole federated runs: determinism, resumption, policies, the episode-training script."""

from __future__ import annotations

import csv
import importlib.util
import warnings

import numpy as np
import pytest
import torch
from builders import ROOT
from conftest import global_weights, make_trainer

from lit_asyncfl.algorithms import ASFL, SAFA, FedCS, Oort
from lit_asyncfl.data import DigitsDataModule, QuantitySkew
from lit_asyncfl.functional.asfl import latency_objective
from lit_asyncfl.mobility import MobileEdgeDevices
from lit_asyncfl.models import LeNet5
from lit_asyncfl.rl import STATE_FEATURES, FixedAction, SACController

SETTING = {"selected": 4, "rounds": 6, "max_latency": 300.0, "alpha_pref": 0.07, "beta_pref": 0.09}


def fit(tmp_path, algorithm, **kwargs):
    kwargs.setdefault("max_versions", SETTING["rounds"])
    ckpt = kwargs.pop("ckpt_path", None)
    trainer = make_trainer(
        tmp_path, algorithm, num_clients=12, local_epochs=2, device_model=MobileEdgeDevices(), eval_every=1, **kwargs
    )
    trainer.fit(LeNet5(lr=0.1), datamodule=DigitsDataModule(partition=QuantitySkew(0.3), batch_size=5), ckpt_path=ckpt)
    return trainer


def rounds_of(trainer):
    """The round rows of the history (without the wall-clock column)."""
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in trainer.history if "round" in r]


def history_of(trainer):
    """Every history row (without the wall-clock column)."""
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in trainer.history]


def test_same_seed_gives_the_same_weights_and_rounds(tmp_path):
    a = fit(tmp_path / "a", ASFL(controller=FixedAction(2, 1), **SETTING))
    b = fit(tmp_path / "b", ASFL(controller=FixedAction(2, 1), **SETTING))
    assert torch.equal(global_weights(a), global_weights(b))
    assert rounds_of(a) == rounds_of(b)
    assert len(rounds_of(a)) == SETTING["rounds"] and a.summary["rounds"] == SETTING["rounds"]
    assert sum(r["deprecated"] for r in rounds_of(a)) > 0  # tau = 1 with 12 devices: some are forced to restart


def test_resume_from_a_midway_checkpoint_equals_the_uninterrupted_run(tmp_path):
    full = fit(tmp_path / "full", ASFL(controller=FixedAction(2, 1), **SETTING))
    stop_at = 0.47 * full.simulator.now + 0.123
    first = fit(tmp_path / "first", ASFL(controller=FixedAction(2, 1), **SETTING), max_virtual_time=stop_at)
    assert 0 < first.simulator.server.version < SETTING["rounds"] and first.simulator.in_flight
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = fit(tmp_path / "resumed", ASFL(controller=FixedAction(2, 1), **SETTING), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed.simulator.now == full.simulator.now
    assert resumed.summary["objective"] == full.summary["objective"]
    assert history_of(resumed) == history_of(full)  # every row, versions 0..6 (rows were once dropped)


def test_resume_is_exact_with_a_sampling_policy_and_with_safa(tmp_path):
    policy = tmp_path / "policy.pt"
    fresh = SACController(train=True, seed=5)
    fresh.setup(SETTING["selected"])
    fresh.save(policy)

    def sampling():
        return ASFL(controller=SACController(policy=str(policy), greedy=False, seed=1), **SETTING)

    for name, make in (("sac", sampling), ("safa", lambda: SAFA(**SETTING))):
        full = fit(tmp_path / name / "full", make())
        ends = [r["total_latency"] for r in rounds_of(full)]  # virtual time at each round's end
        first = fit(tmp_path / name / "first", make(), max_virtual_time=0.5 * (ends[2] + ends[3]) + 0.0123)
        assert first.simulator.server.version == 3  # stopped inside round 4
        ckpt = next((tmp_path / name / "first").rglob("last.ckpt"))
        resumed = fit(tmp_path / name / "resumed", make(), ckpt_path=str(ckpt))
        assert torch.equal(global_weights(resumed), global_weights(full)), name
        assert rounds_of(resumed)[-1] == rounds_of(full)[-1], name
        assert history_of(resumed) == history_of(full), name


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: FixedAction(1.5, 1), "num_picked"),
        (lambda: FixedAction(3, None), "lag_tolerance"),
        (lambda: SACController(batch_size=0), "batch_size"),
        (lambda: SACController(picked_choices=[2.7]), "picked_choices"),
        (lambda: ASFL(alpha_pref=float("nan")), "alpha_pref"),
        (lambda: MobileEdgeDevices(speed=float("nan")), "speed"),
        (lambda: ASFL(controller=FixedAction(), policy="p.pt"), "either controller or policy"),
    ],
)
def test_bad_asfl_arguments_are_named(build, match):
    with pytest.raises(ValueError, match=match):
        build()


@pytest.mark.parametrize("preset", [ASFL, SAFA, FedCS, Oort], ids=lambda p: p.__name__)
def test_every_preset_reports_the_objective_of_its_final_accuracy_and_total_latency(tmp_path, preset):
    kwargs = {"controller": FixedAction(3, 2)} if preset is ASFL else {}
    trainer = fit(tmp_path, preset(**kwargs, **SETTING))
    s, rows = trainer.summary, rounds_of(trainer)
    assert s["rounds"] == SETTING["rounds"] and len(rows) == SETTING["rounds"]
    assert s["total_latency"] == pytest.approx(sum(r["round_latency"] for r in rows))
    expected = latency_objective(s["final_accuracy"], s["total_latency"], 300.0, 0.07, 0.09)
    assert s["objective"] == pytest.approx(expected)
    if preset in (FedCS, Oort):  # synchronous: every selected device is waited for, nobody is left training
        assert all(r["deprecated"] == 0 for r in rows) and s["updates_aggregated"] == s["updates_received"]


def test_a_saved_policy_reloads_with_its_choices_and_refuses_others(tmp_path):
    c = SACController(picked_choices=[1, 2, 3], tolerance_choices=[1, 2], seed=3)
    with pytest.warns(UserWarning, match="untrained agent"):
        c.setup(num_selected=3)
    path = tmp_path / "policy.pt"
    c.save(path)
    loaded = SACController(picked_choices=[1, 2, 3], tolerance_choices=[1, 2], policy=str(path), seed=99)
    loaded.setup(num_selected=3)
    states = np.random.default_rng(0).normal(size=(20, len(STATE_FEATURES)))
    assert [c.act(s) for s in states] == [loaded.act(s) for s in states]
    wrong = SACController(picked_choices=[2, 4, 6], tolerance_choices=[1, 2], policy=str(path))
    with pytest.raises(ValueError, match="chooses M from"):
        wrong.setup(num_selected=6)
    with pytest.raises(ValueError, match="does not exist"):
        SACController(policy=str(tmp_path / "missing.pt"))


def test_a_training_controller_stores_every_round_and_learns_once_it_has_a_batch(tmp_path):
    controller = SACController(train=True, batch_size=8, updates_per_round=2, seed=0)
    algo = ASFL(controller=controller, **SETTING)
    fit(tmp_path / "e1", algo)
    assert controller.agent.buffer.size == SETTING["rounds"] and controller.agent.updates == 0
    fit(tmp_path / "e2", algo)  # the same agent, a second episode: 12 transitions >= 8
    assert controller.agent.buffer.size == 2 * SETTING["rounds"]
    assert controller.agent.updates == 2 * (2 * SETTING["rounds"] - 8 + 1)
    assert controller.agent.buffer.dones[: controller.agent.buffer.size].sum() == 2  # one terminal round per episode


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_episode_training_saves_a_policy_that_inference_follows_greedily(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    train = load_script("train_asfl")
    out = tmp_path / "policy"
    common = ["--config", "configs/asfl/diabetes_regression.yaml", "--out", str(out), "--batch-size", "8"]
    short = ["--set", "trainer.algorithm.init_args.rounds=4", "trainer.max_versions=4"]
    assert train.main([*common, "--episodes", "2", *short]) == 0
    assert train.main([*common, "--episodes", "1", "--resume", *short]) == 0  # continues: episode 2
    with open(out / "episodes.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["episode"]) for r in rows] == [0, 1, 2] and [int(r["seed"]) for r in rows] == [1000, 1001, 1002]
    assert (out / "learning_curve.png").stat().st_size > 0
    assert (out / "config.yaml").read_text() == (ROOT / "configs/asfl/diabetes_regression.yaml").read_text()
    assert torch.load(out / "policy.pt", weights_only=True)["episodes"] == 3
    with pytest.raises(SystemExit):  # refuses to overwrite a training run without --resume
        train.main([*common, "--episodes", "1", *short])
    cut = ["--set", "trainer.algorithm.init_args.rounds=4", "trainer.max_versions=3"]
    with pytest.raises(SystemExit):  # a budget that ends episodes early is refused before training
        train.main(["--config", "configs/asfl/diabetes_regression.yaml", "--out", str(tmp_path / "cut"), *cut])
    assert not (tmp_path / "cut" / "episodes.csv").exists()
    stop = ["--set", "trainer.algorithm.init_args.rounds=4", "trainer.max_virtual_time=1e-9"]
    with pytest.raises(SystemExit, match="episode 0 stopped after 0 of 4 rounds"):
        train.main(["--config", "configs/asfl/diabetes_regression.yaml", "--out", str(tmp_path / "stop"), *stop])

    from lit_asyncfl.cli import FederatedCLI

    args = [
        "--config", "configs/asfl/diabetes_regression.yaml",
        "--trainer.algorithm.init_args.controller=SACController",
        f"--trainer.algorithm.init_args.controller.policy={out / 'policy.pt'}",
        "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.print_summary=false",
        f"--trainer.default_root_dir={tmp_path / 'inference'}", "--trainer.seed=7",
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        cli = FederatedCLI(args=args, run=False)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    controller = cli.trainer.algorithm.scheduler.controller
    policy = str(out / "policy.pt")
    reference = SACController(picked_choices=list(range(1, 7)), tolerance_choices=[1, 2, 3, 4], policy=policy)
    reference.setup(6)
    rows = rounds_of(cli.trainer)
    assert len(rows) == 50 and controller is not reference
    for r in rows:
        state = [r[f"state/{name}"] for name in STATE_FEATURES]
        i, j = reference.agent.act(state, greedy=True)
        expected = (reference.picked_choices[i], reference.tolerance_choices[j])
        assert (r["requested_picked"], r["lag_tolerance"]) == expected
