"""FedASMU's formulas (lit_asyncfl.functional.fedasmu): alpha, beta and their hyper-gradients against autograd, hand
values and clamps."""

from __future__ import annotations

import math

import pytest
import torch

from lit_asyncfl.functional.fedasmu import (
    fedasmu_alpha,
    fedasmu_alpha_grads,
    fedasmu_beta,
    fedasmu_beta_grads,
    fedasmu_phi,
    fedasmu_xi,
)


@pytest.mark.parametrize(
    ("lam", "sigma", "iota", "t", "s", "mu"),
    [(1.0, 1.0, 0.2, 100, 5, 1.0), (2.5, 0.3, 0.0, 7, 1, 3.0), (0.4, 2.0, 1.5, 0, 2, 0.5)],
)
def test_alpha_and_its_hyper_gradients_match_autograd(lam, sigma, iota, t, s, mu):
    params = torch.tensor([lam, sigma, iota], dtype=torch.float64, requires_grad=True)
    xi = params[0] / torch.sqrt(torch.tensor(float(max(t, 1) * s), dtype=torch.float64) * params[1]) + params[2]
    alpha = mu * xi / (1 + mu * xi)
    alpha.backward()
    xi, alpha = float(xi.detach()), float(alpha.detach())
    assert fedasmu_xi(lam, sigma, iota, t, s) == pytest.approx(xi)
    assert fedasmu_alpha(xi, mu) == pytest.approx(alpha)
    inner = -0.37  # <g, Delta_prev>
    grads = fedasmu_alpha_grads(lam, sigma, iota, t, s, mu, inner)
    assert grads == pytest.approx((inner * params.grad).tolist(), rel=1e-10)


@pytest.mark.parametrize(("gamma", "upsilon", "g", "o", "mu"), [(10.0, 0.5, 50, 41, 1.0), (3.0, 1.7, 4, 1, 2.0)])
def test_beta_and_its_hyper_gradients_match_autograd(gamma, upsilon, g, o, mu):
    params = torch.tensor([gamma, upsilon], dtype=torch.float64, requires_grad=True)
    phi = params[0] / math.sqrt(g) * (1 - params[1] / math.sqrt(g - o + 1))
    beta = mu * phi / (1 + mu * phi)
    beta.backward()
    phi, beta = float(phi.detach()), float(beta.detach())
    assert fedasmu_phi(gamma, upsilon, g, o) == pytest.approx(phi)
    assert fedasmu_beta(phi, mu) == pytest.approx(beta)
    inner = 2.5
    assert fedasmu_beta_grads(gamma, upsilon, g, o, mu, inner) == pytest.approx((inner * params.grad).tolist())


def test_hand_values_and_clamps():
    # xi = 2 / sqrt(4 * 1 * 1) + 0.5 = 1.5; alpha = 2 * 1.5 / (1 + 3) = 0.75
    assert fedasmu_alpha(fedasmu_xi(2.0, 1.0, 0.5, 4, 1), mu_alpha=2.0) == 0.75
    # g = 4, o = 1: phi = 4 / sqrt(4) * (1 - 1 / sqrt(4 - 1 + 1)) = 1; beta = 3 * 1 / (1 + 3) = 0.75
    assert fedasmu_beta(fedasmu_phi(4.0, 1.0, 4, 1), mu_beta=3.0) == 0.75
    # negative xi / phi are clamped to 0: zero weight and zero hyper-gradient
    assert fedasmu_xi(1.0, 1.0, -5.0, 4, 1) == 0.0 and fedasmu_alpha_grads(1.0, 1.0, -5.0, 4, 1, 1.0, 3.0) == (0, 0, 0)
    assert fedasmu_phi(1.0, 9.0, 4, 1) == 0.0 and fedasmu_beta_grads(1.0, 9.0, 4, 1, 1.0, 3.0) == (0, 0)
    with pytest.raises(ValueError, match="must be newer"):
        fedasmu_phi(1.0, 0.5, 3, 3)
