"""The learning-rate decay client callback (lit_asyncfl.client_callbacks.base.LearningRateDecay): the rate decays
with the global version."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_asyncfl.client.callbacks import LearningRateDecay
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.models import LogisticRegression


def test_learning_rate_decays_with_the_global_version():
    from lit_asyncfl.client.fast_engine import LocalTrainer
    from lit_asyncfl.data import ClientShards

    shards = ClientShards(torch.randn(8, 64), torch.randint(0, 10, (8,)), [np.arange(8)])
    local = LocalTrainer(LogisticRegression(input_dim=64, lr=0.01), shards, 4, callbacks=[LearningRateDecay(0.9999)])
    job = ClientJob(0, 0, 5000, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    update = local.train(job, local.flat.read())
    assert update.info["lr"] == pytest.approx(0.01 * 0.9999**5000)
    assert local.optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * 0.9999**5000)
