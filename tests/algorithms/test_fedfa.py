"""FedFa: a whole run replayed by hand from the recorded uploads."""

from __future__ import annotations

from collections import deque

from builders import close, recorded_run

from lit_asyncfl.algorithms import FedFa


def test_fedfa_run_replayed_from_the_recorded_uploads(tmp_path):
    k = 3
    record = recorded_run(tmp_path, FedFa(window_size=k, concurrency=4), max_versions=12)
    # warm-up: the first version is made by the K-th upload, then one version per upload
    assert [v["count"] for v in record.versions] == [k] + [1] * (len(record.versions) - 1)
    assert len(record.uploads) == k - 1 + len(record.versions)
    window: deque = deque(maxlen=k)
    expected = []
    for upload in record.uploads:
        window.append(upload["weights"])
        if len(window) == k:
            expected.append(sum(window) / k)
    assert all(close(v["after"], e) for v, e in zip(record.versions, expected, strict=True))
    stale = [u["staleness"] for u in record.uploads]
    assert max(stale) > 0  # stale models were averaged in
