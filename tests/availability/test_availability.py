"""Devices that come and go in the simulator: availability timelines, dropped jobs, schedulers under dropouts, exact
resumes, every preset with half of its devices offline (each model's own law: test_markov.py, test_slots.py,
test_trace.py)."""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import global_weights, make_trainer

from lit_asyncfl.algorithms import PRESETS, FedADT, FedAsync, FedAvg, FedBuff, FedHist
from lit_asyncfl.availability import AlwaysAvailable, Bernoulli, Diurnal, MarkovOnOff, TraceAvailability
from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import Simulator
from lit_asyncfl.core.update import ClientUpdate
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.devices import DeviceModel
from lit_asyncfl.mobility import MobileEdgeDevices
from lit_asyncfl.models import MLP, LogisticRegression


def write_trace(tmp_path, rows, name="trace.csv") -> str:
    path = tmp_path / name
    path.write_text("device,start,end\n" + "".join(f"{d},{s},{e}\n" for d, s, e in rows))
    return str(path)


class PlusOneExecutor:
    """Every client's update is its start model plus one (no training: the schedule is what is under test)."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple] = {}

    def submit(self, job, start) -> None:
        self.pending[job.job_id] = (job, start)

    def cancel(self, job_id) -> None:
        self.pending.pop(job_id, None)

    def result(self, job_id, fresh=None) -> ClientUpdate:
        job, start = self.pending.pop(job_id)
        return ClientUpdate(job, start + 1.0, start, num_samples=20, num_steps=2, train_loss=0.0)


class RecordingSimulator(Simulator):
    """Records (virtual time, what, job id, client) for every dispatch, drop and processed arrival."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def dispatch(self, client, timing=None):
        job = super().dispatch(client, timing)
        self.log.append((self.now, "dispatch", job.job_id, job.client))
        return job

    def _lose(self, job_id, reason):  # every drop ends here
        job = super()._lose(job_id, reason)
        self.log.append((self.now, f"drop:{reason}", job_id, job.client))
        return job

    def _process(self, job, update):
        self.log.append((self.now, "arrival", job.job_id, job.client))
        super()._process(job, update)


def simulate(algorithm, availability, num_clients=3, samples=20, **kwargs) -> RecordingSimulator:
    """Jobs of ``samples`` samples take ``samples`` virtual seconds (1 s per sample, free communication)."""
    server = Server(torch.zeros(2), algorithm.aggregator, algorithm.server_callbacks, num_clients)
    algorithm.scheduler.setup(num_clients)
    sim = RecordingSimulator(
        server=server,
        scheduler=algorithm.scheduler,
        executor=PlusOneExecutor(),
        device_model=DeviceModel(time_per_sample=1.0, bandwidth=math.inf),
        num_samples=[samples] * num_clients,
        local_epochs=1,
        batch_size=10,
        seed=0,
        model_bytes=8,
        client_callbacks=algorithm.client_callbacks,
        availability=availability,
        **kwargs,
    )
    sim.start()
    return sim


def test_a_hand_built_timeline_gives_exactly_the_dispatches_drops_and_arrivals(tmp_path):
    # client 0 online [0, 100); client 1 online [0, 30) and [50, 200); client 2 online [40, 300); jobs take 20 s
    trace = write_trace(tmp_path, [("a", 0, 100), ("b", 0, 30), ("b", 50, 200), ("c", 40, 300)])
    sim = simulate(FedAsync(concurrency=3), TraceAvailability(trace))
    sim.run(max_virtual_time=55)
    assert sim.log == [
        (0.0, "dispatch", 0, 0),  # client 2 is offline: concurrency 3 is short, woken at 40
        (0.0, "dispatch", 1, 1),
        (20.0, "arrival", 0, 0),
        (20.0, "dispatch", 2, 0),  # only client 0 is idle and online
        (20.0, "arrival", 1, 1),
        (20.0, "dispatch", 3, 1),  # client 1 goes offline at 30, before this job's arrival at 40
        (30.0, "drop:offline", 3, 1),  # nobody idle is online: no refill
        (40.0, "dispatch", 4, 2),  # the wake-up: client 2 is back
        (40.0, "arrival", 2, 0),
        (40.0, "dispatch", 5, 0),
        (50.0, "dispatch", 6, 1),  # client 1 is back
    ]
    assert sim.dropped == Counter({"offline": 1}) and sim.server.version == 3
    assert set(sim.in_flight) == {4, 5, 6}
    # job 4 left at version 2 (before job 2's arrival made version 3), jobs 5 and 6 at version 3; the dropped job 3
    # (version 2) released its start model
    assert sorted(sim._snapshot_refs.elements()) == [2, 3, 3] and sorted(sim.snapshots) == [2, 3]


def test_a_crash_drops_the_job_at_a_point_drawn_over_its_duration():
    sim = simulate(FedAsync(concurrency=3), AlwaysAvailable(crash_probability=0.5))
    sim.run(max_versions=30)
    crashes = [e for e in sim.log if e[1] == "drop:crash"]
    dispatched = {e[2]: e[0] for e in sim.log if e[1] == "dispatch"}
    arrived = {e[2] for e in sim.log if e[1] == "arrival"}
    assert 10 < len(crashes) < 50 and sim.dropped["crash"] == len(crashes)  # about one job in two
    for time, _, job_id, _ in crashes:
        assert dispatched[job_id] < time < dispatched[job_id] + 20.0 and job_id not in arrived


def test_bernoulli_availability_gates_dispatches_and_never_drops_a_job():
    sim = simulate(FedAsync(concurrency=4), Bernoulli(p=0.3, slot=7.0), num_clients=12)
    sim.run(max_versions=40)
    assert sim.dropped == Counter()
    for time, what, _, client in sim.log:
        if what == "dispatch":
            assert sim.availability.is_online(client, time)
    a = Bernoulli(p=0.3, slot=1.0)
    a.setup(100, seed=0)
    assert a.online_fraction(2000.0) == pytest.approx(0.3, abs=0.01)


def test_dropped_jobs_are_never_aggregated_and_every_job_is_accounted_for(tmp_path, monkeypatch):
    processed, dropped = [], []
    original_process, original_lose = Simulator._process, Simulator._lose

    def process(self, job, update):
        processed.append(job.job_id)
        original_process(self, job, update)

    def lose(self, job_id, reason):  # every drop ends here
        dropped.append(job_id)
        return original_lose(self, job_id, reason)

    monkeypatch.setattr(Simulator, "_process", process)
    monkeypatch.setattr(Simulator, "_lose", lose)
    trainer = make_trainer(
        tmp_path, FedBuff(concurrency=5, buffer_size=3), num_clients=20, max_versions=15,
        availability=MarkovOnOff(mean_on=200.0, mean_off=200.0, crash_probability=0.1),
    )  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    sim, s = trainer.simulator, trainer.summary
    assert dropped and not set(dropped) & set(processed)
    assert s["updates_dropped"] == len(dropped) == sum(s["drop_reasons"].values()) > 0
    assert set(s["drop_reasons"]) <= {"offline", "crash"} and s["drop_reasons"]["offline"] > 0
    assert s["updates_received"] == len(processed)
    assert sim.next_job_id == len(processed) + len(dropped) + len(sim.in_flight) + len(sim.waiting)
    assert 0.3 < s["mean_online_fraction"] < 0.7
    rows = trainer.history
    assert all(0 <= r["num_online"] <= 20 for r in rows) and len({r["num_online"] for r in rows}) > 1
    assert rows[-1]["updates_dropped"] == s["updates_dropped"]
    assert next(tmp_path.rglob("availability.png")).stat().st_size > 0
    assert "num_online" in next(tmp_path.rglob("history.csv")).read_text().splitlines()[0]


def test_rounds_end_when_members_drop_and_a_round_deadline_closes_late_rounds():
    sim = simulate(FedAvg(clients_per_round=4), MarkovOnOff(mean_on=30.0, mean_off=30.0), num_clients=8)
    sim.run(max_versions=10, max_virtual_time=1e5)
    assert sim.server.version == 10 and sim.dropped["offline"] > 0  # no round waits for a member that left
    # a deadline of 12 s: jobs of 20 s never make it, so every round is closed by its deadline with nothing to
    # aggregate; jobs of 10 s always do
    late = simulate(FedAvg(clients_per_round=2, round_deadline=12.0), AlwaysAvailable(), num_clients=4)
    late.run(max_virtual_time=100)
    assert late.server.version == 0 and late.dropped["deadline"] == 2 * 8  # rounds at 0, 12, ..., 96
    assert [e[0] for e in late.log if e[1] == "drop:deadline"][::2] == [12.0 * k for k in range(1, 9)]
    fast = simulate(FedAvg(clients_per_round=2, round_deadline=12.0), AlwaysAvailable(), num_clients=4, samples=10)
    fast.run(max_virtual_time=100)
    assert fast.server.version == 10 and not fast.dropped


def test_schedulers_wait_for_a_device_when_none_is_online(tmp_path):
    trace = write_trace(tmp_path, [("a", 50, 1000), ("b", 70, 1000)])
    for algorithm in (FedAsync(concurrency=2), FedAvg(clients_per_round=2), FedHist(k=1)):
        sim = simulate(algorithm, TraceAvailability(trace), num_clients=2)
        sim.run(max_versions=3)
        dispatches = [(t, c) for t, what, _, c in sim.log if what == "dispatch"]
        assert dispatches[0] == (50.0, 0), type(algorithm).__name__  # nobody at 0: the first device back at 50
        assert sim.server.version == 3


def test_semi_asynchronous_rounds_wait_for_a_device_and_count_the_wait(tmp_path):
    from lit_asyncfl.algorithms import ASFL
    from lit_asyncfl.rl.controllers import FixedAction

    trace = write_trace(tmp_path, [("a", 500, 1e7)])  # nobody online before 500
    trainer = make_trainer(
        tmp_path, ASFL(selected=2, rounds=3, max_latency=1e5, controller=FixedAction(1, 2)), num_clients=4,
        device_model=MobileEdgeDevices(), max_versions=3, availability=TraceAvailability(trace), eval_every=1,
    )  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    s = trainer.summary
    assert s["rounds"] == 3 and s["versions"] == 3 and not s["updates_dropped"]
    assert s["total_latency"] == pytest.approx(trainer.simulator.now) and s["total_latency"] > 500  # the wait counts


# the schedules (clients, versions, dispatch and arrival times) of today's runs, recorded before availability
# existed: AlwaysAvailable must leave every one unchanged
SCHEDULES_BEFORE_AVAILABILITY = {
    "FedAsync": "f91c600532d773de",
    "FedBuff": "8aa612ebcdf38ee8",
    "FedAvg": "d95b4e8be09d6652",
    "FedHist": "91512e4426c36942",
    "FedADT": "491ac11d0f086709",
}


@pytest.mark.parametrize(
    "algorithm",
    [
        FedAsync(concurrency=3),
        FedBuff(concurrency=4, buffer_size=2),
        FedAvg(clients_per_round=3),
        FedHist(k=3),
        FedADT(),
    ],
    ids=lambda a: type(a).__name__,
)
def test_always_available_leaves_the_schedule_of_every_run_unchanged(tmp_path, monkeypatch, algorithm):
    log = []
    original = Simulator._process

    def record(self, job, update):
        log.append((job.job_id, job.client, job.base_version, repr(job.dispatch_time), repr(job.arrival_time)))
        return original(self, job, update)

    monkeypatch.setattr(Simulator, "_process", record)
    trainer = make_trainer(tmp_path, algorithm, num_clients=12, max_versions=6, eval_every=3, seed=5)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    digest = hashlib.sha256(repr(log).encode()).hexdigest()[:16]
    assert digest == SCHEDULES_BEFORE_AVAILABILITY[type(algorithm).__name__]


def test_always_available_gives_the_weights_of_a_run_without_the_argument(tmp_path):
    runs = []
    for i, availability in enumerate((None, AlwaysAvailable())):
        trainer = make_trainer(tmp_path / str(i), FedAsync(concurrency=3), max_versions=6, availability=availability)
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        runs.append(trainer)
    assert torch.equal(global_weights(runs[0]), global_weights(runs[1]))
    assert "mean_online_fraction" in runs[0].summary and runs[0].summary["mean_online_fraction"] == 1.0
    assert not list(tmp_path.rglob("availability.png"))  # nothing to plot when every device is always there


def availability_models(tmp_path):
    trace = write_trace(tmp_path, [("a", 0, 300), ("a", 500, 2000), ("b", 100, 900), ("c", 0, 5000)])
    return {
        "always+crash": AlwaysAvailable(crash_probability=0.2),
        "bernoulli": Bernoulli(p=0.5, slot=50.0),
        "markov": MarkovOnOff(mean_on=300.0, mean_off=300.0, spread=0.5),
        "diurnal": Diurnal(mean=0.5, amplitude=0.4, day=2000.0, slot=100.0),
        "trace": TraceAvailability(trace),
    }


@pytest.mark.parametrize("name", ["always+crash", "bernoulli", "markov", "diurnal", "trace"])
def test_every_availability_model_is_deterministic_and_resumes_exactly(tmp_path, name):
    def fit(directory, ckpt_path=None, **budget):
        budget.setdefault("max_versions", 12)
        trainer = make_trainer(
            tmp_path / directory, FedBuff(concurrency=4, buffer_size=2), num_clients=9,
            availability=availability_models(tmp_path)[name], **budget,
        )  # fmt: skip
        trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=ckpt_path)
        return trainer

    full, again = fit("full"), fit("again")
    assert torch.equal(global_weights(full), global_weights(again))
    assert full.summary["drop_reasons"] == again.summary["drop_reasons"]
    assert name == "bernoulli" or full.summary["updates_dropped"] > 0
    first = fit("first", max_virtual_time=0.45 * full.simulator.now)
    assert 0 < first.simulator.server.version < 12
    resumed = fit("resumed", ckpt_path=str(next((tmp_path / "first").rglob("last.ckpt"))))
    assert torch.equal(global_weights(resumed), global_weights(full))
    assert resumed.summary["drop_reasons"] == full.summary["drop_reasons"]

    def rows(trainer):
        return [{k: v for k, v in r.items() if k != "wall_time"} for r in trainer.history]

    assert rows(resumed) == rows(full)


def test_a_resume_with_another_availability_is_refused(tmp_path):
    first = make_trainer(tmp_path / "a", FedAsync(concurrency=2), max_versions=3, availability=MarkovOnOff(2000, 2000))
    first.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    other = make_trainer(tmp_path / "b", FedAsync(concurrency=2), max_versions=6, availability=MarkovOnOff(2000, 1000))
    with pytest.raises(ValueError, match="availability"):
        other.fit(
            LogisticRegression(input_dim=64), datamodule=DigitsDataModule(),
            ckpt_path=str(next((tmp_path / "a").rglob("last.ckpt"))),
        )  # fmt: skip


#: Presets whose defaults do not fit this test's 16 clients and short on-periods. FedCompass's jobs are 20-100 local
#: steps (its authors' defaults, counted in steps), about 2-8 epochs here: nearly every job outlasts a 200 s on-period
#: (all dropped, the run stops as "stalled", saying so); with 2-4 steps its jobs are as long as the others'. FedSA and
#: PORT buffer more arrivals (30, 15) than 16 clients give them; MOON needs a model with a hidden layer.
SMALL = {
    "fedcompass": {"q_min": 2, "q_max": 4},
    "fedsa": {"buffer_size": 4},
    "port": {"buffer_size": 2},
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_completes_with_half_of_the_devices_offline_and_reports_its_dropouts(tmp_path, name):
    algorithm = PRESETS[name](**SMALL.get(name, {}))
    semi = type(algorithm.scheduler).__name__ == "SemiAsyncRounds"
    trainer = make_trainer(
        tmp_path, algorithm, num_clients=16, max_versions=8, max_virtual_time=1e6, eval_every=4,
        availability=MarkovOnOff(mean_on=200.0, mean_off=200.0, crash_probability=0.05),
        device_model=MobileEdgeDevices() if semi else None,
    )  # fmt: skip
    model = MLP(input_dim=64, hidden_dims=(16,)) if name == "moon" else LogisticRegression(input_dim=64)
    trainer.fit(model, datamodule=DigitsDataModule())
    s = trainer.summary
    assert s["versions"] == 8 and s["stop_reason"] == "max_versions"
    assert s["updates_dropped"] > 0 and s["updates_dropped"] == sum(s["drop_reasons"].values())
    assert 0.25 < s["mean_online_fraction"] < 0.75


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: MarkovOnOff(mean_on=0), "mean_on must be"),
        (lambda: MarkovOnOff(mean_off=float("inf")), "mean_off must be"),
        (lambda: MarkovOnOff(spread=-1), "spread must be"),
        (lambda: Bernoulli(p=0), "p must be"),
        (lambda: Bernoulli(slot=float("nan")), "slot must be"),
        (lambda: Diurnal(mean=0.8, amplitude=0.3), "mean - amplitude and mean \\+ amplitude"),
        (lambda: Diurnal(day=10, slot=20), "slot must be at most day"),
        (lambda: AlwaysAvailable(crash_probability=1.0), "crash_probability must be"),
        (lambda: TraceAvailability("/nonexistent/trace.csv"), "existing availability trace"),
    ],
)
def test_bad_availability_settings_are_refused_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_trainer_refuses_an_availability_that_is_not_one():
    with pytest.raises(ValueError, match="availability must be an Availability"):
        make_trainer("unused", FedAsync(), max_versions=1, availability="markov")


def test_a_checkpoint_written_before_availability_existed_resumes_with_every_device_available(tmp_path):
    first = make_trainer(tmp_path / "a", FedAsync(concurrency=2), max_versions=3)
    first.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    path = next((tmp_path / "a").rglob("last.ckpt"))
    checkpoint = torch.load(path, weights_only=True)
    del checkpoint["lit_asyncfl"]["fingerprint"]["availability"]  # as an earlier version wrote it
    checkpoint["lit_asyncfl"].pop("checksum", None)
    from lit_asyncfl import checkpoint as ckpt

    ckpt.save(checkpoint, path)
    resumed = make_trainer(tmp_path / "b", FedAsync(concurrency=2), max_versions=6)
    resumed.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=str(path))
    assert resumed.summary["versions"] == 6
    other = make_trainer(tmp_path / "c", FedAsync(concurrency=2), max_versions=6, availability=Bernoulli(p=0.5))
    with pytest.raises(ValueError, match=r"availability: checkpoint .*AlwaysAvailable"):
        other.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule(), ckpt_path=str(path))


def test_a_fedasmu_job_lost_after_its_request_is_never_computed_and_teaches_nothing(tmp_path, monkeypatch):
    from lit_asyncfl.algorithms import FedASMU
    from lit_asyncfl.client.time_slots import TimeSlotSelector

    rewarded, lost_after_request, original_reward, original_lose = [], [], TimeSlotSelector.reward, Simulator._lose

    def reward(self, job_id, value):
        rewarded.append(job_id)
        return original_reward(self, job_id, value)

    def lose(self, job_id, reason):
        job = self.in_flight[job_id]
        if job.request_step is not None and not math.isnan(job.arrival_time):  # its request has happened
            lost_after_request.append(job_id)
        return original_lose(self, job_id, reason)

    monkeypatch.setattr(TimeSlotSelector, "reward", reward)
    monkeypatch.setattr(Simulator, "_lose", lose)
    trainer = make_trainer(
        tmp_path, FedASMU(period=5.0, clients_per_trigger=4, max_parallel=0.5), num_clients=16, max_versions=40,
        availability=MarkovOnOff(mean_on=60.0, mean_off=60.0),
    )  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
    assert lost_after_request and rewarded  # both happen in this run
    assert not set(lost_after_request) & set(rewarded)  # a lost job never rewarded the shared slot policy


def test_answers_do_not_depend_on_how_far_a_timeline_was_drawn_before(tmp_path):
    trace = write_trace(tmp_path, [("a", 0, 4), ("b", 2, 9)])
    path = tmp_path / "periodic.csv"
    path.write_text("device,start,end,period\na,0,4,10\nb,0,10,10\nc,3,6,10\n")  # b: online the whole period
    makers = [
        lambda: MarkovOnOff(mean_on=5.0, mean_off=3.0, spread=0.5),
        lambda: Bernoulli(p=0.4, slot=2.0),
        lambda: Diurnal(mean=0.5, amplitude=0.3, day=40.0, slot=2.0),
        lambda: TraceAvailability(trace),
        lambda: TraceAvailability(str(path)),
    ]
    rng = np.random.default_rng(0)
    for make in makers:
        times = rng.uniform(0, 3000, size=60)
        ahead = make()
        ahead.setup(3, seed=7)
        ahead.is_online(0, 9000.0), ahead.next_offline(1, 5000.0)  # draw some timelines far ahead first
        answers = []
        for model in (ahead, make()):
            if model is not ahead:
                model.setup(3, seed=7)
            answers.append(
                [
                    (model.is_online(c, t), model.next_offline(c, t), model.next_online([c], t))
                    for t in times
                    for c in range(3)
                ]
            )
        assert answers[0] == answers[1], repr(ahead)
    periodic = TraceAvailability(str(path))
    periodic.setup(3, seed=0)
    assert periodic.next_offline(1, 0.0) == math.inf and periodic.online_fraction(1e4) == pytest.approx(
        (0.4 + 1 + 0.3) / 3
    )


def test_models_that_never_switch_answer_at_once():
    for model in (Bernoulli(p=1.0, slot=1.0), Diurnal(mean=1.0, amplitude=0.0, day=10.0, slot=1.0)):
        model.setup(4, seed=0)
        assert model.online(5.0).all() and model.next_online([0], 1e9) == 1e9 and model.online_fraction(1e9) == 1.0


def test_a_scheduler_cannot_take_the_simulators_own_event_names():
    sim = simulate(FedAsync(concurrency=1), AlwaysAvailable())
    with pytest.raises(ValueError, match="event kind 'drop' is the simulator's own"):
        sim.schedule(1.0, "drop", job_id=0)
