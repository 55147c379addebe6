"""FedASMU's fresh-model merge (lit_asyncfl.client_callbacks.fresh_merge): against an independent computation, an
identical fresh model changes nothing, slots map to steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lit_asyncfl.client.fresh_merge import FreshModelMerge
from lit_asyncfl.client.time_slots import TimeSlotSelector
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.functional.fedasmu import (
    fedasmu_beta_grads,
)
from lit_asyncfl.models import LogisticRegression


def test_fresh_merge_matches_an_independent_computation():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    torch.manual_seed(0)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    shards = ClientShards(x, y, [np.arange(12)])
    model = LogisticRegression(input_dim=4, num_classes=3, lr=0.1)
    selector = TimeSlotSelector(num_slots=2)
    merge = FreshModelMerge(mu_beta=1.0, gamma0=4.0, upsilon0=1.0, lr_gamma=0.5, lr_upsilon=0.5, selector=selector)
    local = LocalTrainer(model, shards, batch_size=6, callbacks=[merge])
    start = local.flat.read()
    fresh = start + 0.5
    job = ClientJob(7, 0, 1, 0.0, JobTiming(0, 1, 0), seed=11, local_epochs=1, num_steps=2)
    job.request_step = merge.request_step(job)
    assert job.request_step in (1, 2)
    update = local.train(job, start, fresh=(fresh, 4))

    # Independent replay with plain tensors: the same batches, merge after request_step steps.
    w = start.clone()
    order = torch.randperm(12, generator=torch.Generator().manual_seed(11))
    batches = [order[:6], order[6:]]

    def loss_at(vec, idx):
        return F.cross_entropy(x[idx] @ vec[:12].view(3, 4).T + vec[12:], y[idx])

    for i, idx in enumerate(batches):
        w_var = w.clone().requires_grad_(True)
        loss_at(w_var, idx).backward()
        w = w - 0.1 * w_var.grad
        if i + 1 == job.request_step:
            phi = 4.0 / math.sqrt(4) * (1 - 1.0 / math.sqrt(4 - 1 + 1))  # g = 4, o = 1
            beta = phi / (1 + phi)
            before = loss_at(w, idx).item()
            merged = (1 - beta) * w + beta * fresh
            m_var = merged.clone().requires_grad_(True)
            after = loss_at(m_var, idx)
            after.backward()
            inner = float(torch.dot(m_var.grad, fresh - w))
            dg, du = fedasmu_beta_grads(4.0, 1.0, 4, 1, 1.0, inner)
            expected_controls = (4.0 - 0.5 * dg, 1.0 - 0.5 * du)
            expected_reward = before - after.item()
            w = merged
    assert torch.allclose(update.weights, w, atol=1e-6)
    assert update.info["beta"] == pytest.approx(beta)
    assert update.info["reward"] == pytest.approx(expected_reward, abs=1e-6)
    assert merge.controls(0) == pytest.approx(expected_controls, abs=1e-6)
    assert 0 in selector.q_tables  # first reward trained the meta-policy and started the device's Q-table


class DropoutBatchNormNet(LogisticRegression):
    def __init__(self):
        super().__init__(input_dim=4, num_classes=3, lr=0.1)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 3)
        )


def test_a_merge_with_an_identical_fresh_model_changes_nothing():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    merge = FreshModelMerge(selector=TimeSlotSelector(num_slots=2))
    local = LocalTrainer(DropoutBatchNormNet(), ClientShards(x, y, [np.arange(8)]), batch_size=8, callbacks=[merge])
    local.module.train()
    job = ClientJob(3, 0, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1, num_steps=1)
    merge.request_step(job)
    local.job_info = {}
    weights = local.flat.read()
    rng = torch.random.get_rng_state()
    merge.on_fresh_model(local, job, weights.clone(), 5, [x, y])
    assert local.job_info["reward"] == 0.0  # same weights, same dropout masks
    assert torch.equal(local.flat.read(), weights)  # BatchNorm statistics untouched by the extra passes
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_slots_map_to_valid_steps_even_with_more_slots_than_steps():
    merge = FreshModelMerge(selector=TimeSlotSelector(num_slots=20))
    steps = []
    for slot in range(1, 21):
        job = ClientJob(slot, 0, 0, 0.0, JobTiming(0, 1, 0), seed=slot, local_epochs=1, num_steps=3)
        merge.selector.choose = lambda client, job_id, seed, slot=slot: slot
        steps.append(merge.request_step(job))
    assert steps == sorted(steps) and set(steps) == {1, 2, 3}
