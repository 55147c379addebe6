"""FlatParameters: the module's floating-point state as one vector."""

from __future__ import annotations

import torch
from torch import nn

from lit_asyncfl.core.flat import FlatParameters


def test_a_load_mid_job_keeps_the_buffers_outside_the_flat_weights():
    """``load(..., reset=False)`` (a merge computed elsewhere, put in place mid-job) sets the weights and the
    BatchNorm counts and leaves the other buffers as the job left them; a plain ``load`` resets them."""
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    net.register_buffer("steps", torch.tensor(0))
    flat = FlatParameters(net)
    net.steps += 5
    weights = torch.arange(flat.numel, dtype=torch.float32)
    flat.load(weights, torch.tensor([3]), reset=False)
    assert torch.equal(flat.flat, weights) and int(net[1].num_batches_tracked) == 3 and int(net.steps) == 5
    flat.load(weights)
    assert int(net.steps) == 0 and int(net[1].num_batches_tracked) == 0
