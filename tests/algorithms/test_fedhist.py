"""FedHist: EGS, HAA, INA against hand computation, reduction to FedAvg, the DynSGD and TWAFL weights, exact resume
(its scheduler: schedulers/test_k_async.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from builders import make_update
from conftest import global_weights, make_trainer, run
from torch.utils.data import TensorDataset

from lit_asyncfl.algorithms import TWAFL, DynSGD, FedAvg, FedHist
from lit_asyncfl.core.server import Server
from lit_asyncfl.data import DigitsDataModule, RareClassOnSlowClients
from lit_asyncfl.devices import UniformRatio
from lit_asyncfl.models import LeNet5
from lit_asyncfl.server import DeltaAverage
from lit_asyncfl.server.gradient_history import GradientHistory
from lit_asyncfl.server.gradient_stability import GradientStability
from lit_asyncfl.server.history_weights import HistoryAwareWeight
from lit_asyncfl.server.norm_amplification import NormAmplification

E2 = math.e / 2


def update_with_gradient(gradient, base_version=0, client=0, staleness=0):
    base = torch.zeros(len(gradient))
    u = make_update(client, base - torch.tensor(gradient), base, base_version)
    u.staleness = staleness
    return u


def test_egs_fuses_with_the_least_similar_cached_global_gradient():
    history = GradientHistory(length=2)
    egs = GradientStability(history, alpha=0.5)
    server = Server(torch.zeros(2), DeltaAverage(1), [history, egs], 1)
    server.on_fit_start()
    history.global_gradients.extend([torch.tensor([1.0, 0.1]), torch.tensor([-1.0, 1.0])])
    server.version = 2  # round 3 > h = 2: fusion
    u = history.transform_update(server, update_with_gradient([1.0, 0.0]))
    u = egs.transform_update(server, u)
    # cos with [1, .1] = .995; with [-1, 1] = -.707: the second is the least similar
    assert u.info["egs_partner"] == 1
    assert torch.allclose(-u.delta, torch.tensor([1.0, 0.0]) + 0.5 * torch.tensor([-1.0, 1.0]))
    assert torch.equal(u.info["gradient"], torch.tensor([1.0, 0.0]))  # the original is kept for INA and HAA
    server.version = 1  # round 2 <= h: no fusion
    v = egs.transform_update(server, history.transform_update(server, update_with_gradient([1.0, 0.0])))
    assert torch.equal(-v.delta, torch.tensor([1.0, 0.0])) and "egs_partner" not in v.info


def _entry(client, base_version, staleness, gradient):
    return {"client": client, "base_version": base_version, "staleness": staleness, "gradient": torch.tensor(gradient)}


def test_relatively_fresh_set_is_exactly_the_gradients_computed_from_that_version():
    history = GradientHistory(length=3)
    history.rounds.extend(
        [
            {"round": 4, "entries": [_entry(0, 3, 1, [1.0, 0.0]), _entry(1, 1, 3, [0.0, 1.0])]},
            {"round": 5, "entries": [_entry(2, 3, 2, [2.0, 0.0]), _entry(3, 4, 1, [0.0, 2.0])]},
            {"round": 6, "entries": [_entry(4, 3, 3, [3.0, 0.0]), _entry(5, 5, 1, [0.0, 3.0])]},
        ]
    )
    fresh = history.relatively_fresh(3)
    assert [g.tolist() for g in fresh] == [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]  # arrived in rounds 4, 5 and 6
    assert history.relatively_fresh(2) == []


def test_haa_utility_reward_penalty_and_weights_by_hand():
    history = GradientHistory(length=2)
    haa = HistoryAwareWeight(history, lam=0.5, similarity_threshold=0.2, ema_rate=0.5, max_exponent=50)
    server = Server(torch.zeros(2), DeltaAverage(2, normalize=True), [history, haa], 3)
    server.on_fit_start()
    # after round r = 5 with h = 2, v = 3: S = gradients computed from version 3; scored: round 4's entries
    history.rounds.extend(
        [
            {"round": 4, "entries": [_entry(7, 3, 1, [1.0, 0.0]), _entry(8, 1, 3, [-1.0, 0.2])]},
            {"round": 5, "entries": [_entry(9, 3, 2, [1.0, 1.0])]},
        ]
    )
    server.version = 5
    haa.on_aggregated(server, [])
    # g_pred = mean([1, 0], [1, 1]) = [1, 0.5], |S| = 2
    cos7 = 1.0 / math.sqrt(1.25)
    cos8 = (-1.0 + 0.1) / (math.sqrt(1.04) * math.sqrt(1.25))
    util7 = (cos7 - 0.2) * (E2 - 1) ** -1 * 2  # reward: cos >= threshold, base e/2 - 1
    util8 = (cos8 - 0.2) * E2**-3 * 2  # penalty: cos < threshold, base e/2
    assert haa.utility(7) == pytest.approx(0.5 * util7) and haa.utility(8) == pytest.approx(0.5 * util8)
    assert haa.utility(8) < 0 < haa.utility(7) and haa.utility(9) == 0.0
    # weights: (e/2)^-tau + lambda * Util, tau = t - o + 1 (staleness 0 -> tau 1)
    w7 = haa.weight_update(server, update_with_gradient([0.0, 0.0], client=7, staleness=0), 1.0)
    assert w7 == pytest.approx(E2**-1 + 0.5 * haa.utility(7))
    haa._utilities[8] = -1e9  # a huge penalty: the weight stays at the positive floor
    assert haa.weight_update(server, update_with_gradient([0.0, 0.0], client=8, staleness=4), 1.0) == 1e-6


def test_haa_overflow_guard_caps_the_staleness_exponent():
    history = GradientHistory(length=1)
    haa = HistoryAwareWeight(history, lam=1.0, similarity_threshold=0.0, ema_rate=1.0, max_exponent=3)
    server = Server(torch.zeros(2), DeltaAverage(1), [history, haa], 1)
    server.on_fit_start()
    history.rounds.append({"round": 2, "entries": [_entry(0, 1, 10_000, [1.0, 0.0])]})
    server.version = 2
    haa.on_aggregated(server, [])
    assert haa.utility(0) == pytest.approx(1.0 * (E2 - 1) ** -3 * 1)  # exponent 10,000 capped at 3: finite


def test_ina_output_norm_equals_the_formula_and_keeps_the_direction():
    ina = NormAmplification(mu=0.01)
    server = Server(torch.zeros(3), DeltaAverage(2, server_lr=0.5), [ina], 2)
    server.version = 9  # round r = 10
    ups = [update_with_gradient([3.0, 4.0, 0.0]), update_with_gradient([0.0, 0.0, 1.0])]
    step = torch.tensor([0.2, -0.1, 0.4])
    out = ina.transform_aggregate(server, step, ups)
    target = 0.5 * (1 - 0.01 * 10) * (5.0 + 1.0) / 2  # eta * (1 - mu r) / K * sum ||g_i||
    assert float(out.norm()) == pytest.approx(target)
    assert torch.allclose(out / out.norm(), step / step.norm())


class Digits64(DigitsDataModule):
    """Digits in float64: FedHist (w + mean of deltas) and FedAvg (mean of models) differ by float32 rounding
    (3e-8 after one round), which LeNet's ReLU/max-pool ties amplify to 1e-4 within a few rounds of training;
    in float64 the two stay within 1e-16 and the comparison tests the algebra, not the chaos."""

    def setup(self, stage=None):
        super().setup(stage)
        self.train_set = TensorDataset(self.train_set.tensors[0].double(), self.train_set.tensors[1])
        self.test_set = TensorDataset(self.test_set.tensors[0].double(), self.test_set.tensors[1])


def test_fedhist_without_its_parts_and_k_equal_n_is_synchronous_fedavg(tmp_path):
    results = []
    for name, algo in [
        ("fedhist", FedHist(k=3, history_length=2, egs_alpha=0.0, haa_lambda=0.0, ina=False)),
        ("fedavg", FedAvg(clients_per_round=3)),
    ]:
        trainer = make_trainer(tmp_path / name, algo, num_clients=3, max_versions=4)  # 1437 = 3 x 479 samples
        trainer.fit(LeNet5().double(), datamodule=Digits64())
        results.append(trainer)
    assert results[0].summary["mean_staleness"] == 0.0 and results[0].summary["versions"] == 4
    assert torch.allclose(global_weights(results[0]), global_weights(results[1]), rtol=0, atol=1e-12)


def test_dynsgd_and_twafl_weights_by_hand():
    for algo, expected in [
        (DynSGD(k=2, server_lr=1.0), (1 / 1 * 2.0 + 1 / 3 * 6.0) / 2),  # lr / tau, divided by K
        (DynSGD(k=2, server_lr=1.0, normalize=True), (1 / 1 * 2.0 + 1 / 3 * 6.0) / (1 / 1 + 1 / 3)),  # FedHist's
        (TWAFL(k=2, server_lr=1.0), (E2**-1 * 2.0 + E2**-3 * 6.0) / (E2**-1 + E2**-3)),  # normalised (e/2)^-tau
    ]:
        server = Server(torch.zeros(1), algo.aggregator, algo.server_callbacks, 2)
        server.on_fit_start()
        server.version = 2
        server.receive(update_with_gradient([-2.0], base_version=2))  # tau = 1, delta +2
        server.receive(update_with_gradient([-6.0], base_version=0))  # tau = 3, delta +6
        assert float(server.weights[0]) == pytest.approx(expected), type(algo).__name__


def test_rare_class_lives_only_on_the_slowest_clients(tmp_path):
    part = RareClassOnSlowClients(rare_classes=[7], num_slow_clients=3, base="dirichlet", alpha=0.5)
    dm = DigitsDataModule(partition=part)
    trainer = make_trainer(tmp_path, FedHist(k=5), num_clients=20, max_versions=2, device_model=UniformRatio(5.0))
    trainer.fit(LeNet5(), datamodule=dm)
    sim = trainer.simulator
    shards = sim.executor.trainer.shards
    holders = {c for c in range(20) if bool((shards.targets[shards.indices[c]] == 7).any())}
    slowest = set(np.argsort(-sim.profiles.time_per_sample)[:3].tolist())
    assert holders == slowest
    assert sum(shards.num_samples(c) for c in range(20)) == len(dm.train_set)
    with pytest.raises(ValueError, match="pass one slowness per client"):
        part(np.zeros(10, dtype=np.int64), 2, np.random.default_rng(0))


def test_fedhist_resumes_exactly_with_its_buffer_and_utilities(tmp_path):
    algo = lambda: FedHist(k=4, history_length=3)  # noqa: E731
    full = run(tmp_path / "full", algo(), num_clients=12, max_versions=14, data_kwargs={"partition": "dirichlet"})
    first = run(
        tmp_path / "first",
        algo(),
        num_clients=12,
        max_virtual_time=0.6 * full.simulator.now,
        data_kwargs={"partition": "dirichlet"},
    )
    assert len(first.algorithm.server_callbacks[0].rounds) == 3 and first.algorithm.server_callbacks[2]._utilities
    ckpt = next((tmp_path / "first").rglob("last.ckpt"))
    resumed = make_trainer(tmp_path / "resumed", algo(), num_clients=12, max_versions=14)
    resumed.fit(LeNet5(lr=0.05), datamodule=DigitsDataModule(partition="dirichlet"), ckpt_path=str(ckpt))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed.algorithm.server_callbacks[2]._utilities == full.algorithm.server_callbacks[2]._utilities
