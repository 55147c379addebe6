"""FedFa, CA2FL and FADAS: formulas against hand values and independent implementations, whole runs replayed by hand
from the recorded uploads, determinism, exact resume, refused settings, configs that run."""

from __future__ import annotations

import math
import warnings
from collections import deque

import pytest
import torch
import yaml
from builders import ROOT
from conftest import RecordsVersions, assert_same, check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import CA2FL, FADAS, PRESETS, FedFa
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.functional.adaptive import amsgrad_direction, delay_adaptive_lr
from lit_asyncfl.functional.calibration import calibrated_update, calibration_residual, sliding_window_average
from lit_asyncfl.server import (
    AdaptiveServerOptimizer,
    CalibratedDeltaAverage,
    ClientUpdateCache,
    DeltaAverage,
    SlidingWindowAverage,
)
from lit_asyncfl.server.base import ServerCallback


def make_update(client: int, weights, base, base_version: int = 0) -> ClientUpdate:
    job = ClientJob(0, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.tensor(weights), torch.tensor(base), 10, 1, 0.0)


# ---------------------------------------------------------------------------------------------------------- formulas


def test_sliding_window_average_by_hand():
    models = [torch.tensor([1.0, 0.0]), torch.tensor([2.0, 3.0]), torch.tensor([6.0, 3.0])]
    assert torch.allclose(sliding_window_average(models), torch.tensor([3.0, 2.0]))
    weighted = sliding_window_average(models, [1.0, 1.0, 2.0])  # (1 + 2 + 12) / 4, (0 + 3 + 6) / 4
    assert torch.allclose(weighted, torch.tensor([3.75, 2.25]))
    with pytest.raises(ValueError, match="window is empty"):
        sliding_window_average([])


def test_calibrated_update_by_hand():
    # h_t = [1, 0]; two buffered clients: residuals (Delta - h^i) = [2, 2] - [1, 1] and [0, -4] - 0
    residuals = [calibration_residual(torch.tensor([2.0, 2.0]), torch.tensor([1.0, 1.0])),
                 calibration_residual(torch.tensor([0.0, -4.0]), None)]  # fmt: skip
    assert torch.equal(residuals[0], torch.tensor([1.0, 1.0])) and torch.equal(residuals[1], torch.tensor([0.0, -4.0]))
    v = calibrated_update(torch.tensor([1.0, 0.0]), residuals)
    assert torch.allclose(v, torch.tensor([1.0 + 0.5, 0.0 - 1.5]))
    assert torch.allclose(calibrated_update(None, residuals), torch.tensor([0.5, -1.5]))  # h_1 = 0: FedBuff


def test_amsgrad_direction_two_steps_by_hand():
    b1, b2, eps = 0.9, 0.99, 1e-8
    z = torch.zeros(1)
    first = amsgrad_direction(torch.tensor([0.2]), z, z, z, 1, b1, b2, eps)
    m1, v1 = 0.1 * 0.2, 0.01 * 0.04
    assert first.first_moment.item() == pytest.approx(m1) and first.second_moment.item() == pytest.approx(v1)
    assert first.direction.item() == pytest.approx(m1 / (math.sqrt(v1) + eps))
    second = amsgrad_direction(torch.tensor([0.01]), *first[1:], 2, b1, b2, eps)
    m2, v2 = 0.9 * m1 + 0.1 * 0.01, 0.99 * v1 + 0.01 * 1e-4
    assert second.second_moment.item() == pytest.approx(v2)
    assert second.max_second_moment.item() == pytest.approx(v1)  # v fell: AMSGrad keeps the maximum
    assert second.direction.item() == pytest.approx(m2 / (math.sqrt(v1) + eps))
    adam = amsgrad_direction(torch.tensor([0.01]), *first[1:], 2, b1, b2, eps, amsgrad=False)
    assert adam.direction.item() == pytest.approx(m2 / (math.sqrt(v2) + eps))  # FedAdam: v itself
    with pytest.raises(ValueError, match="step must be >= 1"):
        amsgrad_direction(torch.tensor([0.2]), z, z, z, 0)


@pytest.mark.parametrize("amsgrad", [True, False], ids=["amsgrad", "adam"])
def test_bias_corrected_direction_equals_torch_adam(amsgrad):
    """With bias corrections the step is torch.optim.Adam's on the gradient -Delta (an independent implementation)."""
    torch.manual_seed(0)
    lr, b1, b2, eps = 0.01, 0.9, 0.99, 1e-8
    param = torch.nn.Parameter(torch.randn(5))
    optimizer = torch.optim.Adam([param], lr=lr, betas=(b1, b2), eps=eps, amsgrad=amsgrad)
    ours = param.detach().clone()
    m = v = v_hat = torch.zeros(5)
    for step in range(1, 8):
        delta = torch.randn(5) * (2.0 if step % 3 == 0 else 0.3)  # the second moment falls sometimes
        param.grad = -delta
        optimizer.step()
        d, m, v, v_hat = amsgrad_direction(delta, m, v, v_hat, step, b1, b2, eps, amsgrad, bias_correction=True)
        ours = ours + lr * d
        assert torch.allclose(ours, param.detach(), rtol=1e-6, atol=1e-7), step


@pytest.mark.parametrize(
    "lr, max_staleness, threshold, expected",
    [
        (0.01, 0, 1, 0.01),
        (0.01, 1, 1, 0.01),  # at the threshold: unchanged
        (0.01, 2, 1, 0.005),
        (0.01, 10, 1, 0.001),
        (0.01, 10, None, 0.01),  # no delay adaptation
        (1.0, 4, 0, 0.25),  # eta = 1: the paper's min(eta, 1 / tau) agrees
    ],
)
def test_delay_adaptive_lr_by_hand(lr, max_staleness, threshold, expected):
    assert delay_adaptive_lr(lr, max_staleness, threshold) == pytest.approx(expected)


def test_client_update_cache_mean_replacement_compact_storage_and_state():
    cache = ClientUpdateCache()
    assert cache.mean(4) is None and cache.get(1) is None
    cache.put(1, torch.tensor([4.0, 0.0]))
    cache.put(2, torch.tensor([0.0, 8.0]))
    cache.put(1, torch.tensor([2.0, 2.0]))  # replaces client 1's entry
    assert len(cache) == 2 and torch.allclose(cache.mean(4), torch.tensor([0.5, 2.5]))
    state = cache.state_dict()
    other = ClientUpdateCache()
    other.load_state_dict(state)
    assert torch.equal(other.mean(4), cache.mean(4)) and torch.equal(other.get(1), torch.tensor([2.0, 2.0]))
    half = ClientUpdateCache("float16")
    half.put(0, torch.full((1000,), 1.0 / 3.0))
    assert half.entries[0].dtype == torch.float16 and half.nbytes == 1000 * 2 + 1000 * 8
    assert half.get(0).dtype == torch.float32
    assert torch.equal(half.mean(1), half.get(0))  # the sum is of the stored (rounded) entries
    with pytest.raises(ValueError, match="checkpoint's cache holds float32"):
        half.load_state_dict(state)


def test_a_finite_update_beyond_the_cache_range_is_refused_naming_the_value():
    half = ClientUpdateCache("float16")
    with pytest.raises(ValueError, match=r"client 7's update reaches 70000, beyond the range of the float16 cache"):
        half.put(7, torch.tensor([1.0, -70000.0]))
    assert len(half) == 0 and half.mean(2) is None  # nothing was cached
    wide = ClientUpdateCache("bfloat16")
    wide.put(7, torch.tensor([1.0, -70000.0]))
    assert torch.isfinite(wide.mean(1)).all()


def test_calibrated_aggregator_by_hand_on_a_tiny_server():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=0.5)
    server = Server(torch.zeros(1), agg, [], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0], [0.0]))
    server.receive(make_update(1, [4.0], [0.0]))
    # round 1: h_1 = 0, v = (2 + 4) / 2 = 3, x = 0 + 0.5 * 3; then h_2 = (2 + 4) / 4 = 1.5
    assert server.weights.item() == pytest.approx(1.5) and agg.cache_mean.item() == pytest.approx(1.5)
    server.receive(make_update(0, [2.5], [1.5], base_version=1))  # Delta = 1, residual 1 - 2 = -1
    server.receive(make_update(2, [3.5], [1.5], base_version=1))  # Delta = 2, residual 2 - 0 = 2
    # round 2: v = 1.5 + (-1 + 2) / 2 = 2, x = 1.5 + 0.5 * 2 = 2.5; h_3 = (1 + 4 + 2) / 4
    assert server.weights.item() == pytest.approx(2.5) and agg.cache_mean.item() == pytest.approx(7 / 4)


def test_sliding_window_aggregator_waits_for_k_models_then_moves_at_every_arrival():
    agg = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), agg, [], num_clients=3)
    server.on_fit_start()
    assert not server.receive(make_update(0, [2.0], [0.0])) and server.version == 0  # warm-up
    assert server.receive(make_update(1, [4.0], [0.0])) and server.weights.item() == pytest.approx(3.0)
    assert server.receive(make_update(2, [10.0], [3.0], 1)) and server.weights.item() == pytest.approx(7.0)
    assert server.stats.aggregated == 3 and len(agg.window) == 2


def test_adaptive_optimizer_commits_its_moments_only_when_the_step_is_applied():
    opt = AdaptiveServerOptimizer(server_lr=0.1, delay_threshold=1)
    server = Server(torch.zeros(2), DeltaAverage(1), [opt], num_clients=2)
    server.on_fit_start()
    server.version = 3
    assert server.receive(make_update(0, [0.5, -0.2], [0.0, 0.0], base_version=0))  # staleness 3 > 1
    assert opt.steps == 1 and opt.last_lr == pytest.approx(0.1 / 3)
    expected = amsgrad_direction(torch.tensor([0.5, -0.2]), *[torch.zeros(2)] * 3, 1).direction * (0.1 / 3)
    assert torch.allclose(server.weights, expected)
    before = opt.state_dict()
    huge = make_update(1, [3e38, 0.0], [-3e38, 0.0], base_version=1)  # a finite upload whose delta overflows
    assert not server.receive(huge) and server.stats.reasons["non_finite_aggregate"] == 1
    assert opt.steps == 1 and torch.equal(opt.first_moment, before["first_moment"])  # learned nothing


class PoisonFirstStep(ServerCallback):
    """Makes the first aggregated step non-finite, so that the server refuses it."""

    def __init__(self) -> None:
        self.calls = 0

    def transform_aggregate(self, server, step, updates):
        self.calls += 1
        return step * float("inf") if self.calls == 1 else step


class DoubleClientZero(ServerCallback):
    def weight_update(self, server, update, weight):
        return weight * (2.0 if update.client == 0 else 1.0)


def test_a_refused_ca2fl_step_teaches_the_cache_nothing():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=1.0)
    server = Server(torch.zeros(2), agg, [], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [1.0, 1.0], [0.0, 0.0]))
    # a finite upload whose delta overflows: the aggregate is refused, both updates counted as rejected
    assert not server.receive(make_update(1, [3e38, 0.0], [-3e38, 0.0]))
    assert server.stats.reasons["non_finite_aggregate"] == 2 and server.version == 0
    assert len(agg.cache) == 0 and agg.cache_mean is None  # nothing of the refused buffer was cached
    server.receive(make_update(2, [1.0, 3.0], [0.0, 0.0]))
    assert server.receive(make_update(3, [3.0, 1.0], [0.0, 0.0]))
    # h_1 = 0 (the refused buffer left no trace): v = ((1, 3) + (3, 1)) / 2 = (2, 2); h_2 = (4, 4) / 4
    assert torch.allclose(server.weights, torch.tensor([2.0, 2.0])) and torch.allclose(agg.cache_mean, torch.ones(2))
    server.receive(make_update(0, [3.0, 2.0], [2.0, 2.0], base_version=1))  # Delta (1, 0), residual (1, 0) - 0
    assert server.receive(make_update(2, [2.0, 2.0], [2.0, 2.0], base_version=1))  # Delta 0, residual -(1, 3)
    # v = h_2 + ((1, 0) - (1, 3)) / 2 = (1, 1) + (0, -1.5)
    assert torch.allclose(server.weights, torch.tensor([3.0, 1.5]))


def test_a_refused_fedfa_model_never_enters_the_window():
    agg = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), agg, [PoisonFirstStep()], num_clients=4)
    server.on_fit_start()
    server.receive(make_update(0, [2.0], [0.0]))
    assert not server.receive(make_update(1, [4.0], [0.0])) and server.stats.reasons["non_finite_aggregate"] == 2
    assert len(agg.window) == 0
    assert not server.receive(make_update(2, [6.0], [0.0])) and server.version == 0  # warm-up again
    assert server.receive(make_update(3, [10.0], [0.0])) and server.weights.item() == pytest.approx(8.0)


def test_a_federation_whose_full_cache_is_huge_is_warned_naming_the_figure():
    small = Server(torch.zeros(1000), CalibratedDeltaAverage(cache_dtype="float16"), [], num_clients=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        small.on_fit_start()  # 2 MB: silent
    # 3,000,000 clients x 1,000 parameters x 4 bytes = 11.2 GiB (nothing is allocated before clients upload)
    huge = Server(torch.zeros(1000), CalibratedDeltaAverage(), [], num_clients=3_000_000)
    with pytest.warns(UserWarning, match=r"num_clients=3000000 x 1000 parameters in float32 take up to 11.2 GiB"):
        huge.on_fit_start()


def test_a_new_fit_forgets_the_previous_runs_window_cache_and_moments():
    window, calibrated, opt = SlidingWindowAverage(window_size=1), CalibratedDeltaAverage(1), AdaptiveServerOptimizer()
    for agg, callbacks in ((window, []), (calibrated, []), (DeltaAverage(1), [opt])):
        server = Server(torch.zeros(1), agg, callbacks, num_clients=2)
        server.on_fit_start()
        assert server.receive(make_update(0, [1.0], [0.0]))
        server.on_fit_start()
    assert len(window.window) == 0 and len(calibrated.cache) == 0 and calibrated.cache_mean is None
    assert opt.steps == 0 and opt.first_moment is None


def test_calibration_and_window_use_the_callbacks_weights():
    agg = CalibratedDeltaAverage(buffer_size=2, server_lr=1.0)
    server = Server(torch.zeros(1), agg, [DoubleClientZero()], num_clients=2)
    server.on_fit_start()
    server.receive(make_update(0, [1.0], [0.0]))
    server.receive(make_update(1, [3.0], [0.0]))
    # p_0 Delta_0 = 2, p_1 Delta_1 = 3: v = 5 / 2; cached (2, 3), h = 5 / 2
    assert server.weights.item() == pytest.approx(2.5) and agg.cache_mean.item() == pytest.approx(2.5)
    window = SlidingWindowAverage(window_size=2)
    server = Server(torch.zeros(1), window, [DoubleClientZero()], num_clients=2)
    server.on_fit_start()
    server.receive(make_update(0, [1.0], [0.0]))
    server.receive(make_update(1, [4.0], [0.0]))
    assert server.weights.item() == pytest.approx((2 * 1.0 + 4.0) / 3)


# ------------------------------------------------------------------------------------------- runs replayed by hand


class Uploads(RecordsVersions):
    """Records every accepted upload (in aggregation order) and every new global version."""

    def __init__(self) -> None:
        super().__init__()
        self.uploads: list[dict] = []

    def weight_update(self, server, update, weight):
        self.uploads.append({"client": update.client, "staleness": update.staleness, "weights": update.weights,
                             "base": update.base_weights, "weight": weight})  # fmt: skip
        return weight


def recorded_run(tmp_path, algorithm, **kwargs) -> Uploads:
    record = Uploads()
    algorithm.server_callbacks.append(record)
    kwargs.setdefault("data_kwargs", {"partition": "dirichlet"})
    run(tmp_path, algorithm, num_clients=8, **kwargs)
    assert record.versions and all(u["weight"] == 1.0 for u in record.uploads)
    return record


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fedfa_run_replayed_from_the_recorded_uploads(tmp_path):
    k = 3
    record = recorded_run(tmp_path, FedFa(window_size=k, concurrency=4), max_versions=12)
    # warm-up: the first version is made by the K-th upload, then one version per upload
    assert [v["count"] for v in record.versions] == [k] + [1] * (len(record.versions) - 1)
    assert len(record.uploads) == k - 1 + len(record.versions)
    window: deque = deque(maxlen=k)
    expected = []
    for upload in record.uploads:
        window.append(upload["weights"])
        if len(window) == k:
            expected.append(sum(window) / k)
    assert all(close(v["after"], e) for v, e in zip(record.versions, expected, strict=True))
    stale = [u["staleness"] for u in record.uploads]
    assert max(stale) > 0  # stale models were averaged in


def test_ca2fl_run_replayed_from_the_recorded_uploads(tmp_path):
    m, n = 3, 8
    record = recorded_run(tmp_path, CA2FL(buffer_size=m, server_lr=0.8, concurrency=5), max_versions=10)
    assert [v["count"] for v in record.versions] == [m] * len(record.versions)
    clients = [u["client"] for u in record.uploads]
    assert len(set(clients)) < len(clients)  # some clients uploaded twice: their cached update calibrated them
    weights = record.versions[0]["before"].clone()
    cache: dict[int, torch.Tensor] = {}
    h = torch.zeros_like(weights)
    for r, version in enumerate(record.versions):
        buffered = record.uploads[r * m : (r + 1) * m]
        residuals = []
        for u in buffered:
            delta = u["weights"] - u["base"]
            residuals.append(delta - cache.get(u["client"], torch.zeros_like(delta)))
            cache[u["client"]] = delta
        weights = weights + 0.8 * (h + sum(residuals) / m)
        h = sum(cache.values()) / n
        assert close(version["after"], weights), r
    plain = weights - record.versions[0]["before"]
    assert plain.abs().sum() > 0


@pytest.mark.parametrize("bias_correction", [False, True], ids=["paper", "authors-code"])
def test_fadas_run_replayed_from_the_recorded_uploads(tmp_path, bias_correction):
    # eps = 1e-4: with 1e-8 a coordinate the clients barely move (|Delta| ~ 1e-9) gets a full-size step whose sign
    # is float32 rounding, and no replay could match it; the formula is the same
    m, lr, b1, b2, eps, tau_c = 2, 0.02, 0.9, 0.99, 1e-4, 1
    algo = FADAS(buffer_size=m, server_lr=lr, eps=eps, concurrency=5, bias_correction=bias_correction)
    record = recorded_run(tmp_path, algo, max_versions=10)
    assert [v["count"] for v in record.versions] == [m] * len(record.versions)
    weights = record.versions[0]["before"].clone()
    first = second = maximum = torch.zeros_like(weights)
    rates = []
    for t, version in enumerate(record.versions, start=1):
        buffered = record.uploads[(t - 1) * m : t * m]
        delta = sum(u["weights"] - u["base"] for u in buffered) / m  # Delta_t, from the uploads
        first = b1 * first + (1 - b1) * delta
        second = b2 * second + (1 - b2) * delta * delta
        maximum = torch.maximum(maximum, second)
        if bias_correction:
            direction = (first / (1 - b1**t)) / ((maximum / (1 - b2**t)).sqrt() + eps)
        else:
            direction = first / (maximum.sqrt() + eps)
        tau_max = max(u["staleness"] for u in buffered)
        rates.append(lr if tau_max <= tau_c else lr / tau_max)
        weights = weights + rates[-1] * direction
        # float32 rounding of the sum of deltas, amplified by 1/sqrt(v) on coordinates that barely move: 1e-3 of a step
        assert torch.allclose(version["after"], weights, rtol=0, atol=1e-3 * lr), t
    assert min(rates) < lr  # the delay adaptation was exercised


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "fedfa": (lambda: FedFa(window_size=3, concurrency=4), 14),
    "ca2fl": (lambda: CA2FL(buffer_size=3, concurrency=5), 10),
    "fadas": (lambda: FADAS(buffer_size=2, concurrency=5), 10),
}


def server_state_is_midway(name: str, algorithm) -> bool:
    aggregator = algorithm.aggregator
    if name == "fedfa":
        return len(aggregator.window) == aggregator.window_size
    if name == "ca2fl":
        return len(aggregator.cache) > 0 and len(aggregator.residuals) > 0
    return algorithm.server_callbacks[0].steps > 0 and len(aggregator.buffer) > 0


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: server_state_is_midway(name, algorithm)
    )
    a, b = resumed.simulator.server.state_dict(), full.simulator.server.state_dict()
    assert_same(a["aggregator"], b["aggregator"])
    assert_same(a["callbacks"], b["callbacks"])


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: FedFa(window_size=0), r"window_size must be >= 1, got 0"),
        (lambda: FedFa(window_size=2.5), r"window_size must be an integer >= 1, got 2.5"),
        (lambda: FedFa(concurrency=0), r"concurrency must be >= 1, got 0"),
        (lambda: CA2FL(buffer_size=0), r"buffer_size must be >= 1 or None, got 0"),
        (lambda: CA2FL(server_lr=-1.0), r"server_lr must be > 0, got -1.0"),
        (lambda: CA2FL(cache_dtype="int8"), r"unknown cache_dtype 'int8'; allowed: \['bfloat16', 'float16'"),
        (lambda: FADAS(beta1=1.0), r"beta1 must be in \[0, 1\), got 1.0"),
        (lambda: FADAS(beta2=0.0), r"beta2 must be in \(0, 1\), got 0.0"),
        (lambda: FADAS(eps=0.0), r"eps must be > 0, got 0.0"),
        (lambda: FADAS(server_lr=float("nan")), r"server_lr must be a finite number > 0, got nan"),
        (lambda: FADAS(delay_threshold=-1), r"delay_threshold must be >= 0, got -1"),
        (lambda: FADAS(bias_correction="yes"), r"bias_correction must be True or False, got 'yes'"),
        (lambda: FADAS(buffer_size=0), r"buffer_size must be >= 1 or None, got 0"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_presets_are_registered_and_are_the_papers_compositions():
    assert PRESETS["fedfa"] is FedFa and PRESETS["ca2fl"] is CA2FL and PRESETS["fadas"] is FADAS
    fedfa = FedFa()
    assert isinstance(fedfa.aggregator, SlidingWindowAverage) and fedfa.aggregator.window_size == 10
    assert fedfa.server_callbacks == [] and fedfa.scheduler.concurrency == 0.2
    ca2fl = CA2FL()
    assert isinstance(ca2fl.aggregator, CalibratedDeltaAverage) and ca2fl.server_callbacks == []
    assert (ca2fl.aggregator.buffer_size, ca2fl.aggregator.server_lr, ca2fl.scheduler.concurrency) == (10, 1.0, 0.2)
    fadas = FADAS()
    (opt,) = fadas.server_callbacks
    assert type(fadas.aggregator) is DeltaAverage and fadas.aggregator.server_lr == 1.0
    assert (fadas.aggregator.buffer_size, fadas.scheduler.concurrency) == (5, 0.5)
    assert (opt.beta1, opt.beta2, opt.eps, opt.delay_threshold, opt.amsgrad, opt.bias_correction) == (
        0.9, 0.99, 1e-8, 1, True, False)  # fmt: skip


def test_fedadt_comparison_spec_and_the_benchmark_list_include_the_presets():
    spec = yaml.safe_load((ROOT / "configs" / "compare" / "fedadt_table1.yaml").read_text())
    assert {"FedFa", "CA2FL"} <= set(spec["methods"])
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    assert all(f'"{name}"' in text for name in ("FedFa", "CA2FL", "FADAS"))


@pytest.mark.parametrize("name", ["fedfa", "ca2fl", "fadas"])
def test_config_parses_and_runs(tmp_path, name):
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", "--trainer.algorithm.init_args.concurrency=4",
              "--trainer.eval_every=3", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key != "concurrency":
            assert algorithm.hparams[key] == value, key
    summary = cli.trainer.summary
    assert summary["versions"] == 3 and summary["stop_reason"] == "max_versions"
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0
