"""The server's update path: rejection, weighting, aggregation, counters."""

from __future__ import annotations

import builders
import pytest
import torch

from lit_asyncfl.core.server import Server, all_finite
from lit_asyncfl.server import DataSizeWeight, DeltaAverage, Mixing, ModelAverage, StalenessBound, StalenessWeight
from lit_asyncfl.server.base import ServerCallback


def make_update(weights, base, base_version=0, client=0, num_samples=10):
    weights, base = torch.as_tensor(weights, dtype=torch.float32), torch.as_tensor(base, dtype=torch.float32)
    return builders.make_update(client, weights, base, base_version, num_samples)


def test_fedasync_mixing_with_polynomial_staleness_matches_hand_computation():
    server = Server(torch.tensor([0.0, 4.0]), Mixing(alpha=0.5), [StalenessWeight("polynomial", a=0.5)], 2)
    server.on_fit_start()
    server.version = 3  # the update started from version 0: staleness 3, s = 4^-0.5 = 0.5, alpha_t = 0.25
    assert server.receive(make_update([8.0, 0.0], [0.0, 4.0], base_version=0))
    assert torch.allclose(server.weights, torch.tensor([2.0, 3.0]))  # 0.75*w + 0.25*w_i
    assert server.version == 4 and server.stats.staleness_max == 3


def test_fedbuff_update_matches_hand_computation():
    # K = 2, eta_g = 0.5, weights 1/sqrt(1+s). Client A: delta [2, 0], staleness 0 (weight 1).
    # Client B: delta [0, 6], staleness 3 (weight 1/2). Update = 0.5 * ([2, 0]*1 + [0, 6]*0.5) / 2 = [0.5, 0.75].
    server = Server(
        torch.tensor([1.0, 1.0]), DeltaAverage(buffer_size=2, server_lr=0.5), [StalenessWeight("polynomial", a=0.5)], 2
    )
    server.on_fit_start()
    server.version = 3
    assert not server.receive(make_update([3.0, 1.0], [1.0, 1.0], base_version=3))  # buffered, no new version
    assert server.version == 3
    assert server.receive(make_update([-1.0, 7.0], [-1.0, 1.0], base_version=0))
    assert torch.allclose(server.weights, torch.tensor([1.5, 1.75]))
    assert server.stats.aggregated == 2 and server.stats.received == 2


def test_fedavg_average_is_sample_weighted():
    server = Server(torch.zeros(2), ModelAverage(buffer_size=None), [DataSizeWeight()], 2)
    server.on_fit_start()
    server.receive(make_update([1.0, 0.0], [0.0, 0.0], num_samples=30))
    server.receive(make_update([5.0, 4.0], [0.0, 0.0], num_samples=10))
    assert server.version == 0  # waits for a flush (end of round)
    assert server.flush()
    assert torch.allclose(server.weights, torch.tensor([2.0, 1.0]))  # (30*[1,0] + 10*[5,4]) / 40


@pytest.mark.parametrize(
    ("weights", "reason"),
    [
        pytest.param([float("nan"), 1.0], "non_finite", id="nan"),
        pytest.param([float("inf"), 1.0], "non_finite", id="inf"),
        pytest.param([1.0, 2.0, 3.0], "shape", id="mis-shaped"),
    ],
)
def test_invalid_updates_are_rejected_counted_and_never_aggregated(weights, reason):
    start = torch.tensor([1.0, 2.0])
    server = Server(start, Mixing(alpha=1.0), [], 2)
    server.on_fit_start()
    assert not server.receive(make_update(weights, [0.0] * len(weights)))
    assert torch.equal(server.weights, start) and server.version == 0
    assert server.stats.rejected == 1 and server.stats.reasons == {reason: 1} and server.stats.aggregated == 0


def test_staleness_bound_discards_and_counts_separately():
    server = Server(torch.zeros(1), Mixing(alpha=1.0), [StalenessBound(max_staleness=2)], 2)
    server.on_fit_start()
    server.version = 5
    assert not server.receive(make_update([1.0], [0.0], base_version=2))  # staleness 3 > 2
    assert server.receive(make_update([1.0], [0.0], base_version=3))  # staleness 2: accepted
    assert (server.stats.discarded, server.stats.rejected, server.stats.reasons) == (1, 0, {"stale": 1})


def test_a_non_finite_aggregate_is_refused():
    class Explode(ServerCallback):
        def weight_update(self, server, update, weight):
            return 10.0  # 10 * 3e38 overflows float32

    server = Server(torch.ones(2), DeltaAverage(buffer_size=1, server_lr=1.0), [Explode()], 1)
    server.on_fit_start()
    assert not server.receive(make_update([3e38, 3e38], [0.0, 0.0]))
    assert torch.equal(server.weights, torch.ones(2))
    assert server.stats.reasons == {"non_finite_aggregate": 1}


def test_duplicate_callback_state_keys_are_refused():
    with pytest.raises(ValueError, match=r"distinct state_key.*StalenessWeight"):
        Server(torch.zeros(1), Mixing(), [StalenessWeight(), StalenessWeight()], 1)


def test_aggregator_state_round_trips_through_state_dict():
    agg = DeltaAverage(buffer_size=3)
    server = Server(torch.zeros(2), agg, [], 1)
    server.on_fit_start()
    server.receive(make_update([1.0, 2.0], [0.0, 0.0]))
    state = server.state_dict()
    other = Server(torch.zeros(2), DeltaAverage(buffer_size=3), [], 1)
    other.load_state_dict(state)
    assert len(other.aggregator.buffer) == 1
    assert torch.equal(other.aggregator.buffer[0][0].delta, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_is_the_element_wise_check(dtype):
    """``all_finite`` answers as ``torch.isfinite(t).all()``: sums that overflow, infinities of both signs (whose
    sum is NaN), NaNs, empty tensors."""
    big = torch.finfo(dtype).max
    cases = [
        torch.tensor([1.0, 2.0]),
        torch.tensor([big, big, big]),  # sum overflows; all finite
        torch.tensor([-big, -big]),
        torch.tensor([1.0, float("inf")]),
        torch.tensor([float("inf"), float("-inf")]),
        torch.tensor([float("nan"), 0.0]),
        torch.tensor([big, float("nan")]),
        torch.zeros(0),
        torch.randn(10_000),
    ]
    for t in cases:
        t = t.to(dtype)
        assert all_finite(t) == bool(torch.isfinite(t).all()), t
