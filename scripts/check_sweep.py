"""Check a W&B sweep config offline: render its commands as the agent would and make the CLI parse them.

For each sampled parameter set (the range ends first, then random draws), the sweep's ``command`` is rendered as
the W&B agent renders it (``${env}``, ``${interpreter}``, ``${program}``, ``${args}`` -> ``--key=value``,
``${args_no_hyphens}`` -> ``key=value``) and the ``lit-asyncfl`` part of it is parsed by the CLI with
its objects are built (in this process, no training). A key the CLI does not accept, a value of the wrong type, a
swept key that sets nothing, or a metric the run summary does not have is reported, and the exit status is 1.

    python scripts/check_sweep.py configs/sweeps/fedasmu_digits.yaml
    python scripts/check_sweep.py configs/sweeps/*.yaml --samples 3 --show
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import random
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml

#: Keys of the run summary a sweep may optimise (see ``FederatedTrainer.summary``). ``time_to_target`` is left
#: out on purpose: it is None for runs that never reach the target, which W&B's optimiser imputes with the best
#: value seen (0 before any run reached it), ranking failed runs first.
SUMMARY_METRICS = {"final_accuracy": "maximize", "best_accuracy": "maximize", "objective": "maximize"}
#: Summary metrics that only some schedulers report (in ``Scheduler.summary()``): ASFL-style rounds.
SCHEDULER_METRICS = {"objective"}
METHODS = ("grid", "random", "bayes")


class SweepError(ValueError):
    """A problem with a sweep config, named precisely."""


def _number(value: Any, name: str, field: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise SweepError(f"parameter {name!r}: {field} must be a number, got {value!r}")
    return float(value)


def sample_parameter(name: str, spec: Any, rng: random.Random, end: str | None = None) -> Any:
    """One value of a sweep parameter (``end="min"``/``"max"``: the range's end) following W&B's distributions.

    Example:
        >>> sample_parameter("lr", {"distribution": "log_uniform_values", "min": 1e-4, "max": 1e-2},
        ...                  random.Random(0), end="max")
        0.01
        >>> sample_parameter("k", {"values": [5, 10]}, random.Random(0), end="min")
        5
    """
    if not isinstance(spec, dict):
        raise SweepError(f"parameter {name!r} must be a mapping (value/values/distribution), got {spec!r}")
    if "value" in spec:
        return spec["value"]
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(f"parameter {name!r}: values must be a non-empty list, got {values!r}")
        if end is not None:
            return values[0] if end == "min" else values[-1]
        return rng.choice(values)
    default = None
    if "min" in spec:  # as W&B: integer bounds mean int_uniform
        ints = all(isinstance(spec.get(k), int) and not isinstance(spec.get(k), bool) for k in ("min", "max"))
        default = "int_uniform" if ints else "uniform"
    dist = spec.get("distribution", default)
    if dist is None:
        raise SweepError(f"parameter {name!r} needs value, values or a distribution with min/max")
    if dist in ("normal", "q_normal", "log_normal", "q_log_normal"):
        mu, sigma = _number(spec.get("mu", 0.0), name, "mu"), _number(spec.get("sigma", 1.0), name, "sigma")
        draw = mu + sigma * ((-2 if end == "min" else 2) if end else rng.gauss(0, 1))
        value = math.exp(draw) if "log" in dist else draw
        q = spec.get("q", 1) if dist.startswith("q_") else None
        return round(value / q) * q if q else value
    lo, hi = _number(spec.get("min"), name, "min"), _number(spec.get("max"), name, "max")
    if not lo < hi:
        raise SweepError(f"parameter {name!r}: min must be < max, got min={lo}, max={hi}")
    u = {"min": 0.0, "max": 1.0}.get(end or "", rng.random())
    if dist == "int_uniform":
        if not (float(lo).is_integer() and float(hi).is_integer()):
            raise SweepError(f"parameter {name!r}: int_uniform needs integer min/max, got {lo}, {hi}")
        return int(lo) if end == "min" else int(hi) if end == "max" else rng.randint(int(lo), int(hi))
    if dist in ("uniform", "q_uniform"):
        value = lo + u * (hi - lo)
    elif dist in ("log_uniform_values", "q_log_uniform_values"):
        if lo <= 0:
            raise SweepError(f"parameter {name!r}: log_uniform_values needs min > 0, got {lo}")
        value = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        value = lo if end == "min" else hi if end == "max" else value
    elif dist == "log_uniform":  # min/max are natural-log exponents
        value = math.exp(lo + u * (hi - lo))
    else:
        raise SweepError(
            f"parameter {name!r}: unsupported distribution {dist!r}; allowed: constant via value, categorical via "
            "values, int_uniform, uniform, q_uniform, log_uniform, log_uniform_values, q_log_uniform_values, normal, "
            "q_normal, log_normal, q_log_normal"
        )
    q = spec.get("q", 1) if dist.startswith("q_") else None  # W&B's q defaults to 1
    return round(value / q) * q if q else value


def render_command(sweep: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The command the W&B agent runs for ``params`` (``${env}`` is dropped, ``${interpreter}`` is ``python``).

    The argument macros (``${args}``, ``${args_no_hyphens}``, ``${args_no_boolean_flags}``, ...) are expanded by
    wandb's own ``create_sweep_command_args``, the function the agent uses.

    Example:
        >>> render_command({"command": ["${program}", "--x", "${args}"], "program": "p"}, {"a.b": 1})
        ['p', '--x', '--a.b=1']
    """
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    expanded = create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
    command = sweep.get("command") or ["${env}", "${interpreter}", "${program}", "${args}"]
    out: list[str] = []
    for token in command:
        if token == "${env}":
            continue
        if token == "${interpreter}":
            out.append("python")
        elif token == "${program}":
            if "program" not in sweep:
                raise SweepError("command uses ${program} but the sweep has no program")
            out.append(str(sweep["program"]))
        elif token.startswith("${") and token[2:-1] in expanded and isinstance(expanded[token[2:-1]], list):
            out += [str(a) for a in expanded[token[2:-1]]]
        elif token.startswith("${"):
            raise SweepError(f"command token {token!r} is not supported by this check")
        else:
            out.append(str(token))
    return out


def cli_arguments(command: list[str]) -> list[str]:
    """The arguments after ``lit-asyncfl`` (or ``-m lit_asyncfl``) in a rendered command."""
    for i, token in enumerate(command):
        if Path(token).name == "lit-asyncfl":
            return command[i + 1 :]
        if token == "-m" and i + 1 < len(command) and command[i + 1] == "lit_asyncfl":
            return command[i + 2 :]
    raise SweepError(f"the command does not run lit-asyncfl: {' '.join(command)}")


def parse_with_cli(arguments: list[str]) -> tuple[dict[str, Any], set[str]]:
    """Parse CLI arguments and build the trainer, model and data module (no training) in this process; return the
    parsed config and the summary keys the run's scheduler adds, or raise :class:`SweepError` with the CLI's
    message."""
    from lit_asyncfl.cli import FederatedCLI

    if arguments and arguments[0] in ("fit", "validate", "test"):
        arguments = arguments[1:]  # run=False parses without a subcommand
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # argv is this script's
            cli = FederatedCLI(args=arguments, run=False)
    except SystemExit as stop:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        start = next((i for i, line in enumerate(lines) if line.startswith("error:")), 0)
        hint = (
            "\n    (a null sweep value renders as None; write the string 'null' instead)"
            if "=None" in " ".join(arguments)
            else ""
        )
        raise SweepError(
            f"the CLI rejects it (exit {stop.code}):\n    " + "\n    ".join(lines[start:]) + hint
        ) from None
    except (ValueError, TypeError) as problem:
        raise SweepError(f"the CLI parses it but construction fails: {problem}") from None
    return cli.config.as_dict(), set(cli.trainer.algorithm.scheduler.summary())


def lookup(config: dict[str, Any], dotted: str) -> Any:
    """The value at a dotted CLI key in a printed config (``init_args`` levels included in the key)."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def check_sweep(path: Path, samples: int = 2, seed: int = 0, show: bool = False) -> list[list[str]]:
    """Validate one sweep file; return the rendered commands (raises :class:`SweepError` on a problem)."""
    sweep = yaml.safe_load(path.read_text())
    if not isinstance(sweep, dict):
        raise SweepError("the sweep file must hold a mapping")
    if sweep.get("method") not in METHODS:
        raise SweepError(f"method must be one of {list(METHODS)}, got {sweep.get('method')!r}")
    metric = sweep.get("metric") or {}
    if metric.get("name") not in SUMMARY_METRICS:
        raise SweepError(
            f"metric.name {metric.get('name')!r} is not in the run summary; allowed: {list(SUMMARY_METRICS)}"
        )
    if metric.get("goal") != SUMMARY_METRICS[metric["name"]]:
        raise SweepError(
            f"metric {metric['name']!r} should be {SUMMARY_METRICS[metric['name']]}d, not {metric.get('goal')!r}"
        )
    parameters = sweep.get("parameters")
    if not isinstance(parameters, dict) or not parameters:
        raise SweepError("parameters must be a non-empty mapping of CLI keys")
    rng = random.Random(seed)
    draws = [dict.fromkeys(parameters, "min"), dict.fromkeys(parameters, "max")] + [{}] * samples
    commands = []
    for ends in draws:
        params = {k: sample_parameter(k, spec, rng, ends.get(k)) for k, spec in parameters.items()}
        command = render_command(sweep, params)
        if show:
            print("   ", " ".join(command))
        config, extra_metrics = parse_with_cli(cli_arguments(command))
        if metric["name"] in SCHEDULER_METRICS and metric["name"] not in extra_metrics:
            raise SweepError(f"metric {metric['name']!r} is only reported by ASFL-style runs (SemiAsyncRounds)")
        for key, value in params.items():
            try:
                parsed = lookup(config, key)
            except KeyError:
                raise SweepError(f"swept key {key!r} is accepted but sets nothing in the parsed config") from None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if not (isinstance(parsed, (int, float)) and math.isclose(float(parsed), float(value), rel_tol=1e-9)):
                    raise SweepError(f"swept key {key!r}: rendered {value!r} but the CLI parsed {parsed!r}")
        commands.append(command)
    return commands


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep YAML files")
    parser.add_argument("--samples", type=int, default=2, help="random draws per sweep besides the range ends")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", action="store_true", help="print every rendered command")
    args = parser.parse_args(argv)
    failed = 0
    for path in args.sweeps:
        try:
            commands = check_sweep(path, args.samples, args.seed, args.show)
        except (SweepError, OSError, yaml.YAMLError) as err:
            print(f"FAIL {path}: {err}")
            failed += 1
        else:
            print(f"ok   {path}: {len(commands)} rendered commands parse")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
