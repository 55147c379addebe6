"""ASO-Fed and FedSA (FedASMU's Table 1 baselines, as third parties re-implemented them): formulas against hand
values, whole runs replayed by hand from the recorded uploads, determinism, exact resume, refused settings, configs
that run."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from builders import ROOT
from conftest import RecordsVersions, assert_same, check_determinism_and_exact_resume, run

from lit_asyncfl.algorithms import PRESETS, ASOFed, FedSA
from lit_asyncfl.cli import FederatedCLI
from lit_asyncfl.client.callbacks import ClientCallback, ProximalTerm
from lit_asyncfl.client.staleness_callbacks import DecayedCorrection, DelayAdaptiveStepSize, ParticipationLearningRate
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
from lit_asyncfl.functional.asofed import asofed_correction, asofed_step_size, running_mean
from lit_asyncfl.functional.fedsa import fedsa_learning_rate, fedsa_participation
from lit_asyncfl.schedulers import BufferedConcurrency, KeepConcurrency
from lit_asyncfl.server import DataSizeWeight, DeltaAverage, ModelAverage, StalenessBound
from lit_asyncfl.server.data_fraction import DataFractionWeight

LR = 0.05  # conftest's LeNet5(lr=0.05)


def make_update(client: int, weights, base, base_version: int = 0, num_samples: int = 10) -> ClientUpdate:
    job = ClientJob(0, client, base_version, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)
    return ClientUpdate(job, torch.tensor(weights), torch.tensor(base), num_samples, 1, 0.0)


# ---------------------------------------------------------------------------------------------------------- formulas


def test_asofed_correction_over_three_jobs_by_hand():
    beta = 0.25
    s1, s2, s3 = torch.tensor([4.0, -2.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.0, 3.0])
    z1, h1 = asofed_correction(s1, None, None, beta)
    assert torch.equal(z1, s1) and torch.equal(h1, torch.zeros(2))  # first job: the pseudo-gradient itself
    z2, h2 = asofed_correction(s2, s1, h1, beta)
    assert torch.allclose(z2, torch.tensor([1 - 4.0, 1 + 2.0]))  # s2 - s1 + 0
    assert torch.allclose(h2, 0.75 * s1)  # beta * 0 + (1 - beta) * s1
    z3, h3 = asofed_correction(s3, s2, h2, beta)
    assert torch.allclose(z3, torch.tensor([0 - 1 + 3.0, 3 - 1 - 1.5]))
    assert torch.allclose(h3, 0.25 * 0.75 * s1 + 0.75 * s2)
    with pytest.raises(ValueError, match=r"ASO-Fed beta must be in \[0, 1\], got 1.5"):
        asofed_correction(s1, None, None, 1.5)


@pytest.mark.parametrize(
    "mean, base, expected",
    [(0.0, math.e, 1.0), (1.0, math.e, 1.0), (math.e, math.e, 1.0), (math.e**3, math.e, 3.0), (50.0, math.e,
     math.log(50.0)), (50.0, 10.0, math.log10(50.0)), (5.0, 10.0, 1.0), (10_000.0, 10.0, 4.0)],
)  # fmt: skip
def test_asofed_step_size_by_hand(mean, base, expected):
    assert asofed_step_size(mean, base) == pytest.approx(expected)


def test_running_mean_fedsa_rate_and_refused_inputs_by_hand():
    assert running_mean(0.0, 0, 7.0) == 7.0
    assert running_mean(7.0, 1, 1.0) == 4.0
    assert running_mean(4.0, 2, 10.0) == 6.0
    assert [fedsa_learning_rate(2.0, 20, c) for c in range(4)] == [0.1, 0.1, 0.05, 2.0 / 60]
    for call, message in [
        (lambda: asofed_step_size(-1.0), r"the mean delay must be >= 0, got -1.0"),
        (lambda: asofed_step_size(5.0, log_base=1.0), r"the logarithm's base must be > 1, got 1.0"),
        (lambda: running_mean(1.0, -1, 2.0), r"count must be >= 0, got -1"),
        (lambda: fedsa_learning_rate(0.0, 10, 1), r"FedSA's base learning rate must be > 0, got 0.0"),
        (lambda: fedsa_learning_rate(1.0, 0, 1), r"the number of clients must be >= 1, got 0"),
        (lambda: fedsa_learning_rate(1.0, 10, -1), r"participations must be >= 0, got -1"),
        (lambda: fedsa_learning_rate(1.0, 10, 1, 5, "mean"), r"unknown frequency 'mean'; allowed: \['share', "),
        (lambda: fedsa_learning_rate(1.0, 10, 3, None, "share"), r"needs the total updates C >= c_i = 3, got None"),
        (lambda: fedsa_participation(10, 3, 2, "share"), r"needs the total updates C >= c_i = 3, got 2"),
    ]:
        with pytest.raises(ValueError, match=message):
            call()


def test_fedsa_share_reading_by_hand():
    # N = 4 clients, C = 12 updates: mean count 3; eta_i = eta / (N f_i), f_i = max(1/N, c_i / C)
    assert [fedsa_participation(4, c, 12, "share") for c in (0, 1, 3, 6, 12)] == [0.25, 0.25, 0.25, 0.5, 1.0]
    assert [fedsa_learning_rate(0.2, 4, c, 12, "share") for c in (0, 1, 2, 3)] == [0.2] * 4  # capped at eta
    assert fedsa_learning_rate(0.2, 4, 6, 12, "share") == pytest.approx(0.1)  # twice the mean: half the rate
    assert fedsa_learning_rate(0.2, 4, 12, 12, "share") == pytest.approx(0.05)  # every update: eta / N
    assert fedsa_learning_rate(0.2, 4, 0, 0, "share") == 0.2  # before any update: the uniform share
    assert fedsa_learning_rate(0.2, 4, 1, 1, "share") == pytest.approx(0.05)  # the only update so far
    assert fedsa_learning_rate(0.2, 4, 8, 12, "share") == pytest.approx(0.2 * 12 / 32)
    # "count" ignores C: the Flower code's eta / (N max(1, c_i))
    assert fedsa_participation(4, 6, 12, "count") == 6 and fedsa_learning_rate(0.2, 4, 6, 12, "count") == 0.2 / 24


def test_participation_counts_total_is_derived_from_the_counts_on_load():
    cb = ParticipationLearningRate()
    cb.load_state_dict({"participations": {"0": 2, "3": 5}})  # a checkpoint written before "dispatched" existed
    assert (cb.participations, cb.total, cb.dispatched) == ({0: 2, 3: 5}, 7, {})
    cb.load_state_dict({"participations": {1: 1}, "dispatched": {"9": [1, 4]}})
    assert (cb.total, cb.dispatched) == (1, {9: (1, 4)})


def test_data_fraction_step_on_a_tiny_server_by_hand():
    weight = DataFractionWeight()
    server = Server(torch.zeros(2), DeltaAverage(buffer_size=1, server_lr=1.0), [weight], num_clients=3)
    server.on_fit_start()
    server.receive(make_update(0, [2.0, 0.0], [0.0, 0.0], num_samples=10))  # n = 10: a full step
    assert torch.allclose(server.weights, torch.tensor([2.0, 0.0]))
    server.receive(make_update(1, [0.0, 4.0], [0.0, 0.0], num_samples=30))  # n = 40: 30/40 of the delta
    assert torch.allclose(server.weights, torch.tensor([2.0, 3.0]))
    server.receive(make_update(0, [3.0, 3.0], [2.0, 0.0], base_version=1, num_samples=10))  # n stays 40
    assert torch.allclose(server.weights, torch.tensor([2.25, 3.75]))
    assert weight.state_dict() == {"samples": {0: 10, 1: 30}} and weight.total == 40
    restored = DataFractionWeight()
    restored.load_state_dict(weight.state_dict())
    assert restored.total == 40


# ------------------------------------------------------------------------------------------- runs replayed by hand


class Uploads(RecordsVersions):
    """Put first among the callbacks: records every arrival (accepted or not) and every new version."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[dict] = []

    def reject_update(self, server, update):
        self.arrivals.append({"client": update.client, "staleness": update.staleness, "weights": update.weights,
                              "base": update.base_weights, "base_version": update.base_version,
                              "global": server.weights, "n": update.num_samples, "info": dict(update.info),
                              "dispatch_time": update.job.dispatch_time, "arrival_time": server.now,
                              "accepted": False})  # fmt: skip
        return None

    def weight_update(self, server, update, weight):
        assert weight == 1.0 and self.arrivals[-1]["weights"] is update.weights
        self.arrivals[-1]["accepted"] = True
        return weight


class TrainedWeights(ClientCallback):
    """Put before DecayedCorrection: records each job's trained weights before the correction replaces them."""

    def __init__(self) -> None:
        self.trained: list[torch.Tensor] = []  # in training order: jobs are trained at their arrival events

    def on_train_end(self, trainer, job, update):
        self.trained.append(update.weights.clone())


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_asofed_run_replayed_from_the_recorded_uploads(tmp_path):
    beta, log_base = 0.3, 2.0  # base 2: r_k > 1 from a mean delay above 2 versions, reached in this tiny run
    algorithm = ASOFed(lam=0.01, beta=beta, log_base=log_base, concurrency=4)
    record, trained = Uploads(), TrainedWeights()
    algorithm.server_callbacks.insert(0, record)
    algorithm.client_callbacks.insert(2, trained)  # after the step size and the proximal term, before the correction
    trainer = run(tmp_path, algorithm, num_clients=6, max_versions=24, data_kwargs={"partition": "dirichlet"})
    assert len(record.versions) == 24 and all(v["count"] == 1 for v in record.versions)
    assert all(a["accepted"] for a in record.arrivals)
    n_params = trainer.simulator.server.weights.numel()  # LeNet-5 has no floating buffers
    assert len(trained.trained) == len(record.arrivals)
    last_version: dict[int, int] = {}
    delays: dict[int, list[int]] = {}
    prev_s: dict[int, torch.Tensor] = {}
    h: dict[int, torch.Tensor] = {}
    factors = []
    for i, (arrival, version) in enumerate(zip(record.arrivals, record.versions)):
        k = arrival["client"]
        # the client's step size: r = max(1, log2(mean versions between its downloads)), lr = 0.05 r
        delays.setdefault(k, []).append(arrival["base_version"] - last_version.get(k, 0))
        last_version[k] = arrival["base_version"]
        mean = sum(delays[k]) / len(delays[k])
        r = max(1.0, math.log2(mean)) if mean > 0 else 1.0
        factors.append(r)
        assert arrival["info"]["step_size_factor"] == pytest.approx(r)
        assert arrival["info"]["lr"] == pytest.approx(LR * r)
        # the client's correction, from its trained weights: zeta = s - s_prev + h_prev, h = b h_prev + (1-b) s_prev
        s = arrival["base"] - trained.trained[i]
        zero = torch.zeros(n_params)
        zeta = s - prev_s.get(k, zero) + h.get(k, zero)
        h[k] = beta * h.get(k, zero) + (1 - beta) * prev_s.get(k, zero)
        prev_s[k] = s
        assert close(arrival["weights"], arrival["base"] - zeta)
        # the server: w <- w - (n_k / n_seen) zeta
        assert torch.equal(arrival["global"], version["before"])
        n_seen = sum({a["client"]: a["n"] for a in record.arrivals[: i + 1]}.values())
        assert close(version["after"], version["before"] - arrival["n"] / n_seen * zeta)
    assert max(factors) > 1.0  # the dynamic step size was exercised
    assert len({a["client"] for a in record.arrivals}) >= 3 and any(len(d) >= 3 for d in delays.values())


def share_rates(arrivals, num_clients: int, eta) -> tuple[list[float], list[float]]:
    """Each job's FedSA rate eta min(1, C / (N c_i)) (eta when c_i = 0) from the recorded arrivals, with C the
    arrivals up to its dispatch (the server's count then), and with C the arrivals before its own (when it is
    trained): the second must differ somewhere for the test to tell them apart."""
    at_dispatch, at_training, jobs = [], [], {}
    for k, a in enumerate(arrivals):
        c = jobs.get(a["client"], 0)
        total = sum(1 for b in arrivals if b["arrival_time"] <= a["dispatch_time"])
        assert total >= c and sum(1 for b in arrivals[:k] if b["client"] == a["client"]) == c
        e = eta(a)
        at_dispatch.append(e if c == 0 else e * min(1.0, total / (num_clients * c)))
        at_training.append(e if c == 0 else e * min(1.0, k / (num_clients * c)))
        jobs[a["client"]] = c + 1
    return at_dispatch, at_training


@pytest.mark.parametrize("frequency", ["share", "count"])
def test_fedsa_run_replayed_from_the_recorded_uploads(tmp_path, frequency):
    m, tau0 = 3, 1
    algorithm = FedSA(buffer_size=m, max_staleness=tau0, concurrency=7, frequency=frequency)
    record = Uploads()
    algorithm.server_callbacks.insert(0, record)
    trainer = run(tmp_path, algorithm, num_clients=10, max_versions=12, data_kwargs={"partition": "dirichlet"})
    assert [v["count"] for v in record.versions] == [m] * 12
    discarded = [a for a in record.arrivals if not a["accepted"]]
    assert discarded and all(a["staleness"] > tau0 for a in discarded)  # the bound was exercised
    assert all(a["staleness"] <= tau0 for a in record.arrivals if a["accepted"])
    assert trainer.simulator.server.stats.discarded == len(discarded)
    jobs: dict[int, int] = {}
    for a in record.arrivals:
        jobs[a["client"]] = jobs.get(a["client"], 0) + 1
    assert max(jobs.values()) >= 3  # rates below the configured one were exercised
    rates = [a["info"]["lr"] for a in record.arrivals]
    if frequency == "count":  # the local rate: lr / max(1, jobs the client completed before)
        seen: dict[int, int] = {}
        for a in record.arrivals:
            assert a["info"]["lr"] == pytest.approx(LR / max(1, seen.get(a["client"], 0)))
            seen[a["client"]] = seen.get(a["client"], 0) + 1
    else:  # lr min(1, C / (N c_i)), capped at lr, C and c_i at the job's dispatch
        at_dispatch, at_training = share_rates(record.arrivals, 10, lambda a: LR)
        assert rates == pytest.approx(at_dispatch)
        assert at_training != pytest.approx(at_dispatch)  # dispatch-time counts are what the test checks
        assert any(r < LR * 0.99 for r in rates) and sum(r == LR for r in rates) > 10  # the cap and the rule
        assert any(r == LR for r, a in zip(rates, record.arrivals) if a["base_version"] > 0)
    accepted = [a for a in record.arrivals if a["accepted"]]
    for r, version in enumerate(record.versions):
        buffered = accepted[r * m : (r + 1) * m]
        expected = sum(a["n"] * a["weights"] for a in buffered) / sum(a["n"] for a in buffered)
        assert close(version["after"], expected), r


@pytest.mark.parametrize("frequency", ["share", "count"])
def test_fedsa_base_lr_sets_eta_itself(tmp_path, frequency):
    algorithm = FedSA(buffer_size=2, concurrency=4, base_lr=3.0, frequency=frequency)
    record = Uploads()
    algorithm.server_callbacks.insert(0, record)
    run(tmp_path, algorithm, num_clients=6, max_versions=6)
    rates = [a["info"]["lr"] for a in record.arrivals]
    if frequency == "count":
        jobs: dict[int, int] = {}
        for a in record.arrivals:
            assert a["info"]["lr"] == pytest.approx(3.0 / (6 * max(1, jobs.get(a["client"], 0))))
            jobs[a["client"]] = jobs.get(a["client"], 0) + 1
    else:
        assert rates == pytest.approx(share_rates(record.arrivals, 6, lambda a: 3.0)[0])
        assert max(rates) == 3.0 and min(rates) < 3.0


# ------------------------------------------------------------------------------------- determinism and exact resume


PRESET_RUNS = {
    "asofed": (lambda: ASOFed(concurrency=4, log_base=2.0), 16),
    "fedsa": (lambda: FedSA(buffer_size=3, concurrency=6, max_staleness=2), 10),
    "fedsa_count": (lambda: FedSA(buffer_size=3, concurrency=6, max_staleness=2, frequency="count"), 10),
}


def state_is_midway(name: str, algorithm) -> bool:
    if name == "asofed":  # some client has a history (h, previous pseudo-gradient, delays) to carry over
        return any(j >= 2 for j in algorithm.client_callbacks[0].jobs.values())
    if name.startswith("fedsa"):  # "share" also carries the counts taken at the in-flight jobs' dispatches
        lr = algorithm.client_callbacks[0]
        return (
            len(algorithm.aggregator.buffer) > 0
            and any(c >= 2 for c in lr.participations.values())
            and (lr.frequency == "count" or any(t > 0 for _, t in lr.dispatched.values()))
        )
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(PRESET_RUNS))
def test_preset_is_deterministic_and_resumes_exactly(tmp_path, name):
    make, versions = PRESET_RUNS[name]
    full, resumed = check_determinism_and_exact_resume(
        tmp_path, make, versions, lambda algorithm: state_is_midway(name, algorithm)
    )
    a, b = resumed.simulator.server.state_dict(), full.simulator.server.state_dict()
    assert_same(a["aggregator"], b["aggregator"])
    assert_same(a["callbacks"], b["callbacks"])
    for x, y in zip(resumed.algorithm.client_callbacks, full.algorithm.client_callbacks):
        assert_same(x.state_dict(), y.state_dict())


# ----------------------------------------------------------------------------------------- settings and composition


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ASOFed(lam=-0.1), r"lam must be >= 0, got -0.1"),
        (lambda: ASOFed(beta=1.5), r"beta must be in \[0, 1\], got 1.5"),
        (lambda: ASOFed(log_base=1.0), r"log_base must be > 1, got 1.0"),
        (lambda: ASOFed(concurrency=0), r"concurrency must be >= 1, got 0"),
        (lambda: FedSA(buffer_size=0), r"buffer_size must be >= 1, got 0"),
        (lambda: FedSA(max_staleness=-1), r"max_staleness must be >= 0, got -1"),
        (lambda: FedSA(base_lr=0.0), r"base_lr must be a finite number > 0 or None, got 0.0|base_lr must be > 0"),
        (lambda: FedSA(concurrency=1.5), r"concurrency"),
        (lambda: DecayedCorrection(beta=float("nan")), r"beta must be a finite number in \[0, 1\], got nan"),
        (lambda: DelayAdaptiveStepSize(log_base=float("inf")), r"log_base must be a finite number > 1, got inf"),
        (lambda: ParticipationLearningRate(base_lr=-1.0), r"base_lr must be > 0, got -1.0"),
        (lambda: FedSA(frequency="mean"), r"unknown frequency 'mean'; allowed: \['share', 'count'\]"),
        (lambda: ParticipationLearningRate(frequency=3), r"unknown frequency 3; allowed: \['share', 'count'\]"),
    ],
)
def test_bad_hyper_parameters_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_fedsa_refuses_fewer_selected_clients_than_its_buffer(tmp_path):
    with pytest.raises(ValueError, match=r"concurrency=2 selects 2 clients, fewer than the aggregator's buffer_size=3"):
        run(tmp_path, FedSA(buffer_size=3, concurrency=2), max_versions=2)


@pytest.mark.parametrize("make", [ASOFed, FedSA])
def test_the_cohort_engine_refuses_the_stateful_client_callbacks_naming_the_alternative(tmp_path, make):
    with pytest.raises(ValueError, match=r"cannot run the client callback \w+ .*engine='fast'"):
        run(tmp_path, make(), max_versions=2, engine="cohort")


def test_presets_are_registered_and_are_the_re_implementations_compositions():
    assert PRESETS["asofed"] is ASOFed and PRESETS["fedsa"] is FedSA
    aso = ASOFed()
    assert type(aso.scheduler) is KeepConcurrency and aso.scheduler.concurrency == 1.0  # the paper: all
    assert type(aso.aggregator) is DeltaAverage
    assert (aso.aggregator.buffer_size, aso.aggregator.server_lr, aso.aggregator.normalize) == (1, 1.0, False)
    assert [type(cb) for cb in aso.server_callbacks] == [DataFractionWeight]
    step, prox, corr = aso.client_callbacks
    assert isinstance(step, DelayAdaptiveStepSize) and step.log_base == math.e
    assert type(prox) is ProximalTerm and prox.mu == 0.01
    assert isinstance(corr, DecayedCorrection) and corr.beta == 0.5
    assert not any(cb.runs_on_workers for cb in (step, corr))
    sa = FedSA()
    assert type(sa.scheduler) is BufferedConcurrency and (sa.scheduler.concurrency, sa.scheduler.max_staleness) == (
        1.0,
        None,
    )
    assert type(sa.aggregator) is ModelAverage and sa.aggregator.buffer_size == 30
    bound, size = sa.server_callbacks
    assert type(bound) is StalenessBound and bound.max_staleness == 3 and type(size) is DataSizeWeight
    (lr,) = sa.client_callbacks
    assert isinstance(lr, ParticipationLearningRate) and lr.base_lr is None and not lr.runs_on_workers
    assert lr.frequency == "share" and FedSA(frequency="count").client_callbacks[0].frequency == "count"
    assert ASOFed.__doc__.splitlines()[0].endswith("as re-implemented by AFL-Lib and FedOpt (not the authors).")
    assert "as re-implemented by a third-party Flower" in FedSA.__doc__.splitlines()[0]


def test_fedasmu_comparison_spec_and_the_benchmark_suite_include_the_presets():
    spec = yaml.safe_load((ROOT / "configs" / "compare" / "fedasmu_table1.yaml").read_text())
    assert spec["methods"]["ASO-Fed"][0] == "--trainer.algorithm=ASOFed"
    assert spec["methods"]["FedSA"][0] == "--trainer.algorithm=FedSA"
    text = (ROOT / "scripts" / "bench_algorithms.py").read_text()
    suite = text[text.index('"fedasmu": {') : text.index('"fedadt": {')]
    assert all(f'"{name}"' in suite for name in ("ASOFed", "FedSA"))


@pytest.mark.parametrize("name, overrides", [
    ("asofed", ["--trainer.algorithm.init_args.concurrency=4"]),
    ("fedsa", ["--trainer.algorithm.init_args.concurrency=6", "--trainer.algorithm.init_args.buffer_size=2"]),
])  # fmt: skip
def test_config_parses_and_runs(tmp_path, name, overrides):
    config = ROOT / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(config.read_text())
    cli = FederatedCLI(
        args=["fit", "--config", str(config), "--trainer.num_clients=12", "--trainer.max_versions=3",
              "--trainer.max_virtual_time=null", *overrides,
              "--trainer.eval_every=3", f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.print_summary=false"]
    )  # fmt: skip
    algorithm = cli.trainer.algorithm
    assert type(algorithm) is PRESETS[name]
    for key, value in raw["trainer"]["algorithm"]["init_args"].items():
        if key not in ("concurrency", "buffer_size"):
            assert algorithm.hparams[key] == value, key
    summary = cli.trainer.summary
    assert summary["versions"] == 3 and summary["stop_reason"] == "max_versions"
    assert 0.0 < cli.trainer.history[-1]["val_acc"] <= 1.0


def test_a_diverged_asofed_job_teaches_the_clients_correction_nothing():
    from types import SimpleNamespace

    def job_end(callback, base, trained):
        update = SimpleNamespace(base_weights=base, weights=trained, info={})
        trainer = SimpleNamespace(flat=SimpleNamespace(param_numel=3))
        callback.on_train_end(trainer, SimpleNamespace(client=7), update)
        return update

    base = torch.tensor([1.0, 2.0, 3.0])
    first, later = base - torch.tensor([0.1, 0.2, 0.3]), base - torch.tensor([0.4, -0.2, 0.0])
    twin, diverged = DecayedCorrection(beta=0.5), DecayedCorrection(beta=0.5)
    for callback in (twin, diverged):
        job_end(callback, base, first.clone())
    nan = job_end(diverged, base, torch.tensor([float("nan"), 0.0, 0.0]))
    assert nan.info["client_state"] == "not learned: non-finite weights" and torch.isnan(nan.weights[0])
    a, b = job_end(twin, base, later.clone()), job_end(diverged, base, later.clone())
    # by hand: s = (0.4, -0.2, 0), s_pre = (0.1, 0.2, 0.3), h_pre = 0: zeta = s - s_pre, uploaded w_g - zeta
    torch.testing.assert_close(b.weights, base - (torch.tensor([0.4, -0.2, 0.0]) - torch.tensor([0.1, 0.2, 0.3])))
    assert torch.equal(a.weights, b.weights) and torch.equal(twin.h[7], diverged.h[7])


def test_asofed_passes_its_lam_to_the_proximal_term():
    assert ASOFed(lam=0.3).client_callbacks[1].mu == 0.3
