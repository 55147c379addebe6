"""The client-update cache (lit_asyncfl.server.update_cache): mean, replacement, compact storage, state, refused
values."""

from __future__ import annotations

import pytest
import torch

from lit_asyncfl.server import (
    ClientUpdateCache,
)


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
