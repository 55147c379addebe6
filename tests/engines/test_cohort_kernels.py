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
