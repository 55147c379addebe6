"""What a semi-asynchronous round tells its controller and the loggers: the state :math:`s^k` the controller acts
in (ASFL's five features, :data:`~lit_asyncfl.rl.controllers.STATE_FEATURES`) and the record of a finished round."""

from __future__ import annotations

from typing import Any

from lit_asyncfl.functional.asfl import latency_objective
from lit_asyncfl.rl.controllers import STATE_FEATURES


def state_features(
    loss: float,
    accuracy: float,
    rounds_done: int,
    spent: float,
    max_latency: float,
    alpha_pref: float,
    beta_pref: float,
    deprecated_total: int,
    variance_total: float,
) -> list[float]:
    r"""The state :math:`s^k` after ``rounds_done`` rounds: the loss, the latency spent as a fraction of
    :math:`T_{max}`, the objective so far (the accuracy before any round), and the mean number of deprecated
    devices and mean version variance per round.

    Example:
        >>> state_features(0.5, 0.8, 0, 0.0, 100.0, 0.07, 0.09, 0, 0.0)
        [0.5, 0.0, 0.8, 0.0, 0.0]
        >>> state_features(0.5, 0.8, 2, 50.0, 100.0, 0.07, 0.09, 3, 1.0)[3:]
        [1.5, 0.5]
    """
    objective = accuracy if rounds_done == 0 else latency_objective(accuracy, spent, max_latency, alpha_pref, beta_pref)
    return [
        float(loss),
        spent / max_latency,
        objective,
        deprecated_total / rounds_done if rounds_done else 0.0,
        variance_total / rounds_done if rounds_done else 0.0,
    ]


def round_record(
    scheduler: Any, latency: float, limit: float, reward: float, variance: float, done: bool
) -> dict[str, Any]:
    """The loggers' record of the round ``scheduler`` (a ``SemiAsyncRounds``) just ended: its latency and limit,
    reward, action, deprecations, and the state its action was chosen in (the objective after the last round)."""
    picked, tau = scheduler.action
    record: dict[str, Any] = {
        "round": scheduler.round,
        "round_latency": latency,
        "round_limit": limit,
        "round_reward": reward,
        "distribution_latency": scheduler.dist_latency,
        "num_picked": picked,
        "requested_picked": scheduler.requested,
        "lag_tolerance": tau,
        "deprecated": len(scheduler.deprecated),
        "version_variance": variance,
        "total_latency": scheduler.spent,
        **{f"state/{name}": value for name, value in zip(STATE_FEATURES, scheduler.state)},
    }
    if done:
        record["objective"] = scheduler.objective
    return record
