"""Partitioners assign every sample exactly once, and skew behaves as promised."""

from __future__ import annotations

import numpy as np
import pytest

from lit_asyncfl.data import IID, Dirichlet, QuantitySkew, Shards
from lit_asyncfl.data.partition import resolve_partitioner

TARGETS = np.repeat(np.arange(10), 60)  # 600 samples, 10 balanced classes


@pytest.mark.parametrize(
    "partitioner",
    [
        pytest.param(IID(), id="iid"),
        pytest.param(Dirichlet(0.05), id="dirichlet-0.05"),
        pytest.param(Dirichlet(1.0), id="dirichlet-1"),
        pytest.param(Shards(2), id="shards-2"),
        pytest.param(QuantitySkew(0.4), id="quantity-0.4"),
    ],
)
@pytest.mark.parametrize("num_clients", [1, 7, 100])
def test_every_sample_assigned_exactly_once_and_no_client_empty(partitioner, num_clients):
    parts = partitioner(TARGETS, num_clients, np.random.default_rng(3))
    assert len(parts) == num_clients
    everything = np.concatenate(parts)
    assert np.array_equal(np.sort(everything), np.arange(len(TARGETS)))
    assert min(len(p) for p in parts) >= 1


def _label_skew(parts, targets) -> float:
    """Mean total-variation distance between each client's label distribution and the global one."""
    global_dist = np.bincount(targets, minlength=10) / len(targets)
    tv = [0.5 * np.abs(np.bincount(targets[p], minlength=10) / len(p) - global_dist).sum() for p in parts]
    return float(np.mean(tv))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    skews = []
    for alpha in [100.0, 1.0, 0.1, 0.01]:
        per_seed = [_label_skew(Dirichlet(alpha)(TARGETS, 20, np.random.default_rng(s)), TARGETS) for s in range(5)]
        skews.append(np.mean(per_seed))
    assert skews == sorted(skews), skews
    assert skews[0] < 0.2 and skews[-1] > 0.7, skews  # near-IID vs nearly one class per client


def test_shards_give_each_client_at_most_shards_per_client_labels():
    parts = Shards(2)(TARGETS, 30, np.random.default_rng(0))  # 60 shards of 10: each shard holds one label
    assert max(len(np.unique(TARGETS[p])) for p in parts) <= 2


def test_quantity_skew_spread_follows_a():
    def spread(a):
        sizes = [len(p) for p in QuantitySkew(a)(np.zeros(10_000), 50, np.random.default_rng(1))]
        return np.std(sizes) / np.mean(sizes)

    assert spread(0.0) == 0.0
    assert spread(0.1) == pytest.approx(0.1, abs=0.04)
    assert spread(0.4) == pytest.approx(0.4, abs=0.1)


def test_partition_is_deterministic_given_the_rng_seed():
    a = Dirichlet(0.3)(TARGETS, 15, np.random.default_rng(42))
    b = Dirichlet(0.3)(TARGETS, 15, np.random.default_rng(42))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_more_clients_than_samples_is_an_error():
    with pytest.raises(ValueError, match=r"cannot split 600 training samples among 601 clients"):
        IID()(TARGETS, 601, np.random.default_rng(0))


@pytest.mark.parametrize("alpha", [0.0, -0.5])
def test_non_positive_dirichlet_alpha_is_an_error(alpha):
    with pytest.raises(ValueError, match=f"Dirichlet alpha must be > 0, got {alpha}"):
        Dirichlet(alpha)


def test_unknown_partition_name_lists_the_allowed_ones():
    with pytest.raises(ValueError, match=r"unknown partition 'skewed'; allowed: \['dirichlet', 'iid'"):
        resolve_partitioner("skewed")
