"""FedDyn: the clipped task and linear terms as in the authors' code, the quadratic term's pull towards the start
model, each checked by hand (the client step and state: core/test_client_state.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from builders import make_job, one_client_trainer

from lit_asyncfl.algorithms import FedDyn
from lit_asyncfl.client import DynamicRegularizer, LocalTrainer
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.functional.feddyn import feddyn_gradient
from lit_asyncfl.models import LogisticRegression


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
    trainer = one_client_trainer(module, [reg], x, y, batch_size=4)  # one full batch: one step per job
    theta0 = trainer.flat.read()

    def task_grad(theta):  # the task loss's gradient at theta, by autograd on a fresh copy of the model
        copy = LogisticRegression(input_dim=3, num_classes=2)
        torch.nn.utils.vector_to_parameters(theta.clone(), copy.parameters())
        F.cross_entropy(copy(x), y).backward()
        return torch.cat([p.grad.reshape(-1) for p in copy.parameters()])

    assert task_grad(theta0).norm() > 2 * clip  # the clip binds
    first = trainer.train(make_job(), theta0)
    expected = theta0 - lr * feddyn_gradient(task_grad(theta0), theta0, theta0, None, alpha, clip)
    assert torch.allclose(first.weights, expected, atol=1e-6)
    g = -alpha * (first.weights - theta0)
    start = first.weights + 0.05
    second = trainer.train(make_job(job_id=1), start)
    expected = start - lr * feddyn_gradient(task_grad(start), start, start, g, alpha, clip)
    assert torch.allclose(second.weights, expected, atol=1e-6)
    unclipped = start - lr * feddyn_gradient(task_grad(start), start, start, g, alpha)
    assert not torch.allclose(second.weights, unclipped, atol=1e-3)


def test_feddyn_quadratic_term_pulls_every_later_step_towards_the_start_model():
    """Two full-batch steps per job: the second step's gradient has alpha (theta - theta^{t-1}) (zero at the
    first step, so a one-step job cannot tell whether the quadratic term is there or has the right sign)."""
    torch.manual_seed(0)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 1, 0])
    alpha, lr = 0.7, 0.1
    reg = DynamicRegularizer(alpha)
    trainer = LocalTrainer(LogisticRegression(input_dim=3, num_classes=2, lr=lr),
                           ClientShards(x, y, [torch.arange(4)]), batch_size=4, callbacks=[reg])  # fmt: skip
    g = torch.linspace(-0.2, 0.3, 8)
    reg.store.put(0, reg.STATE_NAME, g)  # the client's state from earlier rounds

    def task_grad(theta):
        w = theta[:6].view(2, 3).clone().requires_grad_()
        b = theta[6:].clone().requires_grad_()
        F.cross_entropy(x @ w.T + b, y).backward()
        return torch.cat([w.grad.reshape(-1), b.grad])

    start = trainer.flat.read()
    job = ClientJob(0, 0, 0, 0.0, JobTiming(0, 1, 0), seed=7, local_epochs=2)
    update = trainer.train(job, start)
    theta = start.clone()
    for _ in range(2):
        theta = theta - lr * (task_grad(theta) - g + alpha * (theta - start))
    assert torch.allclose(update.weights, theta, atol=1e-7)
    assert torch.allclose(reg.store.get(0, reg.STATE_NAME), g - alpha * (theta - start), atol=1e-7)
