r"""Small reinforcement-learning rules shared by algorithms (FedASMU's time-slot selection)."""

from __future__ import annotations

import numpy as np


def epsilon_greedy(values: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
    r"""With probability :math:`\epsilon` a uniformly random index, else an index of the maximum (ties broken
    uniformly at random, so an untrained table does not always pick the first action).

    Example:
        >>> epsilon_greedy(np.array([0.1, 0.7, 0.2]), 0.0, np.random.default_rng(0))
        1
    """
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    if rng.random() < epsilon:
        return int(rng.integers(len(values)))
    best = np.flatnonzero(values == np.max(values))
    return int(best[0]) if len(best) == 1 else int(rng.choice(best))


def q_learning_update(
    table: np.ndarray, state: int, action: int, reward: float, next_state: int, lr: float, discount: float
) -> np.ndarray:
    r"""One tabular Q-learning step; returns the updated copy of ``table``.

    .. math:: H(l, a) \leftarrow H(l, a) + \phi \left(R + \psi \max_{a'} H(l', a') - H(l, a)\right)

    Example:
        >>> q_learning_update(np.zeros((2, 3)), 0, 2, reward=1.0, next_state=1, lr=0.5, discount=0.9)[0]
        array([0. , 0. , 0.5])
    """
    out = table.copy()
    target = reward + discount * float(np.max(table[next_state]))
    out[state, action] += lr * (target - table[state, action])
    return out


def moving_baseline(baseline: float, reward: float, rate: float) -> float:
    r"""Exponential moving average baseline :math:`b \leftarrow (1 - \rho) b + \rho R`.

    Example:
        >>> moving_baseline(1.0, 3.0, rate=0.25)
        1.5
    """
    return (1.0 - rate) * baseline + rate * reward
