"""The cohort step's channels-last convolution and max-pooling over stacked jobs: each job's values and gradients
as the same operation on that job alone, routed only where it applies."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from lit_asyncfl.engines.base import OneDNN
from lit_asyncfl.engines.cohort_kernels import BatchedKernels

pytestmark = pytest.mark.usefixtures("one_thread")


def folded(jobs, n, c, h, w, dtype=torch.float64, values=None):
    """A ``[jobs, n, c, h, w]`` input laid out as a routed operation's output (the jobs folded into the channels of
    a channels-last tensor) and the leaf tensor it is a view of (whose gradient autograd gives)."""
    leaf = torch.randn(n, h, w, jobs, c, dtype=dtype) if values is None else values.permute(1, 3, 4, 0, 2).contiguous()
    leaf.requires_grad_()
    return leaf.permute(3, 0, 4, 1, 2), leaf


def conv_pool(x, w, b, conv, pool):
    """A convolution with ReLU and a max-pooling with this test's options, then a loss that weighs every output."""
    y = F.max_pool2d(F.relu(F.conv2d(x, w, b, **conv)), **pool)
    return (y * torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y)).sum()


CASES = [  # convolution options, its weight's shape, max-pooling options
    ({"padding": 2}, (4, 3, 5, 5), {"kernel_size": 2}),
    ({"stride": 2, "padding": (1, 0), "dilation": 2, "groups": 3}, (6, 1, 3, 3), {"kernel_size": 3, "stride": 1}),
    ({}, (5, 3, 3, 3), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
]


@pytest.mark.parametrize("conv, weight, pool", CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_routed_values_and_gradients_equal_each_job_alone_in_float64(conv, weight, pool, bias):
    """vmap over 4 jobs (weights and samples batched), the gradient taken outside vmap as the cohort step does:
    each job's loss and gradients equal plain autograd on that job alone (1e-12), with both operations routed (the
    input, which needs a gradient, laid out as a routed operation leaves it)."""
    torch.manual_seed(0)
    jobs, dtype = 4, torch.float64
    x, leaf = folded(jobs, 5, 3, 9, 9)
    w = torch.randn(jobs, *weight, dtype=dtype, requires_grad=True)
    b = torch.randn(jobs, weight[0], dtype=dtype, requires_grad=True) if bias else None
    kernels = BatchedKernels()
    with kernels:
        losses = vmap(lambda x, w, b: conv_pool(x, w, b, conv, pool), in_dims=(0, 0, 0 if bias else None))(x, w, b)
    assert kernels.routed == {"conv2d": 1, "max_pool2d": 1}
    grads = list(torch.autograd.grad(losses.sum(), [leaf, w] + ([b] if bias else [])))
    grads[0] = grads[0].permute(3, 0, 4, 1, 2)  # the input's gradient, as [jobs, n, c, h, w]
    inputs = [x, w] + ([b] if bias else [])
    for j in range(jobs):
        alone = [t[j].detach().clone().requires_grad_() for t in inputs]
        loss = conv_pool(alone[0], alone[1], alone[2] if bias else None, conv, pool)
        torch.testing.assert_close(losses[j], loss, rtol=0, atol=1e-12)
        for got, want in zip(grads, torch.autograd.grad(loss, alone)):
            torch.testing.assert_close(got[j], want, rtol=0, atol=1e-12)


def test_nested_vmap_over_samples_is_routed_and_exact():
    """The padded step's inner vmap over single samples (weights batched at the outer level only)."""
    torch.manual_seed(1)
    x = torch.randn(3, 4, 1, 8, 8, dtype=torch.float64)
    w = torch.randn(3, 6, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)

    def job_loss(x, w, b):
        per_sample = vmap(lambda s: conv_pool(s[None], w, b, {"padding": 2}, {"kernel_size": 2}))(x)
        return per_sample.mean()

    kernels = BatchedKernels()
    with kernels:
        losses = vmap(job_loss)(x, w, b)
    assert kernels.routed == {"conv2d": 1, "max_pool2d": 1}
    got = torch.autograd.grad(losses.sum(), [w, b])
    for j in range(3):
        wj, bj = w[j].detach().clone().requires_grad_(), b[j].detach().clone().requires_grad_()
        loss = sum(conv_pool(x[j, i : i + 1], wj, bj, {"padding": 2}, {"kernel_size": 2}) for i in range(4)) / 4
        for g, want in zip(got, torch.autograd.grad(loss, [wj, bj])):
            torch.testing.assert_close(g[j], want, rtol=0, atol=1e-12)


def test_max_pooling_ties_send_the_gradient_to_the_same_sample_as_alone():
    """Integer inputs make many exact ties (and a NaN): the routed pooling's values and gradient are exactly those
    of F.max_pool2d on each job (the first maximum of a window in row-major order, in either layout)."""
    torch.manual_seed(2)
    values = torch.randint(0, 3, (4, 3, 2, 8, 8)).double()
    values[1, 0, 1, 2, 3] = float("nan")
    x, leaf = folded(4, 3, 2, 8, 8, values=values)
    weights = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    kernels = BatchedKernels()
    with kernels:
        y = vmap(lambda x: F.max_pool2d(x, 2))(x)
    assert kernels.routed == {"max_pool2d": 1}
    (got,) = torch.autograd.grad((y.nan_to_num(0) * weights).sum(), [leaf])
    got = got.permute(3, 0, 4, 1, 2)
    for j in range(4):
        alone = x[j].detach().clone().requires_grad_()
        want = F.max_pool2d(alone, 2)
        torch.testing.assert_close(y[j], want, rtol=0, atol=0, equal_nan=True)
        (want_grad,) = torch.autograd.grad((want.nan_to_num(0) * weights).sum(), [alone])
        assert torch.equal(got[j], want_grad)


def test_an_activation_laid_out_by_another_operation_is_left_to_vmap_and_exact():
    """An input that needs a gradient and is not laid out as a routed operation leaves it (here plain NCHW, as after
    a normalization or a residual sum) is not converted: vmap's rules run; the data (no gradient) is converted."""
    torch.manual_seed(4)
    x = torch.randn(3, 2, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 4, 2, 3, 3, dtype=torch.float64, requires_grad=True)
    kernels = BatchedKernels()
    with kernels:
        y = vmap(lambda x, w: F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 2))(x, w)
    assert not kernels.routed
    with kernels:
        data = vmap(lambda x, w: F.max_pool2d(F.relu(F.conv2d(x, w, padding=1)), 2))(x.detach(), w)
    assert kernels.routed == {"conv2d": 1, "max_pool2d": 1}  # the pooling reads the routed convolution's output
    for j in range(3):
        want = F.max_pool2d(F.relu(F.conv2d(x[j], w[j], padding=1)), 2)
        torch.testing.assert_close(y[j], want, rtol=0, atol=1e-12)
        torch.testing.assert_close(data[j], want, rtol=0, atol=1e-12)


def test_where_the_route_does_not_apply_vmaps_own_rules_run():
    """Under grad inside vmap, for a single job, with a string padding, without oneDNN, when indices are asked
    for, and outside vmap: nothing is routed, and the values are the usual ones."""
    torch.manual_seed(3)
    x, w = torch.randn(2, 3, 1, 6, 6), torch.randn(2, 4, 1, 3, 3)
    kernels = BatchedKernels()
    with kernels:
        vmap(grad(lambda w, x: F.max_pool2d(F.conv2d(x, w), 2).sum()))(w, x)
        vmap(lambda x, w: F.max_pool2d(F.conv2d(x, w), 2))(x[:1], w[:1])
        y = vmap(lambda x, w: F.conv2d(x, w, padding="same"))(x, w)
        with OneDNN(False):
            vmap(lambda x, w: F.conv2d(x, w))(x, w)
        vmap(lambda x: F.max_pool2d(x, 2, return_indices=True))(x)
        F.max_pool2d(F.conv2d(x[0], w[0]), 2)
    assert not kernels.routed
    torch.testing.assert_close(y[1], F.conv2d(x[1], w[1], padding="same"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_layers_and_the_cross_entropy_run_over_the_jobs_at_once_and_exact(reduction, bias):
    """F.linear as one batched matrix product over the jobs (any leading dimensions) and F.cross_entropy on every
    job's rows at once, reduced per job: each job's loss and gradients equal plain autograd on that job alone
    (1e-12), ignore_index included (the mean is over the samples not ignored, as nll_loss)."""
    torch.manual_seed(5)
    jobs, dtype = 4, torch.float64
    x = torch.randn(jobs, 6, 2, 7, dtype=dtype, requires_grad=True)
    w = torch.randn(jobs, 3, 7, dtype=dtype, requires_grad=True)
    b = torch.randn(jobs, 3, dtype=dtype, requires_grad=True) if bias else None
    y = torch.randint(0, 3, (jobs, 12))
    y[0, 1] = y[2, 5] = -100

    def loss(x, w, b, y):
        return F.cross_entropy(F.linear(F.linear(x, w, b).reshape(12, 3).tanh(), w[:, :3]), y, reduction=reduction)

    kernels = BatchedKernels()
    with kernels:
        losses = vmap(loss, in_dims=(0, 0, 0 if bias else None, 0))(x, w, b, y)
    assert kernels.routed == {"linear": 2, "cross_entropy": 1}
    inputs = [x, w] + ([b] if bias else [])
    grads = torch.autograd.grad(losses.sum(), inputs)
    for j in range(jobs):
        alone = [t[j].detach().clone().requires_grad_() for t in inputs]
        want = loss(alone[0], alone[1], alone[2] if bias else None, y[j])
        torch.testing.assert_close(losses[j], want, rtol=0, atol=1e-12)
        for got, want_grad in zip(grads, torch.autograd.grad(want.sum(), alone)):
            torch.testing.assert_close(got[j], want_grad, rtol=0, atol=1e-12)


def test_linear_and_cross_entropy_in_the_nested_vmap_over_samples_are_routed_and_exact():
    """The padded step's inner vmap over single samples: weights batched at the outer level only."""
    torch.manual_seed(6)
    x, y = torch.randn(3, 5, 8, dtype=torch.float64), torch.randint(0, 4, (3, 5))
    w = torch.randn(3, 4, 8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)

    def job_loss(x, y, w, b):
        return vmap(lambda s, t: F.cross_entropy(F.linear(s[None], w, b), t[None]))(x, y).mean()

    kernels = BatchedKernels()
    with kernels:
        losses = vmap(job_loss)(x, y, w, b)
    assert kernels.routed == {"linear": 1, "cross_entropy": 1}
    got = torch.autograd.grad(losses.sum(), [w, b])
    for j in range(3):
        wj, bj = w[j].detach().clone().requires_grad_(), b[j].detach().clone().requires_grad_()
        want = F.cross_entropy(F.linear(x[j], wj, bj), y[j])
        torch.testing.assert_close(losses[j], want, rtol=0, atol=1e-12)
        for g, want_grad in zip(got, torch.autograd.grad(want, [wj, bj])):
            torch.testing.assert_close(g[j], want_grad, rtol=0, atol=1e-12)


def test_cross_entropy_options_the_route_does_not_cover_run_vmaps_rules():
    """Class weights, label smoothing, probability targets, an input not batched over the jobs, a weight batched
    at an inner level only: not routed, the usual values."""
    torch.manual_seed(7)
    x, y, w = torch.randn(3, 5, 4), torch.randint(0, 4, (3, 5)), torch.randn(3, 4, 6)
    kernels = BatchedKernels()
    with kernels:
        a = vmap(lambda x, y: F.cross_entropy(x, y, weight=torch.ones(4)))(x, y)
        vmap(lambda x, y: F.cross_entropy(x, y, label_smoothing=0.1))(x, y)
        vmap(lambda x, p: F.cross_entropy(x, p))(x, x.softmax(-1))
        vmap(lambda w: F.linear(x[0], w))(w.transpose(1, 2))  # the input is the same for every job
        vmap(lambda s: vmap(lambda v: F.linear(s, v))(w.transpose(1, 2)))(x[0])  # weights batched inside only
    assert not kernels.routed
    torch.testing.assert_close(a[1], F.cross_entropy(x[1], y[1]))


def test_cross_entropy_routes_the_target_dtypes_it_takes_and_leaves_the_others_to_vmap():
    """F.cross_entropy takes int64 and uint8 class indices (int32 it rejects, vmap's own rule takes it): the route
    runs on those two only, so an int32 target keeps vmap's rule for the loss instead of raising in the routed call
    (which turned every kernel off)."""
    torch.manual_seed(7)
    x, y = torch.randn(3, 5, 4), torch.randint(0, 4, (3, 5))
    want = torch.stack([F.cross_entropy(x[j], y[j]) for j in range(3)])
    for dtype, routed in ((torch.long, 1), (torch.uint8, 1), (torch.int32, 0)):
        kernels = BatchedKernels()
        with kernels:
            got = vmap(lambda x, y: F.cross_entropy(x, y))(x, y.to(dtype))
        assert kernels.routed["cross_entropy"] == routed, dtype
        torch.testing.assert_close(got, want)
