"""Server steps: the step a server optimizer receives is the aggregation's step as computed (not rebuilt from the
new model), checked against independent float64 computations of the papers' formulas."""

from __future__ import annotations

import torch
from builders import make_update

from lit_asyncfl.algorithms import FADAS
from lit_asyncfl.core.server import Server


def fadas_reference(w0: torch.Tensor, rounds: list[list[torch.Tensor]], lr: float, beta1=0.9, beta2=0.99, eps=1e-8):
    """FADAS's server update in float64 (Wang et al., 2024, Alg. 1; no delay adaptation: every update is fresh):
    Delta_t = mean_i Delta^i, m = b1 m + (1 - b1) Delta, v = b2 v + (1 - b2) Delta^2, v^ = max(v^, v),
    x += lr m / (sqrt(v^) + eps). ``rounds[t]`` holds the clients' float32 deltas of aggregation t."""
    x = w0.double()
    m = torch.zeros_like(x)
    v = torch.zeros_like(x)
    v_hat = torch.zeros_like(x)
    for deltas in rounds:
        delta = torch.stack([d.double() for d in deltas]).mean(0)
        m = beta1 * m + (1 - beta1) * delta
        v = beta2 * v + (1 - beta2) * delta**2
        v_hat = torch.maximum(v_hat, v)
        x = x + lr * m / (v_hat.sqrt() + eps)
    return x, m


def test_fadas_steps_on_the_averaged_change_itself_not_on_a_float32_rebuild():
    # Weights of magnitude ~10 and client changes of ~1e-5: rebuilding the average as (w + mean) - w in float32
    # rounds it to multiples of ulp(w) ~ 1e-6, a ~10% error that AMSGrad's normalisation passes to the direction.
    gen = torch.Generator().manual_seed(0)
    n, lr = 2000, 0.01
    w = torch.randn(n, generator=gen) * 10
    algo = FADAS(buffer_size=2, server_lr=lr, delay_threshold=None)
    opt = algo.server_callbacks[0]
    server = Server(w.clone(), algo.aggregator, algo.server_callbacks, num_clients=4)
    server.on_fit_start()
    rounds = []
    for t in range(4):
        base = server.weights
        deltas = []
        for client in range(2):
            local = base + torch.randn(n, generator=gen) * 1e-5 * (client + 1 + t)
            deltas.append(local - base)  # what the server reads: exact in float32 (Sterbenz)
            server.receive(make_update(client, local, base, base_version=server.version))
        rounds.append(deltas)
        assert server.version == t + 1
    x, m = fadas_reference(w, rounds, lr)
    # The moment is the averaged change scaled by 0.1 and accumulated: float32 rounding of the mean only.
    assert torch.allclose(opt.first_moment.double(), m, rtol=1e-5, atol=1e-12)
    # The model: the reference rounded once to float32 per step (|w| < 64, so ulp <= 7.6e-6 per step).
    assert (server.weights.double() - x).abs().max() < 4 * 7.7e-6
