"""Reinforcement-learning formulas (lit_asyncfl.functional.rl) by hand: Q-learning, epsilon-greedy."""

from __future__ import annotations

import numpy as np
import pytest

from lit_asyncfl.functional.rl import epsilon_greedy, q_learning_update


def test_q_learning_on_a_fixed_reward_sequence_matches_hand_computation():
    q = np.zeros((3, 3))
    q = q_learning_update(q, 0, 2, reward=1.0, next_state=1, lr=0.5, discount=0.9)  # H(0,2) = 0.5
    q = q_learning_update(q, 1, 2, reward=2.0, next_state=2, lr=0.5, discount=0.9)  # H(1,2) = 1.0
    q = q_learning_update(q, 0, 2, reward=1.0, next_state=1, lr=0.5, discount=0.9)
    # H(0,2) = 0.5 + 0.5 * (1 + 0.9 * max H(1,.) - 0.5) = 0.5 + 0.5 * (1 + 0.9 - 0.5) = 1.2
    assert q[0, 2] == pytest.approx(1.2) and q[1, 2] == pytest.approx(1.0)
    assert q.sum() == pytest.approx(2.2)


def test_epsilon_greedy_frequencies():
    rng = np.random.default_rng(0)
    values = np.array([0.0, 3.0, 1.0])
    assert {epsilon_greedy(values, 0.0, rng) for _ in range(200)} == {1}
    picks = np.array([epsilon_greedy(values, 0.3, rng) for _ in range(20_000)])
    assert np.mean(picks != 1) == pytest.approx(0.3 * 2 / 3, abs=0.015)  # random picks land elsewhere 2/3 of the time
    picks = np.array([epsilon_greedy(values, 1.0, rng) for _ in range(30_000)])
    assert np.bincount(picks) / len(picks) == pytest.approx([1 / 3] * 3, abs=0.015)
