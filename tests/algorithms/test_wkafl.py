"""WKAFL: the two-stage weighted aggregation against hand values and an independent implementation, a whole run
replayed by hand from the recorded uploads, refused steps, clipping."""

from __future__ import annotations

import math

import numpy as np
import torch
from builders import RecordsUploads, make_update
from conftest import run

from lit_asyncfl.algorithms import WKAFL
from lit_asyncfl.core.server import Server
from lit_asyncfl.functional.wkafl import adaptive_lr, clip_norm, staleness_weights, two_stage_aggregate
from lit_asyncfl.server.two_stage import TwoStageWeightedStep

DATA = {"partition": "dirichlet"}


def reference_two_stage(grads, taus, c1, b, theta, temp=10.0, in_place=True):
    """An independent WKAFL stage one and two, written from the authors' loops (whose stage-one TensorClip rewrites
    the buffered gradients in place: ``in_place``)."""
    grads = list(grads)
    e = math.e
    raw = [(e / 2) ** (-t) for t in taus]
    w = [r / sum(raw) for r in raw]
    freshest = int(np.argsort(np.asarray(taus, dtype=float), kind="stable")[0])
    std = float(torch.linalg.vector_norm(grads[freshest]))
    est = torch.zeros_like(grads[0])
    for i, (wi, g) in enumerate(zip(w, list(grads))):
        n = float(torch.linalg.vector_norm(g))
        clipped = g * (c1 * std / n) if c1 * std < n else g
        est += wi * clipped
        if in_place:
            grads[i] = clipped
    sims = [float((g * est).sum() / (torch.linalg.vector_norm(g) * torch.linalg.vector_norm(est))) for g in grads]
    sel = [i for i, s in enumerate(sims) if s > theta]
    if not sel:
        return est
    tot = [math.exp(sims[i] * temp) * w[i] for i in sel]
    out = torch.zeros_like(est)
    bound = b * float(torch.linalg.vector_norm(est))
    for t, i in zip(tot, sel):
        g, n = grads[i], float(torch.linalg.vector_norm(grads[i]))
        out += (t / sum(tot)) * (g * (bound / n) if bound < n else g)
    return out


def test_wkafl_formulas_by_hand_and_against_an_independent_implementation():
    assert clip_norm(torch.tensor([6.0, 8.0]), 5.0).tolist() == [3.0, 4.0]
    assert adaptive_lr(0.5, 3) == 0.5 / 1.3
    # by hand: the two first agree with the estimate, the third points away and is dropped
    g = [torch.tensor([1.0, 0.0]), torch.tensor([1.0, 0.1]), torch.tensor([-1.0, 0.0])]
    out, est, kept = two_stage_aggregate(g, [1, 1, 1], 100.0, 10.0, 0.3)
    assert torch.allclose(est, torch.tensor([1.0 / 3, 0.1 / 3])) and kept == [True, True, False]
    s = [float(torch.nn.functional.cosine_similarity(x, est, dim=0)) for x in g[:2]]
    q = [math.exp(10 * x) for x in s]
    assert torch.allclose(out, (q[0] * g[0] + q[1] * g[1]) / sum(q))
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        grads = [torch.randn(6, generator=gen) * (1 + 3 * (i % 3)) + 0.5 for i in range(5)]
        taus = [int(t) for t in torch.randint(1, 6, (5,), generator=gen)]
        c1, b, theta = (1.5, 0.8, 0.1) if trial % 2 else (100.0, 10.0, 0.3)
        for in_place in (True, False):
            mine, _, _ = two_stage_aggregate(grads, taus, c1, b, theta, clip_in_place=in_place)
            expected = reference_two_stage(grads, taus, c1, b, theta, in_place=in_place)
            assert torch.allclose(mine, expected, atol=1e-6), (trial, in_place)


def test_wkafl_run_replayed_from_the_recorded_uploads(tmp_path):
    k, lr, beta = 3, 0.8, 0.1
    algo = WKAFL(k=k, server_lr=lr, momentum=beta, second_clip=0.9, threshold=0.2)
    record = RecordsUploads()
    algo.server_callbacks.append(record)
    run(tmp_path, algo, num_clients=6, max_versions=8, data_kwargs=DATA)
    assert [v["count"] for v in record.versions] == [k] * 8
    weights, previous = record.versions[0]["before"].clone(), torch.zeros_like(record.versions[0]["before"])
    for t, v in enumerate(record.versions):
        batch = record.uploads[t * k : (t + 1) * k]
        grads = [clip_norm(-u["delta"] + beta * previous, 100.0) for u in batch]
        taus = [t - u["base_version"] + 1 for u in batch]
        step = reference_two_stage(grads, taus, 100.0, 0.9, 0.2)
        weights = weights - lr / (1 + 0.1 * min(taus)) * step
        previous = step
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6), t
    assert max(u["version"] - u["base_version"] for u in record.uploads) > 0  # stale gradients were weighted


def test_a_refused_wkafl_step_teaches_the_global_direction_nothing():
    agg = TwoStageWeightedStep(buffer_size=1, momentum=0.5)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    # a finite upload whose delta overflows: the step is NaN and refused; G_{t-1} must stay 0 (not NaN)
    assert not server.receive(make_update(1, [3e38, 0.0], [-3e38, 0.0]))
    assert server.stats.reasons["non_finite_aggregate"] == 1 and agg.previous is None
    assert server.receive(make_update(0, [1.0, 0.0], [0.0, 0.0]))  # g = -(1, 0) + 0.5 * 0, tau 1: eta 1/1.1
    assert torch.allclose(server.weights, torch.tensor([1.0 / 1.1, 0.0]))
    assert torch.equal(agg.previous, torch.tensor([-1.0, 0.0]))
    # the momentum of an applied step is used: g = -(1, 0) + 0.5 * (-1, 0), tau 1
    assert server.receive(make_update(2, [2.0, 0.0], [1.0, 0.0], base_version=1))
    assert torch.allclose(server.weights, torch.tensor([1.0 / 1.1 + 1.5 / 1.1, 0.0]))


def test_wkafl_clips_each_gradient_to_c1_before_both_stages():
    agg = TwoStageWeightedStep(buffer_size=1, first_clip=1.0)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    assert server.receive(make_update(0, [-3.0, -4.0], [0.0, 0.0]))  # g = (3, 4), norm 5, clipped to norm C1 = 1
    assert torch.allclose(server.weights, -torch.tensor([0.6, 0.8]) / 1.1)


def test_wkafl_stage_two_sums_the_gradients_as_stage_one_clipped_them_as_the_authors_code():
    assert WKAFL().aggregator.clip_in_place and not WKAFL(clip_in_place=False).aggregator.clip_in_place
    # A fresh [1, 0] and a stale [4, 0] (staleness 1 and 2); C_1 = 1 clips the stale one to the fresh norm, 1.
    # Both agree with the estimate (cosine 1), so stage two weighs them by the staleness weights w; B is huge.
    g = [torch.tensor([1.0, 0.0]), torch.tensor([4.0, 0.0])]
    w = staleness_weights([1, 2])
    authors, estimate, kept = two_stage_aggregate(g, [1, 2], first_clip=1.0, second_clip=1e6)
    assert kept == [True, True] and torch.allclose(estimate, torch.tensor([1.0, 0.0]))
    assert torch.allclose(authors, torch.tensor([w[0] * 1.0 + w[1] * 1.0, 0.0]))  # the clipped [1, 0]
    as_came, _, _ = two_stage_aggregate(g, [1, 2], first_clip=1.0, second_clip=1e6, clip_in_place=False)
    assert torch.allclose(as_came, torch.tensor([w[0] * 1.0 + w[1] * 4.0, 0.0]))
    assert g[1].tolist() == [4.0, 0.0]  # the caller's tensors are not modified
