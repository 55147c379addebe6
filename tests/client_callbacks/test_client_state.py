"""Client callbacks that keep per-client state (lit_asyncfl.client_callbacks.client_state): a diverged job teaches
the client's state nothing."""

from __future__ import annotations

import pytest
import torch
from builders import Diverging, make_job

from lit_asyncfl.client import DynamicRegularizer, LocalTrainer, ModelContrastive
from lit_asyncfl.data.shards import ClientShards


def _trainer(module, callbacks, batch_size=5):
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    return LocalTrainer(module, ClientShards(x, y, [torch.arange(5)]), batch_size=batch_size, callbacks=callbacks)


@pytest.mark.parametrize("make", [lambda: ModelContrastive(mu=1.0), lambda: DynamicRegularizer(alpha=0.1)])
def test_a_diverged_job_teaches_the_clients_state_nothing(make, monkeypatch):
    """The server rejects a non-finite upload (and FedDyn's h stays): the client's state must stay too, or every
    later job of that client is NaN (z_prev / -g_k) and one divergence excludes it for the rest of the run."""
    torch.manual_seed(1)
    module = Diverging()
    w0 = torch.nn.utils.parameters_to_vector(module.parameters()).detach().clone()
    cb = make()
    trainer = _trainer(module, [cb])
    first = trainer.train(make_job(0), w0)  # a finite job: the client has state
    state = cb.store.get(0, cb.STATE_NAME).clone()
    monkeypatch.setattr(Diverging, "scale", float("inf"))
    diverged = trainer.train(make_job(1), first.weights)
    assert not torch.isfinite(diverged.weights).all()
    assert torch.equal(cb.store.get(0, cb.STATE_NAME), state)  # kept as it was
    assert diverged.info["client_state"] == "not learned: non-finite weights"
    monkeypatch.setattr(Diverging, "scale", 1.0)
    after = trainer.train(make_job(2), first.weights)
    assert torch.isfinite(after.weights).all()
    # the same as if the diverged job had never happened
    twin_cb = make()
    twin = _trainer(Diverging(), [twin_cb])
    twin.train(make_job(0), w0)
    assert torch.equal(after.weights, twin.train(make_job(2), first.weights).weights)
