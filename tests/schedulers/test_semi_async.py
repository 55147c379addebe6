"""Semi-asynchronous rounds on the simulator (lit_asyncfl.schedulers.semi_async: ASFL, SAFA and the synchronous
presets): timelines, deprecation, aggregation and rewards by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lit_asyncfl.core.server import Server
from lit_asyncfl.core.simulator import SimulationObserver, Simulator
from lit_asyncfl.core.update import ClientUpdate
from lit_asyncfl.devices import DeviceProfiles
from lit_asyncfl.mobility import MobileEdgeDevices
from lit_asyncfl.rl import FixedAction
from lit_asyncfl.schedulers import DeadlineSelection, SemiAsyncRounds
from lit_asyncfl.schedulers.selection import RandomSelection
from lit_asyncfl.server import DataSizeWeight, ModelAverage, StalenessDecay


class ShiftExecutor:
    """Client ``c`` returns its start model plus ``c + 1`` (so every aggregate can be computed by hand)."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple] = {}
        self.cancelled: list[int] = []

    def submit(self, job, start):
        self.pending[job.job_id] = (job, start)

    def cancel(self, job_id):
        self.pending.pop(job_id, None)
        self.cancelled.append(job_id)

    def result(self, job_id, fresh=None):
        job, start = self.pending.pop(job_id)
        return ClientUpdate(job, start + (job.client + 1), start, 10, 1, train_loss=float(job.client + 1))


def make_sim(compute, scheduler, server_bandwidth=100.0, accuracy=0.5):
    """Devices with 10 samples, E = 1, the given compute seconds, upload 2 s (model size 1, bandwidth 0.5)."""
    n = len(compute)
    net = MobileEdgeDevices(server_bandwidth=server_bandwidth, min_bandwidth=0.5, max_bandwidth=0.5, model_size=1.0)
    profiles = DeviceProfiles(time_per_sample=np.asarray(compute, dtype=float) / 10, bandwidth=np.full(n, 5e5))
    server = Server(torch.zeros(1, dtype=torch.float64), ModelAverage(None), [StalenessDecay(0.9), DataSizeWeight()], n)
    scheduler.setup(n)
    logged: list[dict] = []

    class Recorder(SimulationObserver):
        def on_log(self, sim, metrics):
            logged.append(metrics)

    sim = Simulator(
        server, scheduler, ShiftExecutor(), net, [10] * n, 1, 10, seed=0, model_bytes=8, profiles=profiles,
        evaluator=lambda sim: {"accuracy": accuracy, "loss": 1.0}, observers=[Recorder()],
    )  # fmt: skip
    return sim, logged


def test_a_timeline_by_hand_deprecates_exactly_the_devices_beyond_tau_and_charges_their_resend():
    scheduler = SemiAsyncRounds(
        selected=4, rounds=3, max_latency=30.0, alpha_pref=0.1, beta_pref=0.5,
        controller=FixedAction(num_picked=1, lag_tolerance=1), selection=RandomSelection(),
    )  # fmt: skip
    sim, logged = make_sim([10.0, 20.0, 100.0, 300.0], scheduler)
    sim.start()
    assert sim.run() == "queue_empty"
    # round 1: all four get the model after 4 copies / 100 = 0.04 s; device 0 arrives first at 0.04 + 10 + 2
    # round 2 (from 12.04): device 0 again (0.01 s); device 1 (started round 1) arrives at 22.04 and ends it;
    #   devices 2 and 3 are then 2 versions behind > tau = 1: deprecated; device 0 (1 behind) keeps training
    # round 3 (from 22.04): device 1 selected + 2 and 3 re-sent: 3 copies, 0.03 s; device 0 arrives at 24.05
    assert [r["deprecated"] for r in logged] == [0, 2, 0]
    assert [r["distribution_latency"] for r in logged] == pytest.approx([0.04, 0.01, 0.03])
    assert [r["round_latency"] for r in logged] == pytest.approx([12.04, 10.0, 2.01])
    assert sim.cancelled == 2 + 3  # the two deprecated jobs, then the three still training after round K
    # the picked models, decayed by 0.9^staleness toward the global one: 1; 0.9*(0+2) + 0.1*1; 0.9*(1+1) + 0.1*1.9
    assert sim.server.weights.item() == pytest.approx(0.9 * 2 + 0.1 * 1.9)
    limits = [30.0 / 3, (30.0 - 12.04) / 2, 30.0 - 22.04]
    assert [r["round_limit"] for r in logged] == pytest.approx(limits)
    rewards = [0.5 * (limits[0] / 12.04) ** 0.5, 0.5 * (limits[1] / 10.0) ** 0.5, 0.5 * (limits[2] / 2.01) ** 0.1]
    assert [r["round_reward"] for r in logged] == pytest.approx(rewards)
    assert scheduler.summary()["objective"] == pytest.approx(0.5 * (30.0 / 24.05) ** 0.1)
    assert logged[-1]["objective"] == pytest.approx(0.5 * (30.0 / 24.05) ** 0.1)
    assert scheduler.summary()["rounds"] == 3


def test_arrivals_before_the_distribution_ends_count_at_its_end_and_extra_ones_wait_for_the_next_round():
    # a slow server: each copy takes 5 s, so both rounds spend 10 s sending 2 copies
    scheduler = SemiAsyncRounds(
        selected=2, rounds=2, max_latency=100.0,
        controller=FixedAction(num_picked=1, lag_tolerance=5), selection=RandomSelection(),
    )  # fmt: skip
    sim, logged = make_sim([1.0, 2.0, 3.0, 4.0], scheduler, server_bandwidth=0.2)
    sim.start()
    first = sorted(j.client for j in sim.in_flight.values())
    assert len(first) == 2
    sim.run()
    # round 1 ends at the first arrival (10 + compute + 2); round 2 starts then and sends 2 copies (10 s), so the
    # other round-1 device, arriving within those 10 s, is picked at their end: round 2 lasts exactly 10 s
    assert logged[0]["round_latency"] == pytest.approx(10.0 + 2.0 + min(first) + 1.0)
    assert logged[1]["round_latency"] == pytest.approx(10.0)


def test_safa_rounds_last_until_the_deadline_and_cache_late_arrivals_for_the_next_round():
    scheduler = SemiAsyncRounds(
        selected=3, rounds=2, max_latency=1000.0,
        controller=FixedAction(num_picked=1, lag_tolerance=2), selection=RandomSelection(), deadline=True,
    )  # fmt: skip
    sim, logged = make_sim([10.0, 20.0, 40.0], scheduler)
    sim.start()
    sim.run()
    # round 1: 3 copies (0.03 s), deadline = 0.03 + max(compute + 2) = 42.03; device 0 is picked (w = 1),
    # devices 1 and 2 are cached; round 2: only device 0 is sent the model (the cached ones are not selected again:
    # 0.01 s, deadline 42.01); the cached ones (staleness 1, decayed toward w = 1) and device 0's new model (from
    # w = 1 to 2) are averaged by data size (equal here)
    assert [r["round_latency"] for r in logged] == pytest.approx([42.03, 42.01])
    cached = [0.9 * 2 + 0.1 * 1, 0.9 * 3 + 0.1 * 1]
    assert sim.server.weights.item() == pytest.approx((cached[0] + cached[1] + 2.0) / 3)


def test_synchronous_presets_wait_for_every_selected_device():
    scheduler = SemiAsyncRounds(
        selected=2, rounds=2, max_latency=100.0,
        controller=FixedAction(num_picked=None, lag_tolerance=0), selection=DeadlineSelection(),
    )  # fmt: skip
    sim, logged = make_sim([1.0, 2.0, 30.0, 80.0], scheduler)
    sim.start()
    sim.run()
    # limit T_max / K = 50: device 3 (0.02 + 80 + 2) never fits; round latencies are the slowest selected device's
    assert all(r["deprecated"] == 0 for r in logged)
    assert [r["num_picked"] for r in logged] == [2, 2]
    assert max(r["round_latency"] for r in logged) < 50.0


def test_the_scheduler_refuses_a_device_model_without_mobility():
    from lit_asyncfl.devices import ExponentialCapability

    scheduler = SemiAsyncRounds(selected=2, rounds=2)
    sim, _ = make_sim([1.0, 2.0, 3.0], scheduler)
    sim.device_model = ExponentialCapability()
    with pytest.raises(ValueError, match="MobileEdgeDevices"):
        sim.start()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rounds": 0}, "rounds"),
        ({"max_latency": 0.0}, "max_latency"),
        ({"selected": 0}, "selected"),
        ({"alpha_pref": -1.0}, "alpha_pref"),
    ],
)
def test_bad_scheduler_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SemiAsyncRounds(**kwargs)


class RecordingAction(FixedAction):
    """A fixed action that records what it is fed back."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[tuple[float, list[float], bool]] = []

    def feedback(self, reward, next_state, done):
        self.fed.append((reward, list(next_state), done))


@pytest.mark.parametrize("reward", ["round", "objective_gain"])
def test_the_controller_learns_from_the_chosen_reward_and_the_next_state(reward):
    controller = RecordingAction(num_picked=1, lag_tolerance=1)
    scheduler = SemiAsyncRounds(
        selected=4, rounds=3, max_latency=30.0, alpha_pref=0.1, beta_pref=0.5, controller=controller,
        selection=RandomSelection(), reward=reward,
    )  # fmt: skip
    sim, logged = make_sim([10.0, 20.0, 100.0, 300.0], scheduler)  # the timeline of the first test
    sim.start()
    sim.run()
    spent = [12.04, 22.04, 24.05]
    objective_so_far = [0.5] + [0.5 * (30.0 / t) ** 0.1 for t in spent]  # O^1 = acc (nothing spent yet)
    states = [f[1] for f in controller.fed]
    assert [s[1] for s in states] == pytest.approx([t / 30.0 for t in spent])  # latency ratio
    assert [s[2] for s in states] == pytest.approx(objective_so_far[1:])
    assert [s[3] for s in states] == pytest.approx([0 / 1, 2 / 2, 2 / 3])  # mean deprecated per round
    assert [f[2] for f in controller.fed] == [False, False, True]
    if reward == "round":
        assert [f[0] for f in controller.fed] == pytest.approx([r["round_reward"] for r in logged])
    else:
        gains = np.diff(objective_so_far)
        assert [f[0] for f in controller.fed] == pytest.approx(gains.tolist())
        assert sum(f[0] for f in controller.fed) == pytest.approx(scheduler.summary()["objective"] - 0.5)
    with pytest.raises(ValueError, match="unknown reward"):
        SemiAsyncRounds(reward="accuracy")


def test_safa_runs_many_rounds_without_being_taken_for_stalled():
    # every round ends by its deadline event and aggregates cached updates processed before it: the flush is progress
    scheduler = SemiAsyncRounds(
        selected=3, rounds=40, max_latency=1000.0,
        controller=FixedAction(num_picked=1, lag_tolerance=2), selection=RandomSelection(), deadline=True,
    )  # fmt: skip
    sim, logged = make_sim([10.0, 20.0, 40.0], scheduler)
    sim.start()
    assert sim.run(max_stalled_arrivals=5) == "queue_empty"
    assert len(logged) == 40 and scheduler.summary()["objective"] is not None


def test_held_updates_are_subject_to_the_lag_tolerance_and_their_devices_are_not_selected_again():
    # a slow server (5 s per copy) makes updates arrive while a round's model is still being sent: they are held
    # for the next round. With tau = 1 whatever is still pending when a round ends (training or held) more than one
    # version behind is dropped and re-sent, so the server never aggregates a staleness above 1.
    scheduler = SemiAsyncRounds(
        selected=3, rounds=10, max_latency=1000.0,
        controller=FixedAction(num_picked=1, lag_tolerance=1), selection=RandomSelection(),
    )  # fmt: skip
    sim, logged = make_sim([1.0, 2.0, 3.0, 4.0, 40.0], scheduler, server_bandwidth=0.2)
    staleness: list[int] = []
    held_dropped: list[int] = []
    receive, dispatch, cancel = sim.server.receive, sim.dispatch, sim.cancel

    def spy_receive(update):
        aggregated = receive(update)
        staleness.append(update.staleness)
        return aggregated

    def spy_dispatch(client, timing=None):
        assert client not in {u.client for _, u in sim.waiting.values()}  # never re-sent while its update waits
        return dispatch(client, timing)

    def spy_cancel(job_id):
        if job_id in sim.waiting:
            held_dropped.append(job_id)
        return cancel(job_id)

    sim.server.receive, sim.dispatch, sim.cancel = spy_receive, spy_dispatch, spy_cancel
    sim.start()
    sim.run()
    assert len(logged) == 10
    assert held_dropped  # the scenario does hold updates past a round's end
    assert staleness and max(staleness) == 1
