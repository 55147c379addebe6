"""CA2FL: a whole run replayed by hand from the recorded uploads."""

from __future__ import annotations

import torch
from builders import close, recorded_run

from lit_asyncfl.algorithms import CA2FL


def test_ca2fl_run_replayed_from_the_recorded_uploads(tmp_path):
    m, n = 3, 8
    record = recorded_run(tmp_path, CA2FL(buffer_size=m, server_lr=0.8, concurrency=5), max_versions=10)
    assert [v["count"] for v in record.versions] == [m] * len(record.versions)
    clients = [u["client"] for u in record.uploads]
    assert len(set(clients)) < len(clients)  # some clients uploaded twice: their cached update calibrated them
    weights = record.versions[0]["before"].clone()
    cache: dict[int, torch.Tensor] = {}
    h = torch.zeros_like(weights)
    for r, version in enumerate(record.versions):
        buffered = record.uploads[r * m : (r + 1) * m]
        residuals = []
        for u in buffered:
            delta = u["weights"] - u["base"]
            residuals.append(delta - cache.get(u["client"], torch.zeros_like(delta)))
            cache[u["client"]] = delta
        weights = weights + 0.8 * (h + sum(residuals) / m)
        h = sum(cache.values()) / n
        assert close(version["after"], weights), r
    plain = weights - record.versions[0]["before"]
    assert plain.abs().sum() > 0
