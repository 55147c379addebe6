"""ASO-Fed (as re-implemented by third parties): a whole run replayed by hand from the recorded arrivals, a diverged
job, the proximal term's lam."""

from __future__ import annotations

import math

import pytest
import torch
from builders import RecordsArrivals, close
from conftest import run

from lit_asyncfl.algorithms import ASOFed
from lit_asyncfl.client.callbacks import ClientCallback
from lit_asyncfl.client.staleness_callbacks import DecayedCorrection

LR = 0.05  # conftest's LeNet5(lr=0.05)


class TrainedWeights(ClientCallback):
    """Put before DecayedCorrection: records each job's trained weights before the correction replaces them."""

    def __init__(self) -> None:
        self.trained: list[torch.Tensor] = []  # in training order: jobs are trained at their arrival events

    def on_train_end(self, trainer, job, update):
        self.trained.append(update.weights.clone())


def test_asofed_run_replayed_from_the_recorded_uploads(tmp_path):
    beta, log_base = 0.3, 2.0  # base 2: r_k > 1 from a mean delay above 2 versions, reached in this tiny run
    algorithm = ASOFed(lam=0.01, beta=beta, log_base=log_base, concurrency=4)
    record, trained = RecordsArrivals(), TrainedWeights()
    algorithm.server_callbacks.insert(0, record)
    algorithm.client_callbacks.insert(2, trained)  # after the step size and the proximal term, before the correction
    trainer = run(tmp_path, algorithm, num_clients=6, max_versions=24, data_kwargs={"partition": "dirichlet"})
    assert len(record.versions) == 24 and all(v["count"] == 1 for v in record.versions)
    assert all(a["accepted"] for a in record.arrivals)
    n_params = trainer.simulator.server.weights.numel()  # LeNet-5 has no floating buffers
    assert len(trained.trained) == len(record.arrivals)
    last_version: dict[int, int] = {}
    delays: dict[int, list[int]] = {}
    prev_s: dict[int, torch.Tensor] = {}
    h: dict[int, torch.Tensor] = {}
    factors = []
    for i, (arrival, version) in enumerate(zip(record.arrivals, record.versions)):
        k = arrival["client"]
        # the client's step size: r = max(1, log2(mean versions between its downloads)), lr = 0.05 r
        delays.setdefault(k, []).append(arrival["base_version"] - last_version.get(k, 0))
        last_version[k] = arrival["base_version"]
        mean = sum(delays[k]) / len(delays[k])
        r = max(1.0, math.log2(mean)) if mean > 0 else 1.0
        factors.append(r)
        assert arrival["info"]["step_size_factor"] == pytest.approx(r)
        assert arrival["info"]["lr"] == pytest.approx(LR * r)
        # the client's correction, from its trained weights: zeta = s - s_prev + h_prev, h = b h_prev + (1-b) s_prev
        s = arrival["base"] - trained.trained[i]
        zero = torch.zeros(n_params)
        zeta = s - prev_s.get(k, zero) + h.get(k, zero)
        h[k] = beta * h.get(k, zero) + (1 - beta) * prev_s.get(k, zero)
        prev_s[k] = s
        assert close(arrival["weights"], arrival["base"] - zeta)
        # the server: w <- w - (n_k / n_seen) zeta
        assert torch.equal(arrival["global"], version["before"])
        n_seen = sum({a["client"]: a["n"] for a in record.arrivals[: i + 1]}.values())
        assert close(version["after"], version["before"] - arrival["n"] / n_seen * zeta)
    assert max(factors) > 1.0  # the dynamic step size was exercised
    assert len({a["client"] for a in record.arrivals}) >= 3 and any(len(d) >= 3 for d in delays.values())


def test_a_diverged_asofed_job_teaches_the_clients_correction_nothing():
    from types import SimpleNamespace

    def job_end(callback, base, trained):
        update = SimpleNamespace(base_weights=base, weights=trained, info={})
        trainer = SimpleNamespace(flat=SimpleNamespace(param_numel=3))
        callback.on_train_end(trainer, SimpleNamespace(client=7), update)
        return update

    base = torch.tensor([1.0, 2.0, 3.0])
    first, later = base - torch.tensor([0.1, 0.2, 0.3]), base - torch.tensor([0.4, -0.2, 0.0])
    twin, diverged = DecayedCorrection(beta=0.5), DecayedCorrection(beta=0.5)
    for callback in (twin, diverged):
        job_end(callback, base, first.clone())
    nan = job_end(diverged, base, torch.tensor([float("nan"), 0.0, 0.0]))
    assert nan.info["client_state"] == "not learned: non-finite weights" and torch.isnan(nan.weights[0])
    a, b = job_end(twin, base, later.clone()), job_end(diverged, base, later.clone())
    # by hand: s = (0.4, -0.2, 0), s_pre = (0.1, 0.2, 0.3), h_pre = 0: zeta = s - s_pre, uploaded w_g - zeta
    torch.testing.assert_close(b.weights, base - (torch.tensor([0.4, -0.2, 0.0]) - torch.tensor([0.1, 0.2, 0.3])))
    assert torch.equal(a.weights, b.weights) and torch.equal(twin.h[7], diverged.h[7])


def test_asofed_passes_its_lam_to_the_proximal_term():
    assert ASOFed(lam=0.3).client_callbacks[1].mu == 0.3
