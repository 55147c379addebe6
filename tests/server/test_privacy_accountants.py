"""The PRV accountant (Gopi, Lee and Wutschitz, 2021) as the alternative to RDP (docs/privacy.md): the epsilon a run
reports against Opacus's PRVAccountant stepped by hand, its refusals and its limits."""

from __future__ import annotations

import csv
import warnings

import pytest
from conftest import run

from lit_asyncfl.algorithms import FedAsync, FedBuff
from lit_asyncfl.client_callbacks.privacy import LocalGaussianNoise
from lit_asyncfl.functional import privacy as fp
from lit_asyncfl.privacy import DifferentiallyPrivate, GaussianAggregateNoise

opacus = pytest.importorskip("opacus")
from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402


def _by_hand(kind, steps, delta):
    """Opacus's accountant stepped once per (noise multiplier, sample rate) step, in order."""
    accountant = kind()
    for z, q in steps:
        accountant.step(noise_multiplier=z, sample_rate=q)
    return accountant.get_epsilon(delta=delta)


def test_central_prv_epsilon_equals_opacus_prv_stepped_by_hand(tmp_path):
    """FedBuff, K = 4 of N = 10: 12 aggregations of q = 0.4; epsilon in rows, summary and logger from PRV."""
    from lightning.pytorch.loggers import CSVLogger

    algo = DifferentiallyPrivate(FedBuff(buffer_size=4, concurrency=6), clip_norm=1.0, noise_multiplier=0.8,
                                 delta=1e-4, accountant="prv")  # fmt: skip
    trainer = run(tmp_path, algo, max_versions=12, eval_every=4, logger=CSVLogger(str(tmp_path), name="csv"))
    assert algo.server_callbacks[0].steps == {0.4: 12}
    expected = _by_hand(PRVAccountant, [(0.8, 0.4)] * 12, 1e-4)
    rdp = _by_hand(RDPAccountant, [(0.8, 0.4)] * 12, 1e-4)
    assert trainer.summary["dp_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert expected < rdp  # PRV is tighter: a different accountant indeed
    assert trainer.history[-1]["dp_epsilon"] == pytest.approx(expected, rel=1e-12)
    middle = _by_hand(PRVAccountant, [(0.8, 0.4)] * trainer.history[1]["dp_steps"], 1e-4)
    assert trainer.history[1]["dp_epsilon"] == pytest.approx(middle, rel=1e-12)
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        logged = [float(r["dp_epsilon"]) for r in csv.DictReader(f) if r.get("dp_epsilon")]
    assert logged[-1] == pytest.approx(expected, rel=1e-6)
    assert algo.hparams["accountant"] == "prv"


def test_local_prv_epsilon_equals_opacus_prv_stepped_by_hand(tmp_path):
    """Local mode: the busiest client's uploads, each a Gaussian mechanism of multiplier z / 2 with q = 1."""
    algo = DifferentiallyPrivate(FedAsync(concurrency=4), clip_norm=0.5, noise_multiplier=1.2, mode="local",
                                 accountant="prv")  # fmt: skip
    trainer = run(tmp_path, algo, max_versions=12)
    most = max(algo.client_callbacks[-1].uploads.values())
    assert trainer.summary["dp_max_uploads"] == most > 1
    expected = _by_hand(PRVAccountant, [(0.6, 1.0)] * most, 1e-5)
    assert trainer.summary["dp_local_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert trainer.history[-1]["dp_local_epsilon"] == trainer.summary["dp_local_epsilon"]


def test_default_accountant_is_rdp():
    """Unchanged default: the RDP accountant, as before the option existed."""
    algo = DifferentiallyPrivate(FedBuff(buffer_size=2), clip_norm=1.0, noise_multiplier=1.0)
    noise = algo.server_callbacks[0]
    assert noise.accountant == "rdp" and algo.hparams["accountant"] == "rdp"
    noise.steps = {0.1: 30}
    assert noise.epsilon == pytest.approx(_by_hand(RDPAccountant, [(1.0, 0.1)] * 30, 1e-5), rel=1e-12)


def test_heterogeneous_rates_compose_as_opacus_prv():
    """Aggregations of different sizes: each rate's steps composed (Opacus's history of (z, q, n) runs)."""
    noise = GaussianAggregateNoise(1.1, delta=1e-5, accountant="prv")
    noise.steps = {0.1: 20, 0.05: 10}
    accountant = PRVAccountant()
    accountant.history = [(1.1, 0.1, 20), (1.1, 0.05, 10)]
    assert noise.epsilon == pytest.approx(accountant.get_epsilon(delta=1e-5), rel=1e-12)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: GaussianAggregateNoise(1.0, accountant="gdp"), r"unknown accountant 'gdp'; allowed: \['rdp', 'prv'\]"),
        (lambda: LocalGaussianNoise(1.0, 1.0, accountant="PRV"), r"unknown accountant 'PRV'"),
        (lambda: GaussianAggregateNoise(1.0, delta=1e-12, accountant="prv"), r"delta \(for accountant='prv'\)"),
        (lambda: GaussianAggregateNoise(1.0, delta=0.1, accountant="prv"), r"must be in \[1e-10, 0\.01\]"),
        (
            lambda: DifferentiallyPrivate(
                FedBuff(), clip_norm=1.0, noise_multiplier=1.0, delta=0.5, accountant="prv", mode="local"
            ),
            r"delta \(for accountant='prv'\)",
        ),
        (lambda: DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=1.0, accountant=None), "accountant"),
    ],
)
def test_bad_accountant_settings_are_refused_at_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_prv_domain_size_is_opacus_own():
    """The cheap prediction of the discretization equals the domain Opacus then builds."""
    for history in ([(1.0, 0.1, 12)], [(0.6, 1.0, 5)], [(1.0, 0.1, 12), (1.0, 0.05, 30)]):
        accountant = PRVAccountant()
        accountant.history = history
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dprv = accountant._get_dprv(eps_error=fp.PRV_EPS_ERROR, delta_error=1e-5 / 1000)
        assert fp.prv_domain_size(history, 1e-5) == len(dprv.pmf)


def test_prv_beyond_its_domain_reports_the_rdp_bound_with_a_warning(monkeypatch):
    """A discretization too large to compute (large epsilon, many steps) falls back to the RDP bound, said."""
    history = [(1.0, 0.1, 12)]
    monkeypatch.setattr(fp, "PRV_MAX_DOMAIN", 1000)
    with pytest.warns(RuntimeWarning, match=r"would discretize on .* reporting the RDP bound"):
        epsilon = fp.prv_epsilon(history, 1e-5)
    assert epsilon == fp.rdp_epsilon(history, 1e-5)
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert fp.prv_epsilon(history, 1e-5) < epsilon
