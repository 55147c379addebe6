"""The FedCompass scheduler (lit_asyncfl.schedulers.compass): group joining and a whole schedule replayed by hand
from the recorded times."""

from __future__ import annotations

import math

from conftest import run

from lit_asyncfl.algorithms import FedCompass
from lit_asyncfl.devices import UniformResponse
from lit_asyncfl.schedulers.compass import CompassScheduler
from lit_asyncfl.server.base import ServerCallback

DATA = {"partition": "dirichlet"}


def test_compass_joins_the_group_reachable_with_the_most_steps_ties_the_later():
    sched = CompassScheduler(q_min=2, q_max=10)
    sim = type("Sim", (), {"now": 0.0})()
    group = lambda expected: {"clients": [5], "arrived": [], "expected": expected, "latest": 99.0}  # noqa: E731
    sched.groups = {0: group(9.0), 1: group(8.2), 2: group(10.8)}  # 9, 8 and 10 steps at 1 s per step
    assert sched._join(sim, 1.0) == (10, 2)
    sched.groups = {0: group(9.0), 1: group(8.2), 2: group(9.7)}  # 9, 8, 9: a tie, the later group
    assert sched._join(sim, 1.0) == (9, 2)
    sched.groups = {0: group(1.5), 1: group(12.0)}  # 1 < q_min, 12 > q_max: none
    assert sched._join(sim, 1.0) == (-1, None)


class LoggedCompass(CompassScheduler):
    """Records what the scheduler decided (dispatches with their group) and saw (arrivals), with the time."""

    def on_fit_start(self, sim):
        self.events: list[tuple] = []
        super().on_fit_start(sim)

    def _dispatch(self, sim, client, steps):
        super()._dispatch(sim, client, steps)
        gid = self.group_of.get(client)
        latest = None if gid is None else self.groups[gid]["latest"]
        self.events.append(("dispatch", sim.now, client, sim.next_job_id - 1, steps, gid, latest))

    def on_arrival(self, sim, update):
        super().on_arrival(sim, update)
        self.events.append(("arrival", sim.now, update.client, update.job.job_id))


class VersionTimes(ServerCallback):
    def __init__(self) -> None:
        self.versions: list[tuple[float, list[int]]] = []

    @property
    def state_key(self) -> str:
        return "test-version-times"

    def on_aggregated(self, server, updates):
        self.versions.append((server.now, [u.job.job_id for u in updates]))


def test_fedcompass_schedule_replayed_from_the_recorded_times(tmp_path):
    """The Compass rules checked against the recorded dispatch and arrival times, independently of the scheduler:
    speeds, on-time members aggregated with their group by its latest time (a timer when one is late), late updates
    buffered for a later group while their client restarts at once, members restarted fastest first."""
    m = 0.9
    algo = FedCompass(q_min=2, q_max=7, latest_time_factor=1.05, speed_momentum=m)
    algo.scheduler = sched = LoggedCompass(2, 7, m, 1.05)
    times = VersionTimes()
    algo.server_callbacks.append(times)
    devices = UniformResponse(low=10.0, high=40.0, bandwidth=2e4)  # compute drawn per job (some late), ~4 s links
    trainer = run(tmp_path, algo, num_clients=6, max_versions=30, data_kwargs=DATA, device_model=devices)
    end = trainer.simulator.now
    dispatches = {e[3]: e for e in sched.events if e[0] == "dispatch"}
    arrivals = {e[3]: e for e in sched.events if e[0] == "arrival"}
    version_of = {job: (t, jobs) for t, jobs in times.versions for job in jobs}
    speed: dict[int, float] = {}
    late = on_time_in_timer = 0
    for job_id, (_, t_arr, client, _) in sorted(arrivals.items()):
        _, t_disp, _, _, steps, gid, latest = dispatches[job_id]
        rate = (t_arr - t_disp) / steps  # the server's estimate: dispatch to arrival, download and upload included
        speed[client] = rate if client not in speed else (1 - m) * speed[client] + m * rate
        if gid is None:  # a client's first update: aggregated alone, at once
            assert version_of[job_id] == (t_arr, [job_id])
            continue
        restarts = [e for e in sched.events if e[0] == "dispatch" and e[2] == client and e[3] > job_id]
        if t_arr > latest:  # late: buffered for the next group aggregation, its client restarted at once
            late += 1
            assert restarts and restarts[0][1] == t_arr
            if job_id in version_of:
                t_v, jobs = version_of[job_id]
                assert t_v > t_arr and len(jobs) > 1
        elif latest < end:  # on time: aggregated with its group when the last member arrives or at the latest time
            t_v, jobs = version_of[job_id]
            assert t_arr <= t_v <= latest + 1e-9
            on_time_in_timer += math.isclose(t_v, latest) and t_v > t_arr
            assert restarts and restarts[0][1] == t_v
    assert late > 0 and on_time_in_timer > 0  # the run exercised late arrivals and the group timer
    assert all(math.isclose(speed[c], sched.speed[c], rel_tol=1e-9) for c in speed)
    # the members a group aggregation restarts are dispatched fastest first (as estimated at that moment)
    for t_v, jobs in times.versions:
        members = [arrivals[j][2] for j in jobs if dispatches[j][5] is not None and arrivals[j][1] <= dispatches[j][6]]
        order = [e[2] for e in sched.events if e[0] == "dispatch" and e[1] == t_v and e[2] in members]
        assert len(order) == len(members)
        assert order == sorted(members, key=lambda c: (trainer_speed_at(sched, arrivals, dispatches, c, t_v), c))


def trainer_speed_at(sched, arrivals, dispatches, client, t):
    """The speed estimate of ``client`` from its arrivals up to time ``t`` (recomputed from the recorded times)."""
    m, speed = sched.speed_momentum, None
    for job_id, (_, t_arr, c, _) in sorted(arrivals.items()):
        if c == client and t_arr <= t:
            rate = (t_arr - dispatches[job_id][1]) / dispatches[job_id][4]
            speed = rate if speed is None else (1 - m) * speed + m * rate
    return speed
