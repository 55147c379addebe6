"""FedASMU's dynamic staleness weight (lit_asyncfl.server.dynamic_weight): control parameters learned from the
previous aggregation, tau_max."""

from __future__ import annotations

import math

import pytest
import torch
from builders import make_update

from lit_asyncfl.algorithms import FedASMU
from lit_asyncfl.core.server import Server
from lit_asyncfl.functional.fedasmu import (
    fedasmu_alpha,
    fedasmu_alpha_grads,
    fedasmu_xi,
)
from lit_asyncfl.server import Mixing
from lit_asyncfl.server.dynamic_weight import DynamicStalenessWeight


def _update(client, weights, base, base_version, lr=0.1, steps=2):
    return make_update(client, weights, base, base_version, num_steps=steps, info={"lr": lr})


def test_dynamic_weight_updates_control_parameters_from_the_previous_aggregation():
    cb = DynamicStalenessWeight(
        mu_alpha=1.0, lambda0=1.0, sigma0=1.0, iota0=0.2, lr_lambda=0.1, lr_sigma=0.1, lr_iota=0.1
    )
    server = Server(torch.tensor([0.0, 0.0]), Mixing(alpha=1.0), [cb], 1)
    server.on_fit_start()
    server.version = 3
    # first upload of device 0: initial controls; t = 3, s = 3 - 2 + 1 = 2
    first = _update(0, [1.0, 2.0], [0.0, 0.0], base_version=2)
    xi1 = 1.0 / math.sqrt(3 * 2 * 1.0) + 0.2
    alpha1 = xi1 / (1 + xi1)
    server.receive(first)
    assert first.info["alpha"] == pytest.approx(alpha1)
    assert torch.allclose(server.weights, torch.tensor([1.0, 2.0]) * alpha1)
    assert cb.controls(0) == (1.0, 1.0, 0.2)
    delta_prev = torch.tensor([1.0, 2.0])  # w_i - w_before (w_before = 0)
    # second upload: g = (w_o - w_i) / (lr * steps) = ([0.5, 0.5] - [0.3, 0.9]) / 0.2 = [1, -2]
    w_before = server.weights.clone()
    second = _update(0, [0.3, 0.9], [0.5, 0.5], base_version=4)
    server.receive(second)
    inner = float(torch.dot(torch.tensor([1.0, -2.0]), delta_prev))  # = -3
    d = fedasmu_alpha_grads(1.0, 1.0, 0.2, 3, 2, 1.0, inner)
    lam, sigma, iota = 1.0 - 0.1 * d[0], 1.0 - 0.1 * d[1], 0.2 - 0.1 * d[2]
    assert cb.controls(0) == pytest.approx((lam, sigma, iota))
    alpha2 = fedasmu_alpha(fedasmu_xi(lam, sigma, iota, 4, 1), 1.0)  # t = 4, s = 4 - 4 + 1 = 1
    assert second.info["alpha"] == pytest.approx(alpha2)
    assert torch.allclose(server.weights, (1 - alpha2) * w_before + alpha2 * torch.tensor([0.3, 0.9]))


def test_tau_max_bounds_t_minus_o_plus_one_and_discarded_updates_teach_nothing():
    algo = FedASMU(tau_max=3)
    _, dynamic = algo.server_callbacks
    server = Server(torch.zeros(2), algo.aggregator, algo.server_callbacks, 1)
    server.on_fit_start()
    server.version = 10
    assert not server.receive(_update(0, [1.0, 1.0], [0.0, 0.0], base_version=7))  # 10 - 7 + 1 = 4 > 3
    assert server.stats.discarded == 1 and dynamic._previous == {} and dynamic._controls == {}
    assert server.receive(_update(0, [1.0, 1.0], [0.0, 0.0], base_version=8))  # 10 - 8 + 1 = 3: kept
    assert 0 in dynamic._previous
