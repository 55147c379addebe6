"""REFL: its formulas by hand, a whole run replayed by hand from the recorded uploads, the deadline rounds that
learn availability from what the server observed."""

from __future__ import annotations

import math

import numpy as np
import torch
from builders import RecordsUploads
from conftest import run

from lit_asyncfl.algorithms import REFL
from lit_asyncfl.availability import MarkovOnOff
from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.core.update import ClientJob, JobTiming
from lit_asyncfl.functional.refl import deviation_ratio, ips_priority, offline_rate, saa_weight
from lit_asyncfl.schedulers.deadline_rounds import DeadlineRounds
from lit_asyncfl.schedulers.selection import RandomSelection

DATA = {"partition": "dirichlet"}


def test_refl_formulas_by_hand():
    mean = torch.tensor([1.0, 1.0])  # two fresh updates; a stale one at [3, 1]: |[2, 0]|^2 / (9 * 2)
    assert math.isclose(deviation_ratio(torch.tensor([3.0, 1.0]), mean, 2), 4.0 / 18.0, rel_tol=1e-6)
    assert deviation_ratio(torch.tensor([3.0, 1.0]), torch.zeros(2), 2) == 1.0
    assert math.isclose(saa_weight(2, 0.5, 1.0, beta=0.35, scale=10.0), 0.65 / 3 + 0.35 * (1 - math.exp(-0.5) / 10))
    assert math.isclose(saa_weight(1, 1.0, 1.0, beta=0.0), 0.5)  # damping alone: 1 / (tau + 1)
    assert offline_rate(3, 60.0) == 0.05 and offline_rate(0, 60.0) == 0.0
    w = 10.0  # e^{-lambda w} >= 0.5 > e^{-2 lambda w}: lambda in (ln 2 / 20, ln 2 / 10]
    assert not ips_priority(math.log(2) / 20 - 1e-9, w) and ips_priority(math.log(2) / 20 + 1e-9, w)
    assert ips_priority(math.log(2) / 10, w) and not ips_priority(math.log(2) / 10 + 1e-9, w)


def test_refl_run_replayed_from_the_recorded_uploads(tmp_path):
    algo = REFL(clients_per_round=4, deadline=30.0, beta=0.35, scale=2.0, prohibit_reselect=1)
    record = RecordsUploads()
    algo.server_callbacks.append(record)
    trainer = run(tmp_path, algo, num_clients=10, max_versions=8, data_kwargs=DATA)
    weights = record.versions[0]["before"].clone()
    seen, stale_total = 0, 0
    for t, v in enumerate(record.versions):
        batch = record.uploads[seen : seen + v["count"]]
        seen += v["count"]
        fresh = [u["delta"] for u in batch if u["base_version"] == t]
        assert fresh  # a round aggregates only with fresh updates
        mean = sum(fresh) / len(fresh)
        ratios = [0.0 if u["base_version"] == t else
                  float(((u["delta"] - mean) ** 2).sum()) / ((len(fresh) + 1) ** 2 * float((mean ** 2).sum()))
                  for u in batch]  # fmt: skip
        top = max(ratios)
        q = [1.0 if u["base_version"] == t else
             0.65 / (t - u["base_version"] + 1) + 0.35 * (1 - math.exp(-r / top) / 2.0)
             for u, r in zip(batch, ratios)]  # fmt: skip
        stale_total += sum(u["base_version"] != t for u in batch)
        weights = weights + sum(qi * u["delta"] for qi, u in zip(q, batch)) / sum(q)
        assert torch.allclose(v["after"], weights, rtol=1e-5, atol=1e-6), t
    assert stale_total > 0  # stragglers' late updates were aggregated
    assert trainer.simulator.cancelled == 0  # stragglers are never cancelled


def test_refl_learns_availability_from_drops_and_round_starts(tmp_path):
    algo = REFL(clients_per_round=3, deadline=30.0, prohibit_reselect=1)
    trainer = run(tmp_path, algo, num_clients=8, max_versions=12, data_kwargs=DATA,
                  availability=MarkovOnOff(mean_on=150.0, mean_off=100.0))  # fmt: skip
    p = algo.scheduler.predictor
    assert p.ends.sum() > 0 and trainer.simulator.dropped["offline"] > 0  # it saw jobs lost to devices leaving
    rates = [p.rate(c) for c in range(8) if p.exposure[c] > 0 and p.ends[c] > 0]
    assert rates and 1 / 600 < float(np.median(rates)) < 1 / 30  # near the true 1/150 per second
    quiet = REFL(clients_per_round=3, deadline=30.0)
    run(tmp_path / "always", quiet, num_clients=8, max_versions=3, data_kwargs=DATA)
    assert quiet.scheduler.predictor.ends.sum() == 0  # always available: nothing predicted to leave


def test_refl_scheduler_feeds_lost_jobs_to_the_predictor_and_passes_over_recent_devices(tmp_path):
    rounds = DeadlineRounds(2, deadline=30.0, predictor=SessionPredictor())
    rounds.predictor.reset(3)
    rounds.predictor.observe(0.0, np.ones(3, bool))
    job = lambda c: ClientJob(0, c, 0, 0.0, JobTiming(0, 1, 0), seed=0, local_epochs=1)  # noqa: E731
    sim = type("Sim", (), {"now": 40.0})()
    rounds.on_drop(sim, job(1), "offline")  # the server saw client 1's connection drop at 40 s
    rounds.on_drop(sim, job(2), "crash")  # a crash says nothing about availability
    assert rounds.predictor.ends.tolist() == [0, 1, 0] and rounds.predictor.exposure.tolist() == [0, 40.0, 0]

    class LoggedRounds(DeadlineRounds):
        def _start_round(self, sim):
            before = sim.busy.copy()
            super()._start_round(sim)
            self.chosen.append(set(np.flatnonzero(sim.busy & ~before).tolist()))

    algo = REFL(clients_per_round=3, deadline=1e6, prohibit_reselect=2)  # every job ends within its round
    algo.scheduler = sched = LoggedRounds(3, 1e6, RandomSelection(), None, prohibit_reselect=2)
    sched.chosen = []
    run(tmp_path, algo, num_clients=10, max_versions=8, data_kwargs=DATA)
    assert len(sched.chosen) >= 8 and all(len(c) == 3 for c in sched.chosen)
    for r in range(2, len(sched.chosen)):  # 4 others were always available: the last two rounds' devices rest
        assert not sched.chosen[r] & (sched.chosen[r - 1] | sched.chosen[r - 2]), r
