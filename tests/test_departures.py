"""Small departures from the authors' code, aligned (an argument whose default matches them), each checked by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from core.test_client_state import _job, _one_client_trainer

from lit_asyncfl.algorithms import WKAFL, FedCompass, FedDyn
from lit_asyncfl.client import DynamicRegularizer
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.functional.feddyn import feddyn_gradient
from lit_asyncfl.functional.wkafl import staleness_weights, two_stage_aggregate
from lit_asyncfl.models import LogisticRegression
from lit_asyncfl.server.grouped import GroupedDeltaStep


def test_feddyn_clips_the_task_and_linear_terms_at_the_authors_norm_then_adds_alpha_theta():
    assert FedDyn().client_callbacks[0].max_grad_norm == 10.0  # the authors' max_norm
    assert FedDyn(max_grad_norm=None).client_callbacks[0].max_grad_norm is None
    # By hand: grad 3, -alpha theta^{t-1} = -0.1 * 1, g_k = 0.5: the linear part 2.4 clipped to 2, plus 0.1 * 4.
    got = feddyn_gradient(torch.tensor([3.0]), torch.tensor([4.0]), torch.tensor([1.0]), torch.tensor([0.5]), 0.1, 2.0)
    assert torch.allclose(got, torch.tensor([2.0 * (1 - 1e-6 / 2.4) + 0.4]), atol=1e-6)

    torch.manual_seed(0)
    x, y = torch.randn(4, 3) * 20, torch.tensor([0, 1, 1, 0])  # large inputs: gradients of norm > 1
    module = LogisticRegression(input_dim=3, num_classes=2, lr=0.1)
    alpha, lr, clip = 0.3, 0.1, 1.0
    reg = DynamicRegularizer(alpha, max_grad_norm=clip)
    trainer = _one_client_trainer(module, [reg], x, y, batch_size=4)  # one full batch: one step per job
    theta0 = trainer.flat.read()

    def task_grad(theta):  # the task loss's gradient at theta, by autograd on a fresh copy of the model
        copy = LogisticRegression(input_dim=3, num_classes=2)
        torch.nn.utils.vector_to_parameters(theta.clone(), copy.parameters())
        F.cross_entropy(copy(x), y).backward()
        return torch.cat([p.grad.reshape(-1) for p in copy.parameters()])

    assert task_grad(theta0).norm() > 2 * clip  # the clip binds
    first = trainer.train(_job(), theta0)
    expected = theta0 - lr * feddyn_gradient(task_grad(theta0), theta0, theta0, None, alpha, clip)
    assert torch.allclose(first.weights, expected, atol=1e-6)
    g = -alpha * (first.weights - theta0)
    start = first.weights + 0.05
    second = trainer.train(_job(job_id=1), start)
    expected = start - lr * feddyn_gradient(task_grad(start), start, start, g, alpha, clip)
    assert torch.allclose(second.weights, expected, atol=1e-6)
    unclipped = start - lr * feddyn_gradient(task_grad(start), start, start, g, alpha)
    assert not torch.allclose(second.weights, unclipped, atol=1e-3)


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


def _late(client: int, job_id: int, delta: float, base_version: int = 0) -> ClientUpdate:
    job = ClientJob(job_id, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.tensor([delta]), torch.tensor([0.0]), 10, 1, 0.0)


@pytest.mark.parametrize("latest_per_client", [True, False])
def test_fedcompass_aggregates_one_update_per_client_its_newest_as_appfl(latest_per_client):
    assert FedCompass().aggregator.latest_per_client  # APPFL's buffers are keyed by client
    agg = GroupedDeltaStep(alpha=1.0, staleness_exponent=0.0, latest_per_client=latest_per_client)
    server = Server(torch.zeros(1), agg, [], num_clients=2)
    server.on_fit_start()
    # Client 0: two late updates (jobs 1 and 3), then its update to group 7 (job 5); client 1 in group 7 (job 4).
    for job_id, client, key, delta in [(1, 0, "general", 1.0), (3, 0, "general", 2.0), (4, 1, "7", 8.0)]:
        agg.route(job_id, key)
        server.receive(_late(client, job_id, delta))
    agg.release("general", "7", server=server)
    assert server.flush()
    if latest_per_client:  # job 3 supersedes job 1: (2 + 8) / N
        assert server.weights.item() == pytest.approx((2.0 + 8.0) / 2)
        assert server.stats.discarded == 1 and server.stats.reasons == {"superseded": 1}
        assert server.stats.aggregated == 2
    else:
        assert server.weights.item() == pytest.approx((1.0 + 2.0 + 8.0) / 2)
        assert server.stats.discarded == 0 and server.stats.aggregated == 3
    # A late update and the same client's update to the group aggregated with it: the group's (newer) one only.
    agg.route(6, "general")
    server.receive(_late(0, 6, 4.0, base_version=1))
    agg.route(9, "8")
    server.receive(_late(0, 9, 16.0, base_version=1))
    agg.release("general", "8", server=server)
    before = server.weights.item()
    assert server.flush()
    expected = 16.0 if latest_per_client else 20.0
    assert server.weights.item() == pytest.approx(before + expected / 2)
