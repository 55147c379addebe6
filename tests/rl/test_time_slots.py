"""FedASMU's time-slot selector (lit_asyncfl.rl.time_slots): meta-policy then Q-learning, REINFORCE, the first
request slot."""

from __future__ import annotations

import numpy as np
import pytest

from lit_asyncfl.client.time_slots import TimeSlotSelector, first_request


def test_selector_switches_from_meta_policy_to_q_learning_and_learns_from_rewards():
    sel = TimeSlotSelector(num_slots=4, epsilon=0.0, q_lr=0.5, discount=0.9, baseline_rate=0.5)
    first = sel.choose(client=3, job_id=0, seed=1)
    assert "meta" in sel.pending[0]
    sel.reward(0, reward=2.0)
    assert sel.baseline == 1.0 and sel.slots[3] == first and np.all(sel.q_tables[3] == 0)
    second = sel.choose(client=3, job_id=1, seed=2)  # greedy on an all-zero row: a random tie-break
    action = sel.pending[1]["action"]
    assert second == min(4, max(1, first + (-1, 0, 1)[action]))
    sel.reward(1, reward=1.0)
    # H(first, action) = 0 + 0.5 * (1 + 0.9 * 0 - 0) = 0.5, nothing else changes
    assert sel.q_tables[3][first - 1, action] == pytest.approx(0.5) and sel.q_tables[3].sum() == pytest.approx(0.5)
    assert sel.slots[3] == second
    sel.choose(client=3, job_id=2, seed=3)
    sel.forget(2)  # no reward: nothing learned
    assert sel.pending == {} and sel.slots[3] == second


def test_reinforce_moves_the_meta_policy_toward_the_rewarded_slot():
    sel = TimeSlotSelector(num_slots=4, rl_lr=0.3, baseline_rate=0.2)
    before = sel.request_probabilities()
    assert sum(before) == pytest.approx(1.0)
    for job in range(400):
        slot = sel.choose(client=job, job_id=job, seed=job)  # new client each time: always the meta-policy
        sel.reward(job, reward=1.0 if slot == 3 else 0.0)
    after = sel.request_probabilities()
    assert after[2] > before[2] + 0.3 and after[2] > 0.5, (before, after)


def test_first_request_slot():
    assert first_request([0, 0, 1, 0]) == 3 and first_request([1, 1]) == 1 and first_request([0, 0]) == 2
