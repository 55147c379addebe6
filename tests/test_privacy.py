"""Client-level differential privacy (docs/privacy.md): clipping, noise, accountant, refusals, determinism."""

from __future__ import annotations

import csv
import math
import sys
import warnings

import pytest
import torch
from conftest import check_determinism_and_exact_resume, global_weights, run

from lit_asyncfl.algorithms import FedAsync, FedAvgM, FedBuff, FedDyn
from lit_asyncfl.client_callbacks.privacy import LOCAL_NOISE_STREAM, LocalGaussianNoise
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming, derive_seed
from lit_asyncfl.functional.privacy import rdp_epsilon
from lit_asyncfl.privacy import DeltaClipping, DifferentiallyPrivate, GaussianAggregateNoise
from lit_asyncfl.server import DeltaAverage, Mixing, SlidingWindowAverage, UpdateNormBound
from lit_asyncfl.server.privacy import NOISE_STREAM


def _update(base: torch.Tensor, delta: torch.Tensor, job_id: int, client: int) -> ClientUpdate:
    job = ClientJob(job_id, client, base_version=0, dispatch_time=0.0, timing=JobTiming(0, 1, 0), seed=0,
                    local_epochs=1)  # fmt: skip
    return ClientUpdate(job, base + delta, base, num_samples=10, num_steps=1, train_loss=0.0)


def _server(aggregator, z: float, clip: float, seed: int = 5, dim: int = 40_000) -> Server:
    server = Server(torch.zeros(dim), aggregator, [GaussianAggregateNoise(z), DeltaClipping(clip)], num_clients=20)
    server.seed = seed
    server.on_fit_start()
    return server


def test_clipping_and_noise_match_a_hand_computation_fedbuff():
    """Step = eta/K (clip(D1) + clip(D2)) + N(0, (z C eta / K)^2): D1 (norm 5) is scaled to norm C = 1, D2 (norm
    0.2) passes; the noise is the seeded generator's draw, and its empirical std is z C eta / K."""
    dim, z, clip, eta = 40_000, 2.0, 1.0, 0.5
    server = _server(DeltaAverage(buffer_size=2, server_lr=eta), z, clip, dim=dim)
    base = torch.zeros(dim)
    d1, d2 = torch.full((dim,), 5.0 / 200), torch.full((dim,), 0.2 / 200)  # norms 5 and 0.2
    assert not server.receive(_update(base, d1, 0, 0))
    assert server.receive(_update(base, d2, 1, 1))
    mean_part = eta / 2 * (d1 / 5.0 + d2)
    std = z * clip * eta / 2
    generator = torch.Generator().manual_seed(derive_seed(5, NOISE_STREAM, 0, 2))
    noise = (torch.randn(dim, generator=generator, dtype=torch.float64) * std).float()
    torch.testing.assert_close(server.weights, mean_part + noise, rtol=0, atol=1e-6)
    residual = (server.weights - mean_part).double()
    assert abs(residual.std().item() - std) < 0.02 * std and abs(residual.mean().item()) < 0.02
    clipping = server.callbacks[1]
    assert clipping.metrics(server) == {"dp_clipped_fraction": 0.5}
    assert server.callbacks[0].steps == {2 / 20: 1}


def test_noise_on_fedasync_mixing_is_alpha_z_c():
    """Mixing: step = alpha (w_i - w) with w_i - w = clip(D) (base current); noise std alpha z C."""
    dim, z, clip, alpha = 40_000, 1.5, 0.5, 0.6
    server = _server(Mixing(alpha=alpha), z, clip, dim=dim)
    d = torch.full((dim,), 2.0 / 200)  # norm 2 -> scaled to 0.5
    assert server.receive(_update(torch.zeros(dim), d, 0, 3))
    residual = (server.weights - alpha * d * (clip / 2.0)).double()
    assert abs(residual.std().item() - alpha * z * clip) < 0.02 * alpha * z * clip


def test_same_seed_same_noise_other_seed_other_noise():
    def weights(seed):
        server = _server(DeltaAverage(buffer_size=1), 1.0, 1.0, seed=seed, dim=100)
        server.receive(_update(torch.zeros(100), torch.zeros(100), 0, 0))
        return server.weights

    assert torch.equal(weights(1), weights(1)) and not torch.equal(weights(1), weights(2))


def test_accountant_matches_opacus_called_directly():
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    for _ in range(120):
        accountant.step(noise_multiplier=1.1, sample_rate=0.1)
    for _ in range(30):
        accountant.step(noise_multiplier=1.1, sample_rate=0.05)
    expected = accountant.get_epsilon(delta=1e-5)
    assert rdp_epsilon([(1.1, 0.1, 120), (1.1, 0.05, 30)], 1e-5) == pytest.approx(expected, rel=1e-12)
    noise = GaussianAggregateNoise(1.1, delta=1e-5)
    noise.steps = {0.1: 120, 0.05: 30}
    assert noise.epsilon == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("make", "count"),
    [(lambda: FedBuff(buffer_size=4, concurrency=6), 4), (lambda: FedAsync(concurrency=4), 1)],
)
def test_run_accounts_each_aggregation_as_one_step_with_q_updates_over_clients(tmp_path, make, count):
    """The sampling model: each aggregation of K updates is one step of rate K / N; epsilon in rows, summary,
    loggers equals Opacus's accountant stepped once per version."""
    pytest.importorskip("opacus")
    from lightning.pytorch.loggers import CSVLogger
    from opacus.accountants import RDPAccountant

    algo = DifferentiallyPrivate(make(), clip_norm=1.0, noise_multiplier=0.8, delta=1e-4)
    trainer = run(tmp_path, algo, max_versions=12, eval_every=4, logger=CSVLogger(str(tmp_path), name="csv"))
    noise = algo.server_callbacks[0]
    assert noise.steps == {count / 10: 12}
    accountant = RDPAccountant()
    for _ in range(12):
        accountant.step(noise_multiplier=0.8, sample_rate=count / 10)
    expected = accountant.get_epsilon(delta=1e-4)
    assert trainer.summary["dp_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert trainer.summary["dp_delta"] == 1e-4 and trainer.summary["dp_steps"] == 12
    assert trainer.history[-1]["dp_epsilon"] == pytest.approx(expected, rel=1e-12)
    assert [r["dp_steps"] for r in trainer.history] == [r["version"] for r in trainer.history]
    assert 0 < trainer.history[1]["dp_epsilon"] < trainer.history[-1]["dp_epsilon"]
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        logged = [float(r["dp_epsilon"]) for r in csv.DictReader(f) if r.get("dp_epsilon")]
    assert logged[-1] == pytest.approx(expected, rel=1e-6)


def test_determinism_and_exact_resume_with_dp(tmp_path):
    def make():
        return DifferentiallyPrivate(FedBuff(buffer_size=3, concurrency=5), clip_norm=0.5, noise_multiplier=0.7)

    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions=10, midway=lambda algo: len(algo.aggregator.buffer) > 0
    )
    assert resumed.summary["dp_epsilon"] == full.summary["dp_epsilon"]
    assert resumed.summary["dp_clipped_fraction"] == full.summary["dp_clipped_fraction"]
    clip_only = run(tmp_path / "clip", DifferentiallyPrivate(FedBuff(buffer_size=3, concurrency=5), clip_norm=0.5,
                                                              noise_multiplier=0.0), max_versions=10)  # fmt: skip
    assert not torch.equal(global_weights(clip_only), global_weights(full))  # the noise did something
    assert clip_only.summary["dp_epsilon"] == math.inf


def test_budget_stops_aggregating_before_exceeding_max_epsilon(tmp_path):
    pytest.importorskip("opacus")
    algo = DifferentiallyPrivate(FedBuff(buffer_size=2, concurrency=4), clip_norm=1.0, noise_multiplier=1.0,
                                 max_epsilon=3.0)  # fmt: skip
    trainer = run(tmp_path, algo, max_virtual_time=3000)
    noise = algo.server_callbacks[0]
    assert trainer.summary["reject_reasons"].get("privacy_budget", 0) == 1  # the run ends at the first
    assert trainer.summary["stop_reason"] == "privacy_budget"
    assert trainer.summary["dp_epsilon"] <= 3.0
    assert noise.epsilon_after({0.2: 1}) > 3.0  # one more aggregation would have exceeded it


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: DeltaClipping(0.0), "clip_norm"),
        (lambda: DeltaClipping(-1.0), "clip_norm"),
        (lambda: DeltaClipping(math.inf), "clip_norm"),
        (lambda: GaussianAggregateNoise(-0.1), "noise_multiplier"),
        (lambda: GaussianAggregateNoise(1.0, delta=0.0), "delta"),
        (lambda: GaussianAggregateNoise(1.0, delta=1.0), "delta"),
        (lambda: GaussianAggregateNoise(1.0, max_epsilon=-1.0), "max_epsilon"),
        (lambda: GaussianAggregateNoise(1.0, max_epsilon=0.0), "max_epsilon"),
        (lambda: GaussianAggregateNoise(0.0, max_epsilon=1.0), "needs noise_multiplier > 0"),
        (lambda: DifferentiallyPrivate(FedBuff(), clip_norm=None, noise_multiplier=1.0), "clip_norm"),
        (lambda: DifferentiallyPrivate("FedBuff", clip_norm=1.0, noise_multiplier=1.0), "Algorithm"),
    ],
)
def test_nonsense_settings_are_refused_at_construction(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def _fit_start(callbacks, aggregator=None, param_numel=None):
    server = Server(torch.zeros(8), aggregator or DeltaAverage(2), callbacks, num_clients=4, param_numel=param_numel)
    server.on_fit_start()


@pytest.mark.parametrize(
    ("callbacks", "kwargs", "match"),
    [
        (lambda: [GaussianAggregateNoise(1.0)], {}, "noise without clipping"),
        (lambda: [GaussianAggregateNoise(1.0), DeltaClipping(1.0), _Transform()], {}, "_Transform comes after"),
        (
            lambda: [FedAvgM().server_callbacks[-1], GaussianAggregateNoise(1.0), DeltaClipping(1.0)],
            {},
            "ServerMomentum comes before",
        ),
        (lambda: [GaussianAggregateNoise(1.0), DeltaClipping(1.0)], {"param_numel": 6}, "BatchNorm"),
        (
            lambda: [GaussianAggregateNoise(1.0), DeltaClipping(1.0)],
            {"aggregator": SlidingWindowAverage(3)},
            "SlidingWindowAverage",
        ),
        (
            lambda: [GaussianAggregateNoise(1.0, max_epsilon=1.0), DeltaClipping(1.0)],
            {"aggregator": DeltaAverage(None)},
            "buffer_size",
        ),
    ],
)
def test_wrong_compositions_are_refused_at_fit_start(callbacks, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _fit_start(callbacks(), **kwargs)


class _Transform(UpdateNormBound):
    def transform_update(self, server, update):
        return update


def test_wrapper_composes_with_a_server_optimizer_and_a_correction():
    """Noise first among step transforms (before FedAvgM's momentum), clipping last among update transforms."""
    for preset in (FedAvgM(), FedDyn()):  # FedDyn's correction is then refused at fit start
        algo = DifferentiallyPrivate(preset, clip_norm=1.0, noise_multiplier=1.0)
        assert isinstance(algo.server_callbacks[0], GaussianAggregateNoise)
        assert isinstance(algo.server_callbacks[-1], DeltaClipping)
        assert algo.hparams["algorithm"] is preset and algo.scheduler is preset.scheduler


def test_step_callbacks_reading_the_updates_after_the_noise_are_refused():
    """D1/D2: FedDyn's correction (h from the un-noised deltas) and FedHist's INA (norm of the unclipped updates)
    transform the step after the noise: refused, naming the alternative; post-processing (momentum) passes."""
    from lit_asyncfl.algorithms import FADAS, FedHist

    with pytest.raises(ValueError, match=r"DynamicCorrection transforms the step after the noise.*mode='local'"):
        _fit_start(DifferentiallyPrivate(FedDyn(), clip_norm=1.0, noise_multiplier=1.0).server_callbacks)
    with pytest.raises(ValueError, match=r"NormAmplification .*FedHist\(ina=False\)"):
        _fit_start(DifferentiallyPrivate(FedHist(), clip_norm=1.0, noise_multiplier=1.0).server_callbacks)
    with pytest.warns(UserWarning, match="HistoryAwareWeight"):
        _fit_start(DifferentiallyPrivate(FedHist(ina=False), clip_norm=1.0, noise_multiplier=1.0).server_callbacks)
    for preset in (FedAvgM(), FADAS()):
        _fit_start(DifferentiallyPrivate(preset, clip_norm=1.0, noise_multiplier=1.0).server_callbacks)


def test_missing_opacus_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "opacus", None)
    monkeypatch.setitem(sys.modules, "opacus.accountants", None)
    with pytest.raises(ImportError, match=r"pip install lit-asyncfl\[privacy\]"):
        rdp_epsilon([(1.0, 0.1, 1)], 1e-5)


def test_missing_opacus_is_refused_at_construction(monkeypatch):
    """D4: without opacus the run used to fail at its first epsilon, mid-event with no checkpoint; now the
    constructor refuses (z > 0 only: z = 0 needs no accountant)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "opacus" else real(name, *a))
    for build in (
        lambda: GaussianAggregateNoise(1.0),
        lambda: LocalGaussianNoise(clip_norm=1.0, noise_multiplier=1.0),
        lambda: DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=0.5),
        lambda: DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=0.5, mode="local"),
    ):
        with pytest.raises(ImportError, match=r"noise_multiplier > 0 .*pip install lit-asyncfl\[privacy\]"):
            build()
    GaussianAggregateNoise(0.0), LocalGaussianNoise(clip_norm=1.0, noise_multiplier=0.0)


def test_local_dp_clips_and_noises_each_upload_as_computed_by_hand():
    """Upload = base + clip(D) + N(0, (z C)^2) drawn from the job's seed; the std is z C."""
    dim, z, clip = 40_000, 0.5, 0.2
    noise = LocalGaussianNoise(clip_norm=clip, noise_multiplier=z)
    noise.on_fit_start(4)
    base = torch.ones(dim)
    d = torch.full((dim,), 1.0 / 200)  # norm 1 -> scaled to 0.2
    update = _update(base, d, 3, 2)
    update.job.seed = 1234
    noise.on_train_end(None, update.job, update)
    generator = torch.Generator().manual_seed(derive_seed(1234, LOCAL_NOISE_STREAM))
    expected = base + d * clip + (torch.randn(dim, generator=generator, dtype=torch.float64) * z * clip).float()
    torch.testing.assert_close(update.weights, expected, rtol=0, atol=1e-6)
    residual = (update.weights - base - d * clip).double()
    assert abs(residual.std().item() - z * clip) < 0.02 * z * clip
    assert noise.uploads == {2: 1} and "dp_delta_norm" not in update.info  # D5: the exact norm stays local


def test_local_dp_run_accounts_the_busiest_client_and_resumes_exactly(tmp_path):
    """Each upload: a Gaussian mechanism of multiplier z / 2 (sensitivity 2C), q = 1, composed over the uploads of
    the client that uploaded most; determinism and exact resume with the noise on."""
    pytest.importorskip("opacus")
    from opacus.accountants import RDPAccountant

    def make():
        return DifferentiallyPrivate(FedAsync(concurrency=4), clip_norm=0.5, noise_multiplier=1.2, mode="local")

    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions=12, midway=lambda algo: bool(algo.client_callbacks[-1].uploads)
    )
    local = full.algorithm.client_callbacks[-1]
    most = max(local.uploads.values())
    assert full.summary["dp_max_uploads"] == most == resumed.summary["dp_max_uploads"]
    accountant = RDPAccountant()
    for _ in range(most):
        accountant.step(noise_multiplier=0.6, sample_rate=1.0)
    assert full.summary["dp_local_epsilon"] == pytest.approx(accountant.get_epsilon(delta=1e-5), rel=1e-12)
    assert full.history[-1]["dp_local_epsilon"] == full.summary["dp_local_epsilon"]
    assert resumed.summary["dp_local_epsilon"] == full.summary["dp_local_epsilon"]
    assert "dp_epsilon" not in full.summary  # no central mechanism, no central epsilon


def test_local_dp_refuses_a_model_with_floating_buffers():
    """D3: local DP noised BatchNorm's running statistics with the parameters (running_var < 0: NaN); refused
    like the central mode, naming norm='group'. The integer num_batches_tracked is not named."""
    noise = LocalGaussianNoise(clip_norm=1.0, noise_multiplier=1.0)
    batch_norm = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with pytest.raises(ValueError, match=r"\(1\.running_mean, 1\.running_var: .*norm='group'"):
        noise.check_module(batch_norm)
    noise.check_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GroupNorm(2, 4)))


def test_local_dp_fit_refuses_batch_norm_before_training(tmp_path):
    from lit_asyncfl.models import ResNet20

    algo = DifferentiallyPrivate(FedBuff(buffer_size=2), clip_norm=1.0, noise_multiplier=0.5, mode="local")
    with pytest.raises(ValueError, match=r"ResNet20 has floating buffers .*norm='group'"):
        run(tmp_path, algo, model=ResNet20(in_channels=1, norm="batch"), max_versions=1)


def test_local_mode_refusals():
    with pytest.raises(ValueError, match="mode"):
        DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=1.0, mode="shuffle")
    with pytest.raises(ValueError, match=r"max_epsilon=2\.0 allows no upload: one upload already spends"):
        DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=1.0, max_epsilon=2.0, mode="local")
    for bad in ({"clip_norm": 0.0}, {"noise_multiplier": -1.0}, {"delta": 1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LocalGaussianNoise(**{"clip_norm": 1.0, "noise_multiplier": 1.0, **bad})


def test_weights_read_from_the_updates_draw_a_warning():
    from lit_asyncfl.algorithms import FedHist

    with pytest.warns(UserWarning, match="HistoryAwareWeight may compute aggregation weights"):
        _fit_start(DifferentiallyPrivate(FedHist(ina=False), clip_norm=1.0, noise_multiplier=1.0).server_callbacks)
    with pytest.warns(UserWarning, match="UpdateNormBound may accept or reject updates by their content"):
        _fit_start([GaussianAggregateNoise(1.0), UpdateNormBound(), DeltaClipping(1.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _fit_start(DifferentiallyPrivate(FedBuff(), clip_norm=1.0, noise_multiplier=1.0).server_callbacks)


def test_loss_based_selection_draws_a_warning():
    """D5(b): ASFL's and Oort's selections read the un-noised train_loss; FedCS (latency only) does not."""
    from lit_asyncfl.algorithms import ASFL, FedCS, Oort

    for preset in (ASFL(), Oort()):
        for mode in ("central", "local"):
            with pytest.warns(UserWarning, match="Selection selects devices from their reported training loss"):
                DifferentiallyPrivate(preset, clip_norm=1.0, noise_multiplier=1.0, mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DifferentiallyPrivate(FedCS(), clip_norm=1.0, noise_multiplier=1.0)
