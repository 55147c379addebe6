"""The availability view in which retired clients are offline for good (lit_asyncfl.core.retirement)."""

from __future__ import annotations

import copy
import pickle

import numpy as np

from lit_asyncfl.availability import AlwaysAvailable
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.retirement import RetiredOffline


def test_a_retired_offline_view_copies_and_pickles():
    """copy and pickle build the object without __init__: its attribute forwarding recursed forever on them."""
    gate = ClientCallback()
    gate.retired = np.array([False, True, False])
    inner = AlwaysAvailable()
    inner.setup(3, seed=0)
    view = RetiredOffline(inner, [gate])
    for twin in (copy.deepcopy(view), pickle.loads(pickle.dumps(view)), copy.copy(view)):
        assert twin.online(0.0).tolist() == [True, False, True]
        assert twin.is_online(0, 0.0) and not twin.is_online(1, 0.0)
        assert type(twin.inner) is AlwaysAvailable
    assert copy.copy(view).inner is inner
