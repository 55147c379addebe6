"""The command line: every shipped config parses, the quickstart runs, overrides and errors behave."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lit_asyncfl import FederatedTrainer
from lit_asyncfl.algorithms import Algorithm, FedAsync
from lit_asyncfl.cli import FederatedCLI, main
from lit_asyncfl.client.ray_executor import ray_available

# configs/sweeps (W&B sweep files) and configs/compare (comparison specs) are checked by tests/test_sweeps.py
CONFIGS = sorted(
    p for p in (Path(__file__).parents[1] / "configs").rglob("*.yaml") if p.parent.name not in ("sweeps", "compare")
)
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]


def test_there_is_one_config_per_preset():
    assert {p.stem for p in CONFIGS} >= {"quickstart", "fedavg", "fedprox", "fedasync", "fedbuff"}


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_parses_and_instantiates(config, tmp_path):
    import yaml

    raw = yaml.safe_load(config.read_text())
    if "executor" in raw["trainer"] and not ray_available():
        pytest.skip("a Ray config needs the ray extra: pip install 'lit-asyncfl[ray]'")
    cli = FederatedCLI(args=["--config", str(config), f"--trainer.default_root_dir={tmp_path}"], run=False)
    assert isinstance(cli.trainer, FederatedTrainer)
    assert cli.trainer.num_clients == raw["trainer"]["num_clients"]
    for obj, spec in [
        (cli.trainer.algorithm, raw["trainer"]["algorithm"]),
        (cli.model, raw["model"]),
        (cli.datamodule, raw["data"]),
    ]:
        assert f"{type(obj).__module__}.{type(obj).__name__}".endswith(spec["class_path"].split(".")[-1])
    hparams = cli.trainer.algorithm.hparams
    for key, value in raw["trainer"]["algorithm"].get("init_args", {}).items():
        if isinstance(value, dict) and "class_path" in value:  # a component, e.g. ASFL's controller
            assert type(hparams[key]).__name__ == value["class_path"].split(".")[-1], key
            for name, arg in value.get("init_args", {}).items():
                part = hparams[key]  # a wrapped algorithm (DifferentiallyPrivate) records its own hyper-parameters
                got = part.hparams[name] if isinstance(part, Algorithm) else getattr(part, name)
                assert got == arg, f"{key}.{name}"
        else:
            assert hparams[key] == value, key  # every hyper-parameter reached the algorithm
    if "executor" in raw["trainer"]:  # every executor setting reached the RayExecutor
        for name, arg in raw["trainer"]["executor"]["init_args"].items():
            assert getattr(cli.trainer.executor, name) == arg, name
    for part in ("availability", "device_model"):  # e.g. on/off devices, replayed traces
        if part in raw["trainer"]:
            spec, obj = raw["trainer"][part], getattr(cli.trainer, part)
            assert type(obj).__name__ == spec["class_path"].split(".")[-1], part
            for name, arg in spec.get("init_args", {}).items():
                assert getattr(obj, name) == arg, f"{part}.{name}"


def test_an_ablation_class_keeps_the_shared_hyper_parameters(tmp_path):
    cli = FederatedCLI(
        args=[
            "--config",
            "configs/fedasmu/digits_lenet.yaml",
            "--trainer.algorithm.init_args.gamma0=3.0",
            "--trainer.algorithm.class_path=lit_asyncfl.algorithms.FedASMU_DA",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    algo = cli.trainer.algorithm
    assert algo.name == "FedASMU-DA" and algo.hparams["gamma0"] == 3.0 and algo.hparams["dynamic_weights"] is False


def test_a_partitioner_instance_can_be_configured_in_yaml(tmp_path):
    cli = FederatedCLI(
        args=[
            "--config",
            "configs/quickstart.yaml",
            "--data.init_args.alpha=null",
            '--data.init_args.partition={"class_path": "lit_asyncfl.data.QuantitySkew", "init_args": {"a": 0.2}}',
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    assert repr(cli.datamodule.partitioner) == "QuantitySkew(a=0.2)"


def test_print_config_shows_the_resolved_configuration(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "configs/quickstart.yaml", "--print_config"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "class_path: lit_asyncfl.algorithms.FedAsync" in out and "num_clients: 100" in out


def test_dotted_overrides_reach_the_algorithm(tmp_path):
    cli = FederatedCLI(
        args=[
            "--config",
            "configs/quickstart.yaml",
            "--trainer.algorithm.init_args.alpha=0.35",
            "--trainer.algorithm.init_args.staleness=hinge",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    algo = cli.trainer.algorithm
    assert isinstance(algo, FedAsync) and algo.aggregator.alpha == 0.35
    assert algo.server_callbacks[-1].function == "hinge"


def test_quickstart_runs_end_to_end_and_writes_its_outputs(tmp_path):
    cli = FederatedCLI(
        args=[
            "fit",
            "--config",
            "configs/quickstart.yaml",
            "--trainer.max_virtual_time=2000",
            f"--trainer.default_root_dir={tmp_path}",
            *QUIET,
        ]
    )
    trainer = cli.trainer
    out = Path(trainer.log_dir)
    for name in ["history.csv", "summary.json", "accuracy.png", "config.yaml", "checkpoints/last.ckpt"]:
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["updates_received"] > 50 and summary["virtual_time"] <= 2000
    assert summary["versions"] == trainer.history[-1]["version"] == summary["updates_aggregated"]
    lines = (out / "history.csv").read_text().splitlines()
    assert lines[0].startswith("version,virtual_time,accuracy,loss") and len(lines) == len(trainer.history) + 1


def test_fedavg_on_iid_digits_reaches_85_percent(tmp_path):
    """The issue's bar for the FedAvg config as shipped (100 clients, 10% per round, IID)."""
    cli = FederatedCLI(
        args=["fit", "--config", "configs/fedavg.yaml", f"--trainer.default_root_dir={tmp_path}", *QUIET]
    )
    assert cli.trainer.summary["final_accuracy"] >= 0.85, cli.trainer.summary


def test_preset_names_are_accepted_and_unknown_ones_listed(tmp_path):
    from lit_asyncfl.algorithms import PRESETS

    assert FederatedTrainer("FedBuff", max_versions=1, logger=False).algorithm.name == "FedBuff"
    with pytest.raises(ValueError, match=r"unknown algorithm preset 'fedfoo'; allowed: \[") as err:
        FederatedTrainer("fedfoo", max_versions=1)
    assert all(f"'{name}'" in str(err.value) for name in PRESETS)


def test_main_returns_zero_for_the_console_script(tmp_path):
    args = [
        "fit",
        "--config",
        "configs/quickstart.yaml",
        "--trainer.max_versions=2",
        "--trainer.max_virtual_time=null",
        f"--trainer.default_root_dir={tmp_path}",
        *QUIET,
    ]
    assert main(args) == 0


def test_cli_test_with_a_checkpoint_reports_the_trained_accuracy(tmp_path, capsys):
    fit = FederatedCLI(
        args=["fit", "--config", "configs/quickstart.yaml", "--trainer.max_virtual_time=8000",
              f"--trainer.default_root_dir={tmp_path}", *QUIET]
    )  # fmt: skip
    trained = fit.trainer.history[-1]["val_acc"]
    assert trained > 0.5
    ckpt = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    cli = FederatedCLI(
        args=["test", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}",
              f"--ckpt_path={ckpt}"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "Test metric" in out and f"{trained}"[:6] in out  # the digits' test split is their validation split
    assert cli.trainer.history == []  # nothing was trained


def test_cli_test_without_a_checkpoint_warns_about_the_initial_model(tmp_path):
    with pytest.warns(UserWarning, match=r"evaluating the model's INITIAL weights"):
        main(["test", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}"])


def test_run_callbacks_from_the_command_line(tmp_path):
    from lit_asyncfl.callbacks import EarlyStopping, ModelCheckpoint

    cli = FederatedCLI(
        args=[
            "fit", "--config", "configs/quickstart.yaml", "--trainer.max_virtual_time=3000",
            f"--trainer.default_root_dir={tmp_path}", *QUIET,
            "--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_acc",
            "--trainer.callbacks.mode=max", "--trainer.callbacks.patience=2",
            "--trainer.callbacks+=lit_asyncfl.callbacks.ModelCheckpoint", "--trainer.callbacks.monitor=val_acc",
            "--trainer.callbacks.mode=max",
        ]
    )  # fmt: skip
    user = [cb for cb in cli.trainer.callbacks if isinstance(cb, (EarlyStopping, ModelCheckpoint))]
    assert [type(cb).__name__ for cb in user] == ["EarlyStopping", "ModelCheckpoint"]
    assert user[0].patience == 2 and user[1].mode == "max"
    assert cli.trainer.summary["stop_reason"] == "early_stopping"
    assert Path(user[1].best_model_path).is_file()


def test_ckpt_path_sets_the_model_hyper_parameters_as_lightning_cli_does(tmp_path):
    fit = FederatedCLI(
        args=["fit", "--config", "configs/quickstart.yaml", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", "--model.init_args.lr=0.07", f"--trainer.default_root_dir={tmp_path}",
              *QUIET]
    )  # fmt: skip
    ckpt = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    cli = FederatedCLI(
        args=["test", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}",
              f"--ckpt_path={ckpt}", "--verbose=false"]
    )  # fmt: skip
    assert cli.model.hparams.lr == 0.07  # the config says 0.05


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--trainer.seed=-1", "seed must be an integer in [0, 2**32), got -1"),
        ("--trainer.algorithm.init_args.alpha=.nan", "alpha must be a finite number in (0, 1], got nan"),
        ("--model.init_args.lr=.inf", "lr must be a finite number > 0, got inf"),
        ("--data.init_args.batch_size=0", "batch_size must be >= 1, got 0"),
        ("--trainer.max_virtual_time=.inf", "max_virtual_time=inf without max_versions leaves the run no finite"),
    ],
)
def test_a_refused_setting_ends_the_command_with_one_error_line(override, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "configs/quickstart.yaml", override, f"--trainer.default_root_dir={tmp_path}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {message}"), err
    assert "Traceback" not in err and "Union subtypes" not in err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_a_checkpoint_naming_another_model_class_is_refused_before_anything_is_imported(tmp_path, capsys):
    import sys

    import torch

    from lit_asyncfl import checkpoint as ckpt_io

    fit = FederatedCLI(
        args=["fit", "--config", "configs/quickstart.yaml", "--trainer.max_versions=2",
              "--trainer.max_virtual_time=null", f"--trainer.default_root_dir={tmp_path}", *QUIET]
    )  # fmt: skip
    ckpt = Path(fit.trainer.log_dir) / "checkpoints" / "last.ckpt"
    named = torch.load(ckpt, weights_only=True)["hyper_parameters"]["_class_path"]
    assert named.endswith("LeNet5")  # what LightningCLI records, and the config's own class: accepted
    FederatedCLI(args=["test", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}",
                       f"--ckpt_path={ckpt}", "--verbose=false"])  # fmt: skip
    checkpoint = torch.load(ckpt, weights_only=True)
    checkpoint["hyper_parameters"]["_class_path"] = "evil_module_for_the_test.Payload"  # someone else's file
    evil = tmp_path / "evil.ckpt"
    ckpt_io.save(checkpoint, evil)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["test", "--config", "configs/quickstart.yaml", f"--trainer.default_root_dir={tmp_path}",
              f"--ckpt_path={evil}"])  # fmt: skip
    err = capsys.readouterr().err
    assert f"{evil} was written by the model class 'evil_module_for_the_test.Payload', but the config's model" in err
    assert "LeNet5" in err and "evil_module_for_the_test" not in sys.modules
