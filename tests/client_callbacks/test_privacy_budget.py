"""A budget for local DP (docs/privacy.md): each client uploads at most as often as max_epsilon allows, a client out
of budget is no longer dispatched, and the run ends with stop_reason "privacy_budget"."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import FedAsync, FedAvg, FedBuff
from lit_asyncfl.client_callbacks.privacy import LocalGaussianNoise
from lit_asyncfl.privacy import DifferentiallyPrivate

pytest.importorskip("opacus")
from opacus.accountants import PRVAccountant, RDPAccountant


def _uploads_by_hand(kind, z: float, delta: float, max_epsilon: float) -> int:
    """The largest n whose epsilon, from Opacus's accountant stepped n times with (z / 2, q = 1), is <= max_epsilon."""
    accountant, n = kind(), 0
    while True:
        accountant.step(noise_multiplier=z / 2, sample_rate=1.0)
        if accountant.get_epsilon(delta=delta) > max_epsilon:
            return n
        n += 1


@pytest.mark.parametrize(("accountant", "kind"), [("rdp", RDPAccountant), ("prv", PRVAccountant)])
@pytest.mark.parametrize(("z", "max_epsilon"), [(3.0, 8.0), (4.0, 10.0)])
def test_uploads_allowed_match_the_accountant_called_directly(accountant, kind, z, max_epsilon):
    noise = LocalGaussianNoise(clip_norm=1.0, noise_multiplier=z, max_epsilon=max_epsilon, accountant=accountant)
    assert noise.max_uploads == _uploads_by_hand(kind, z, 1e-5, max_epsilon)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize(("z", "max_epsilon"), [(3.0, 8.0), (4.0, 10.0)])
def test_the_budget_is_the_last_upload_count_within_max_epsilon(accountant, z, max_epsilon):
    """uploads_within bisects on epsilon(n) growing with n: the count it finds is the boundary."""
    noise = LocalGaussianNoise(clip_norm=1.0, noise_multiplier=z, max_epsilon=max_epsilon, accountant=accountant)
    n = noise.max_uploads
    assert noise.epsilon_after(n) <= max_epsilon < noise.epsilon_after(n + 1)


def test_epsilon_is_computed_once_per_upload_count_and_the_rdp_fallback_said_once(monkeypatch):
    """Every evaluation row reads epsilon: it used to run the accountant (and repeat PRV's fallback warning) each
    time."""
    import warnings

    import lit_asyncfl.client_callbacks.privacy as local
    import lit_asyncfl.functional.privacy as functional

    calls = []

    def counted(steps, delta, accountant="rdp"):
        calls.append(steps[0][2])
        return functional.epsilon_spent(steps, delta, accountant)

    monkeypatch.setattr(local, "epsilon_spent", counted)
    monkeypatch.setattr(functional, "PRV_MAX_DOMAIN", 0)  # every PRV epsilon falls back to the RDP bound
    noise = LocalGaussianNoise(clip_norm=1.0, noise_multiplier=3.0, accountant="prv")
    values = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for most in (1, 1, 2, 2, 2):
            noise.uploads = {0: most, 1: 1}
            values.append(noise.epsilon)
    assert calls == [1, 2]
    assert sum(functional.RDP_FALLBACK in str(w.message) for w in caught) == 1
    rdp = [functional.rdp_epsilon([(1.5, 1.0, k)], 1e-5) for k in (1, 2)]
    assert values == [rdp[0], rdp[0], rdp[1], rdp[1], rdp[1]]


@pytest.mark.parametrize(
    "make",
    [
        lambda: FedAsync(concurrency=4),
        lambda: FedBuff(buffer_size=2, concurrency=4),
        lambda: FedAvg(clients_per_round=4),
    ],
)
def test_clients_stop_at_their_budget_and_the_run_ends_when_none_can_upload(tmp_path, make):
    """z = 3, max_epsilon = 8: 5 uploads each (RDP); every client uses exactly its 5, never a 6th, and the run stops
    with stop_reason "privacy_budget" long before its version limit; the epsilon reported is within the budget and
    equals the accountant's after 5 uploads, while a 6th would exceed it."""
    algo = DifferentiallyPrivate(make(), clip_norm=0.5, noise_multiplier=3.0, max_epsilon=8.0, mode="local")
    local = algo.client_callbacks[-1]
    assert local.max_uploads == 5
    trainer = run(tmp_path, algo, max_versions=10_000)
    assert trainer.summary["stop_reason"] == "privacy_budget"
    assert local.uploads == {c: 5 for c in range(10)}
    assert (
        local.retired.all() and trainer.history[-1]["dp_retired_clients"] == 10 == trainer.summary["dp_retired_clients"]
    )
    assert trainer.simulator.next_job_id == 50  # no job dispatched to a retired client (none dropped here)
    accountant = RDPAccountant()
    for _ in range(5):
        accountant.step(noise_multiplier=1.5, sample_rate=1.0)
    assert trainer.summary["dp_local_epsilon"] == pytest.approx(accountant.get_epsilon(delta=1e-5), rel=1e-12)
    assert trainer.summary["dp_local_epsilon"] <= 8.0
    accountant.step(noise_multiplier=1.5, sample_rate=1.0)
    assert accountant.get_epsilon(delta=1e-5) > 8.0
    retired = [r["dp_retired_clients"] for r in trainer.history]
    assert retired == sorted(retired) and retired[0] == 0


def test_budget_determinism_and_exact_resume(tmp_path):
    """Full weights identical across runs and after a resume midway, with clients retiring on both sides of it."""

    def make():
        return DifferentiallyPrivate(FedAsync(concurrency=4), clip_norm=0.5, noise_multiplier=3.0, max_epsilon=8.0,
                                     mode="local")  # fmt: skip

    full, resumed = check_determinism_and_exact_resume(
        tmp_path,
        make,
        versions=45,
        midway=lambda algo: 0 < int(algo.client_callbacks[-1].retired.sum()) < 10,
        fractions=(0.8, 0.85, 0.9, 0.75, 0.7),
    )
    local_full, local_resumed = full.algorithm.client_callbacks[-1], resumed.algorithm.client_callbacks[-1]
    assert local_resumed.uploads == local_full.uploads
    assert np.array_equal(local_resumed.retired, local_full.retired)
    assert resumed.summary["dp_local_epsilon"] == full.summary["dp_local_epsilon"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_epsilon": 2.0}, r"max_epsilon=2\.0 allows no upload: one upload already spends epsilon = 4\.729"),
        ({"max_epsilon": -1.0}, "max_epsilon"),
        ({"max_epsilon": 5.0, "noise_multiplier": 0.0}, r"needs noise_multiplier > 0"),
    ],
)
def test_local_budget_refusals(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LocalGaussianNoise(**{"clip_norm": 1.0, "noise_multiplier": 2.0, **kwargs})


def test_budget_with_devices_going_offline(tmp_path):
    """Under Bernoulli availability (devices offline half the time; 20% of jobs crash, uploading nothing), a retired
    client is never woken for: the run still ends with "privacy_budget", every client at exactly its 5 uploads."""
    from lit_asyncfl.availability import Bernoulli

    algo = DifferentiallyPrivate(FedAsync(concurrency=4), clip_norm=0.5, noise_multiplier=3.0, max_epsilon=8.0,
                                 mode="local")  # fmt: skip
    trainer = run(tmp_path, algo, max_versions=10_000, availability=Bernoulli(p=0.5, slot=30.0, crash_probability=0.2))
    local = algo.client_callbacks[-1]
    assert trainer.summary["stop_reason"] == "privacy_budget"
    assert local.uploads == {c: 5 for c in range(10)} and local.retired.all()
    assert trainer.simulator.dropped["crash"] > 0  # jobs were lost (and not counted: they released nothing)
