"""The update norm bound (lit_asyncfl.server.norm_bound): outliers rejected against the median of aggregated norms;
absurd updates aggregated by default."""

from __future__ import annotations

import pytest
import torch
from conftest import make_trainer

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.models import LogisticRegression


def test_the_update_norm_bound_rejects_outliers_against_the_median_of_aggregated_norms():
    from types import SimpleNamespace

    from lit_asyncfl.server import UpdateNormBound

    bound = UpdateNormBound(k=3.0, window=4, min_history=3)

    def update(norm):  # a delta of the given L2 norm: (norm * 0.6, norm * 0.8)
        return SimpleNamespace(weights=torch.tensor([norm * 0.6, norm * 0.8]), base_weights=torch.zeros(2), info={})

    first = [update(n) for n in (1.0, 5.0, 2.0)]
    assert [bound.reject_update(None, u) for u in first] == [None, None, None]  # no history yet: inf
    bound.on_aggregated(None, first)
    assert bound.threshold() == pytest.approx(3.0 * 2.0)  # median(1, 5, 2) = 2
    assert bound.reject_update(None, update(5.9)) is None
    assert bound.reject_update(None, update(6.1)) == "norm_outlier"
    assert bound.reject_update(None, update(float("inf"))) == "norm_outlier"
    bound.on_aggregated(None, [update(7.0), update(8.0)])  # not checked: nothing recorded without a norm
    assert list(bound.norms) == pytest.approx([1.0, 5.0, 2.0])
    checked = [update(4.0), update(4.0)]
    for u in checked:
        bound.reject_update(None, u)
    bound.on_aggregated(None, checked)  # window 4: [5, 2, 4, 4] -> median 4
    assert list(bound.norms) == pytest.approx([5.0, 2.0, 4.0, 4.0]) and bound.threshold() == pytest.approx(12.0)
    with pytest.raises(ValueError, match=r"k must be > 1, got 1"):
        UpdateNormBound(k=1)


def test_absurd_updates_are_aggregated_by_default_and_rejected_by_the_norm_bound(tmp_path):
    from lit_asyncfl.client import ClientCallback
    from lit_asyncfl.server import UpdateNormBound

    class Blowup(ClientCallback):
        """Client 0 uploads its delta times 1e30 (finite in float32: 1e30 x ~0.1), once the bound has seen enough
        aggregated norms (before ``min_history`` it lets everything through, as documented)."""

        def on_train_end(self, trainer, job, update):
            if job.client == 0 and job.base_version >= 15:
                update.weights = update.base_weights + (update.weights - update.base_weights) * 1e30

    accuracy = {}
    for bounded in (False, True):
        algo = FedAsync(concurrency=3)
        algo.client_callbacks.append(Blowup())
        if bounded:
            algo.server_callbacks.insert(0, UpdateNormBound())
        trainer = make_trainer(tmp_path / str(bounded), algo, num_clients=5, max_versions=60)
        torch.manual_seed(0)
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        accuracy[bounded] = trainer.summary["final_accuracy"]
        if bounded:
            assert trainer.summary["reject_reasons"]["norm_outlier"] >= 3
    assert accuracy[True] > 0.8 > accuracy[False]
