"""The discrete soft actor-critic (ASFL's controller, lit_asyncfl.rl.sac): learning, soft target updates,
temperature, saved policies."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from lit_asyncfl.rl import DiscreteSAC


def test_sac_learns_a_two_head_bandit_within_a_bounded_number_of_updates():
    """Reward 1 only for (M, tau) = (1, 2) of 2 x 3 choices; the state is constant."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    agent = DiscreteSAC(
        state_dim=2, action_sizes=(2, 3), actor_hidden=(32, 32), critic_hidden=(32, 32), batch_size=32, lr=3e-3
    )
    state = [1.0, 0.0]
    for _ in range(400):
        action = agent.act(state)
        agent.observe(state, action, 1.0 if action == (1, 2) else 0.0, state, done=True)
        agent.update()
    torch.set_num_threads(threads)
    probs = agent.probabilities(state)
    assert agent.act(state, greedy=True) == (1, 2)
    others = probs.flatten()[torch.arange(6) != agent.encode((1, 2))]
    assert probs[1, 2] > 0.5 and probs[1, 2] > 3 * others.max()
    q = torch.min(agent.critics[0](torch.tensor([state])), agent.critics[1](torch.tensor([state])))[0]
    assert q[agent.encode((1, 2))] > q[others.argmax()] + 0.5  # the critics separate the best action clearly


def test_target_critics_move_by_the_soft_update_rule():
    agent = DiscreteSAC(state_dim=3, action_sizes=(2, 2), batch_size=4, delta=0.01, seed=1)
    for i in range(4):
        agent.observe([i, 1.0, 0.0], (i % 2, 1), float(i), [i + 1.0, 1.0, 0.0], done=False)
    before_target = copy.deepcopy(agent.target_critics.state_dict())
    agent.update()
    after_critic = agent.critics.state_dict()
    for name, value in agent.target_critics.state_dict().items():
        expected = 0.01 * after_critic[name] + 0.99 * before_target[name]
        assert torch.allclose(value, expected, atol=1e-7), name
    assert not torch.equal(agent.target_critics.state_dict()[name], before_target[name])


def test_temperature_rises_when_the_policy_is_less_random_than_the_target():
    agent = DiscreteSAC(state_dim=1, action_sizes=(4,), batch_size=2, target_entropy_ratio=0.9, lr=0.01, seed=0)
    with torch.no_grad():
        agent.heads[0].bias.copy_(torch.tensor([10.0, 0.0, 0.0, 0.0]))  # nearly deterministic policy
    for _ in range(2):
        agent.observe([0.0], (0,), 0.0, [0.0], done=True)
    start = agent.alpha
    agent.update()
    assert agent.alpha > start and agent.target_entropy == pytest.approx(0.9 * math.log(4))


def test_a_saved_policy_reloads_and_acts_the_same(tmp_path):
    agent = DiscreteSAC(state_dim=2, action_sizes=(3, 4), batch_size=8, seed=3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        s = rng.normal(size=2).tolist()
        agent.observe(s, agent.act(s), float(rng.normal()), rng.normal(size=2).tolist(), done=False)
        agent.update()
    agent.save(tmp_path / "policy.pt")
    states = rng.normal(size=(10, 2)).tolist()
    expected_greedy = [agent.act(s, greedy=True) for s in states]
    expected_sampled = [agent.act(s) for s in states]
    fresh = DiscreteSAC(state_dim=2, action_sizes=(3, 4), batch_size=8, seed=99)
    fresh.load(tmp_path / "policy.pt")
    assert [fresh.act(s, greedy=True) for s in states] == expected_greedy
    assert [fresh.act(s) for s in states] == expected_sampled  # the sampling stream is restored too
    with pytest.raises(ValueError, match="does not fit"):
        DiscreteSAC(state_dim=2, action_sizes=(3, 5)).load(tmp_path / "policy.pt")
