"""The checks of ``FederatedTrainer``'s arguments, made at construction before anything is built.

Each refusal names the argument, the value and what is allowed (see :mod:`lit_asyncfl.checks`).
"""

from __future__ import annotations

from typing import Any

from lit_asyncfl.algorithms import Algorithm, get_algorithm
from lit_asyncfl.availability import Availability
from lit_asyncfl.checks import check, check_bool, check_choice, check_int, check_number, check_path
from lit_asyncfl.core.simulator import ON_CLIENT_ERROR
from lit_asyncfl.devices import DeviceModel
from lit_asyncfl.executors.factory import check_engine
from lit_asyncfl.executors.ray.executor import check_executor


def resolve_algorithm(algorithm: Algorithm | str) -> Algorithm:
    """The run's algorithm: ``algorithm`` itself, or the preset of that name.

    Example:
        >>> resolve_algorithm("fedasync").name
        'FedAsync'
        >>> resolve_algorithm(3)
        Traceback (most recent call last):
        ...
        ValueError: algorithm must be an Algorithm or a preset name, got 3
    """
    resolved = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
    check(isinstance(resolved, Algorithm), f"algorithm must be an Algorithm or a preset name, got {algorithm!r}")
    return resolved


def check_trainer_arguments(algorithm: Algorithm, args: dict[str, Any]) -> None:
    """Refuse a ``FederatedTrainer`` configuration that cannot run: ``args`` are the constructor's arguments by
    name, ``algorithm`` the resolved one (its scheduler is set up for ``num_clients`` here, so that e.g. a
    concurrency larger than the number of clients fails at construction).

    Example:
        >>> from lit_asyncfl.algorithms import FedAsync
        >>> check_trainer_arguments(FedAsync(), {"num_clients": 0})
        Traceback (most recent call last):
        ...
        ValueError: num_clients must be >= 1, got 0
    """
    num_clients = args["num_clients"]
    check_int("num_clients", num_clients, 1)
    check_int("local_epochs", args["local_epochs"], 1)
    max_virtual_time, max_versions = args["max_virtual_time"], args["max_versions"]
    check(
        max_virtual_time is not None or max_versions is not None,
        "set a budget: max_virtual_time (virtual seconds) and/or max_versions (aggregations)",
    )
    check_number("max_virtual_time", max_virtual_time, 0, open_min=True, optional=True, finite=False)
    check_int("max_versions", max_versions, 1, optional=True)
    check(
        max_versions is not None or max_virtual_time < float("inf"),
        f"max_virtual_time={max_virtual_time!r} without max_versions leaves the run no finite budget; set a "
        "budget: a finite max_virtual_time (virtual seconds) and/or max_versions (aggregations)",
    )
    device_model, availability = args["device_model"], args["availability"]
    check(
        device_model is None or isinstance(device_model, DeviceModel),
        f"device_model must be a DeviceModel or None, got {device_model!r}",
    )
    check(
        availability is None or isinstance(availability, Availability),
        f"availability must be an Availability (see lit_asyncfl.availability) or None, got {availability!r}",
    )
    check_number("target_accuracy", args["target_accuracy"])
    check_path("default_root_dir", args["default_root_dir"])
    check_bool("enable_progress_bar", args["enable_progress_bar"])
    check_bool("print_summary", args["print_summary"])
    check_bool("compile_cohort", args["compile_cohort"])
    check(
        args["mode"] == "max" or not algorithm.scheduler.needs_accuracy,
        f"{algorithm.name} reads the monitored metric as an accuracy (higher is better): use mode='max' "
        "and monitor an accuracy-like metric",
    )
    seed = args["seed"]
    check(
        isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32,
        f"seed must be an integer in [0, 2**32), got {seed!r}",
    )
    check_int("checkpoint_every", args["checkpoint_every"], 1, optional=True)
    engine = args["engine"]
    check_engine(engine, args["onednn"], args["compile_cohort"], args["num_threads"])
    check_number("checkpoint_every_seconds", args["checkpoint_every_seconds"], 0, open_min=True, optional=True)
    on_client_error = args["on_client_error"]
    check_choice("on_client_error", on_client_error, ON_CLIENT_ERROR)
    check(
        on_client_error == "raise" or engine != "cohort",
        "on_client_error='drop' needs engine='fast' or 'lightning': the cohort engine trains its jobs in one "
        "batched call, so one job's failure cannot be told from the others'",
    )
    check_executor(args["executor"])
    check_int("client_state_budget", args["client_state_budget"], 0, optional=True)
    stateful = [type(cb).__name__ for cb in algorithm.client_callbacks if cb.uses_client_state]
    check(
        not any(cb.uses_client_state and cb.runs_on_workers for cb in algorithm.client_callbacks),
        f"client callbacks {stateful} keep per-client state, which lives in the simulation's process: they "
        "must keep runs_on_workers=False",
    )
    algorithm.scheduler.setup(num_clients)  # e.g. concurrency larger than num_clients fails here
