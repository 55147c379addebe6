"""Device models: durations in virtual seconds from the documented formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lit_asyncfl.devices import DeviceModel, ExponentialCapability, Stragglers, UniformRatio, UniformResponse


def test_job_timing_is_compute_plus_transfers():
    model = DeviceModel(time_per_sample=0.2, bandwidth=2000.0)
    profiles = model.sample_profiles(3, np.random.default_rng(0))
    t = model.job_timing(profiles, 1, num_samples=50, model_bytes=1000, rng=None)
    assert (t.download, t.compute, t.upload, t.total) == (0.5, 10.0, 0.5, 11.0)


def test_uniform_ratio_spans_the_ratio_and_slows_both_compute_and_network():
    model = UniformRatio(ratio=5.0, time_per_sample=1.0, bandwidth=100.0)
    p = model.sample_profiles(20_000, np.random.default_rng(0))
    assert 1.0 <= p.time_per_sample.min() < 1.01 and 4.99 < p.time_per_sample.max() <= 5.0
    assert np.allclose(p.time_per_sample * p.bandwidth, 100.0)  # slowness multiplies time, divides bandwidth
    assert p.time_per_sample.mean() == pytest.approx(3.0, abs=0.05)  # mean of U(1, 5)


def test_exponential_capability_has_the_requested_mean_and_clip():
    model = ExponentialCapability(mean=1.0, min_capability=0.05, time_per_sample=2.0)
    p = model.sample_profiles(50_000, np.random.default_rng(0))
    capability = 2.0 / p.time_per_sample
    assert capability.min() >= 0.05
    assert capability.mean() == pytest.approx(1.0, abs=0.03)


def test_stragglers_slow_exactly_the_fraction_by_the_factor_around_a_log_normal_median():
    # sigma = 0: every ordinary device is the median device, every straggler exactly `factor` slower
    p = Stragglers(fraction=0.1, factor=10.0, sigma=0.0, time_per_sample=2.0, bandwidth=50.0).sample_profiles(
        200, np.random.default_rng(0)
    )
    assert sorted(set(p.time_per_sample.tolist())) == [2.0, 20.0]
    assert int((p.time_per_sample == 20.0).sum()) == 20
    assert np.allclose(p.time_per_sample * p.bandwidth, 100.0)  # slowness multiplies time, divides bandwidth
    # sigma = 0.5: log(slowness) = 0.5 z + log(10) B with B ~ Bernoulli(0.1): mean 0.1 log 10, variance
    # 0.25 + 0.1 * 0.9 * log(10)^2 (the mixture's moments)
    logs = np.log(Stragglers(fraction=0.1, factor=10.0, sigma=0.5).slowness(100_000, np.random.default_rng(1)))
    assert logs.mean() == pytest.approx(0.1 * math.log(10), abs=0.01)
    assert logs.var() == pytest.approx(0.25 + 0.09 * math.log(10) ** 2, rel=0.02)


def test_uniform_response_draws_per_job_within_bounds():
    model = UniformResponse(low=100.0, high=5000.0)
    p = model.sample_profiles(2, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    draws = [model.job_timing(p, 0, 10, 10**6, rng).compute for _ in range(2000)]
    assert 100.0 <= min(draws) and max(draws) <= 5000.0
    assert np.mean(draws) == pytest.approx(2550.0, rel=0.05)
    assert model.job_timing(p, 0, 10, 10**6, rng).download == 0.0  # bandwidth inf by default


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: UniformRatio(ratio=0.5), r"ratio must be >= 1 \(slowest / fastest\), got 0.5"),
        (lambda: DeviceModel(time_per_sample=-1.0), r"time_per_sample must be > 0, got -1.0"),
        (lambda: DeviceModel(bandwidth=0.0), r"bandwidth must be > 0, got 0.0"),
        (lambda: UniformResponse(low=-5.0, high=10.0), r"need 0 <= low <= high, 0 < high < inf, got low=-5.0"),
        (lambda: UniformResponse(low=10.0, high=5.0), r"got low=10.0, high=5.0"),
        (lambda: UniformResponse(low=0.0, high=0.0), r"got low=0.0, high=0.0"),  # every job instantaneous
        (lambda: ExponentialCapability(mean=0.0), r"mean must be > 0, got 0.0"),
        (lambda: Stragglers(fraction=1.0), r"fraction must be"),
        (lambda: Stragglers(factor=0.5), r"factor must be >= 1 \(straggler / ordinary device\), got 0.5"),
    ],
)
def test_bad_device_settings_fail_at_construction(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_infinite_bandwidth_means_free_communication():
    model = DeviceModel(bandwidth=math.inf)
    p = model.sample_profiles(1, np.random.default_rng(0))
    assert model.job_timing(p, 0, 4, 10**9, None).download == 0.0
