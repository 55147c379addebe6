"""MOON: the contrastive term's representations as in the authors' code, a client's first job."""

from __future__ import annotations

import torch
from builders import Diverging, make_job
from torch import nn
from torch.nn import functional as F

from lit_asyncfl.client import LocalTrainer, ModelContrastive
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.data.shards import ClientShards
from lit_asyncfl.models.base import ClassificationModule


class _RepBN(ClassificationModule):
    """A classifier whose representation has BatchNorm: train mode (batch statistics) and eval mode (running
    statistics) give different z."""

    def __init__(self) -> None:
        super().__init__(num_classes=2, lr=0.1)
        self.net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh(), nn.Linear(4, 2))


def test_moon_z_glob_and_z_prev_come_from_eval_mode_copies_as_in_the_authors_code():
    """The authors call global_model.eval() and old_net.eval() before training; the local model trains in train
    mode. With BatchNorm in the representation the step differs if either copy were in train mode."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    mu, tau, lr = 2.0, 0.3, 0.1  # not the default temperature
    module = _RepBN()
    cb = ModelContrastive(mu=mu, tau=tau)
    trainer = LocalTrainer(module, ClientShards(x, y, [torch.arange(5)]), batch_size=5, callbacks=[cb])
    theta0 = trainer.flat.read()
    first = trainer.train(make_job(0), theta0)
    start = first.weights.clone()
    n = trainer.flat.param_numel
    start[:n] += 0.01  # the next global model (running statistics as the first job left them)
    second = trainer.train(make_job(1), start)

    def loaded(theta, train):
        net = _RepBN()
        FlatParameters(net).load(theta.clone())
        return net.train(train)

    local, glob, prev = loaded(start, True), loaded(start, False), loaded(first.weights, False)
    with torch.no_grad():
        zg, zp = glob.net[:-1](x), prev.net[:-1](x)
    z = local.net[:-1](x)
    cos = F.cosine_similarity
    logits = torch.stack([cos(z, zg, dim=-1), cos(z, zp, dim=-1)], dim=1) / tau
    loss = F.cross_entropy(local.net[-1](z), y) + mu * F.cross_entropy(logits, torch.zeros(5, dtype=torch.long))
    loss.backward()
    grads = torch.cat([p.grad.reshape(-1) for p in local.parameters()])
    assert torch.allclose(second.weights[:n], start[:n] - lr * grads, atol=1e-7)


def test_moon_first_job_of_a_client_is_the_plain_task_step_even_after_other_clients_trained():
    """No previous model of this client: no term (the authors' empty pool), never another client's previous model
    left in the callback's copy."""
    torch.manual_seed(0)
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 1, 0, 1, 0])
    shards = ClientShards(x, y, [torch.arange(3), torch.arange(3, 6)])
    cb = ModelContrastive(mu=3.0, tau=0.5)
    plain_module = Diverging()
    module = Diverging()
    FlatParameters(module).load(FlatParameters(plain_module).read())
    trainer = LocalTrainer(module, shards, batch_size=3, callbacks=[cb])
    plain = LocalTrainer(plain_module, shards, batch_size=3, callbacks=[])
    w0 = trainer.flat.read()
    trainer.train(make_job(0, client=0), w0)
    trainer.train(make_job(1, client=0), w0 + 0.05)  # client 0 now has a previous model in the callback's copy
    first = trainer.train(make_job(2, client=1), w0 + 0.1)
    assert torch.equal(first.weights, plain.train(make_job(2, client=1), w0 + 0.1).weights)
    assert cb.store.get(1, cb.STATE_NAME) is not None
