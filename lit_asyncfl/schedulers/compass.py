"""The Compass scheduler (FedCompass, Li et al., ICLR 2024): per-client numbers of local steps so that groups of
clients arrive together, each group aggregated on its last arrival or at its latest arrival time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.checks import check_int, check_number, check_ordered
from lit_asyncfl.functional.compass import join_steps, new_group_steps, speed_estimate
from lit_asyncfl.schedulers.base import Scheduler

# Defaults (FedCompass's), which its preset repeats by name.
Q_MIN = 20
Q_MAX = 100
SPEED_MOMENTUM = 0.9
LATEST_TIME_FACTOR = 1.5

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.schedulers.view import SchedulerView
    from lit_asyncfl.server.grouped import GroupedDeltaStep

#: Key of the late updates waiting for the next group aggregation (APPFL's "general buffer").
GENERAL = "general"
#: Key of an update aggregated alone at once (a client's first arrival, before it belongs to a group).
SINGLE = "single"


class CompassScheduler(Scheduler):
    r"""Every client trains from the start, :math:`Q_{max}` local steps; the server learns each client's time per
    step :math:`\hat v_i` from the jobs it sees (:func:`~lit_asyncfl.functional.compass.speed_estimate`, the
    elapsed virtual time from dispatch to arrival over the job's steps) and gives every new job its own number of
    local steps (``sim.dispatch(client, local_steps=Q_i)``) so that clients of an *arrival group* reach the
    server together:

    * a client's first update is aggregated alone at once (it belongs to no group yet);
    * a client joins the open group whose expected arrival it can reach with the most steps within
      :math:`[Q_{min}, Q_{max}]` (:func:`~lit_asyncfl.functional.compass.join_steps`), else opens a new group
      (:func:`~lit_asyncfl.functional.compass.new_group_steps`) expected at :math:`now + Q_i \hat v_i`, latest at
      :math:`now + \lambda Q_i \hat v_i`;
    * an update arriving by its group's latest time waits; the group is aggregated (with the late updates
      buffered since) when its last member arrives or at its latest time, and its arrived members get the new
      model, fastest first, each with a new group and number of steps;
    * an update arriving after its group's latest time is buffered for the next group aggregation and its
      client restarts at once from the current model.

    Needs the :class:`~lit_asyncfl.server.grouped.GroupedDeltaStep` aggregator (refused at fit start otherwise).
    With devices that come and go, a client offline when it should restart restarts when it is back (a new
    group); a dropped member leaves its group (a group left with only arrived members is aggregated at once).
    Everything above is checkpointed.

    Args:
        q_min: :math:`Q_{min}`, fewest local steps of a job.
        q_max: :math:`Q_{max}`, most local steps of a job (and the first jobs' steps).
        speed_momentum: :math:`m` of the speed estimate.
        latest_time_factor: :math:`\lambda \ge 1`.

    Example:
        >>> s = CompassScheduler(q_min=20, q_max=100)
        >>> s.q_min, s.q_max, s.latest_time_factor
        (20, 100, 1.5)
    """

    def __init__(
        self,
        q_min: int = Q_MIN,
        q_max: int = Q_MAX,
        speed_momentum: float = SPEED_MOMENTUM,
        latest_time_factor: float = LATEST_TIME_FACTOR,
    ) -> None:
        check_int("q_min", q_min, 1)
        check_int("q_max", q_max, 1)
        check_ordered("q_min", q_min, "q_max", q_max)
        check_number("speed_momentum", speed_momentum, 0, 1, open_min=True)
        check_number("latest_time_factor", latest_time_factor, 1)
        self.q_min, self.q_max = int(q_min), int(q_max)
        self.speed_momentum = speed_momentum
        self.latest_time_factor = latest_time_factor
        self._reset()

    def _reset(self) -> None:
        self.speed: dict[int, float] = {}
        self.steps: dict[int, int] = {}
        self.group_of: dict[int, int] = {}
        self.groups: dict[int, dict[str, Any]] = {}
        self.next_group = 0
        self.owed: set[int] = set()  # clients to restart once they are back online
        self.routes: dict[int, str] = {}  # job id -> where its update went (set on arrival, read on update)

    # -- set-up -------------------------------------------------------------------------------------------------
    def on_fit_start(self, sim: SchedulerView) -> None:
        from lit_asyncfl.server.grouped import GroupedDeltaStep

        if not isinstance(sim.server.aggregator, GroupedDeltaStep):
            raise ValueError(
                "CompassScheduler aggregates arrival groups and needs the GroupedDeltaStep aggregator, got "
                f"{type(sim.server.aggregator).__name__}; use the FedCompass preset or aggregator=GroupedDeltaStep()"
            )
        if sim.local_epochs != 1:  # (the steps it assigns replace the epochs; refused rather than ignored)
            raise ValueError(
                f"CompassScheduler gives every job its own number of local steps (q_min={self.q_min} to "
                f"q_max={self.q_max}); local_epochs={sim.local_epochs} would be ignored: leave local_epochs at 1 and "
                "set q_min and q_max (in local steps)"
            )
        self._reset()
        for client in sim.idle_online():
            self._dispatch(sim, int(client), self.q_max)
        self.owed = {int(c) for c in np.flatnonzero(~sim.busy)}
        if self.owed:
            sim.wake_when_online()

    def _aggregator(self, sim: SchedulerView) -> GroupedDeltaStep:
        return sim.server.aggregator  # type: ignore[return-value]

    def _dispatch(self, sim: SchedulerView, client: int, steps: int) -> None:
        self.steps[client] = steps
        sim.dispatch(client, local_steps=steps)

    # -- arrivals -----------------------------------------------------------------------------------------------
    def on_arrival(self, sim: SchedulerView, update: ClientUpdate) -> None:
        client, job = update.client, update.job
        elapsed = sim.now - job.dispatch_time
        self.speed[client] = speed_estimate(self.speed.get(client), elapsed, job.num_steps, self.speed_momentum)
        gid = self.group_of.pop(client, None)
        if gid is None:
            key = SINGLE
        else:
            group = self.groups[gid]
            group["clients"].remove(client)
            if sim.now > group["latest"]:
                key = GENERAL
                self._close_if_empty(gid)
            else:
                key = str(gid)
                group["arrived"].append(client)
        self.routes[job.job_id] = key
        self._aggregator(sim).route(job.job_id, key)

    def on_update(self, sim: SchedulerView, job: ClientJob, aggregated: bool) -> None:
        key = self.routes.pop(job.job_id)
        self._aggregator(sim).forget(job.job_id)  # a rejected update was never held
        if key == SINGLE:
            self._aggregator(sim).release(SINGLE)
            sim.flush()
            self._restart(sim, job.client)
        elif key == GENERAL:
            self._restart(sim, job.client)
        else:
            gid = int(key)
            if not self.groups[gid]["clients"]:  # the last member: aggregate the group now
                self._aggregate_group(sim, gid)

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        gid = int(event.data["group"])
        if event.kind == "group_latest" and gid in self.groups and self.groups[gid]["arrived"]:
            self._aggregate_group(sim, gid)

    def on_drop(self, sim: SchedulerView, job: ClientJob, reason: str) -> None:
        client = job.client
        gid = self.group_of.pop(client, None)
        if gid is not None:
            group = self.groups[gid]
            group["clients"].remove(client)
            if not group["clients"] and group["arrived"]:  # nobody else to wait for
                self._aggregate_group(sim, gid)
            else:
                self._close_if_empty(gid)
        self._restart(sim, client)

    def on_online(self, sim: SchedulerView) -> None:
        online = set(sim.idle_online().tolist())
        for client in sorted(self.owed & online):
            self.owed.discard(client)
            self._restart(sim, client)
        if self.owed:
            sim.wake_when_online()

    # -- groups -------------------------------------------------------------------------------------------------
    def _aggregate_group(self, sim: SchedulerView, gid: int) -> None:
        self._aggregator(sim).release(GENERAL, str(gid), server=sim.server)
        sim.flush()
        group = self.groups[gid]
        arrived, group["arrived"] = group["arrived"], []
        group["expected"] = group["latest"] = 0.0  # closed: members still out arrive late
        self._close_if_empty(gid)
        for client in sorted(arrived, key=lambda c: (self.speed[c], c)):  # fastest first
            self._restart(sim, client)

    def _close_if_empty(self, gid: int) -> None:
        group = self.groups[gid]
        if not group["clients"] and not group["arrived"]:
            del self.groups[gid]

    def _restart(self, sim: SchedulerView, client: int) -> None:
        """Give ``client`` a group and a number of steps and send it the current model (later when offline)."""
        if not sim.availability.is_online(client, sim.now):
            self.owed.add(client)
            sim.wake_when_online()
            return
        speed = self.speed.get(client)
        if speed is None or speed <= 0:  # never seen (restarted after a drop): as at the start
            self._dispatch(sim, client, self.q_max)
            return
        steps, gid = self._join(sim, speed)
        if gid is None:
            steps = self._new_group(sim, client, speed)
        else:
            self.groups[gid]["clients"].append(client)
            self.group_of[client] = gid
        self._dispatch(sim, client, steps)

    def _join(self, sim: SchedulerView, speed: float) -> tuple[int, int | None]:
        best, chosen = -1, None
        for gid in sorted(self.groups):
            steps = join_steps(self.groups[gid]["expected"] - sim.now, speed, self.q_min, self.q_max)
            if steps is not None and steps >= best:  # the most steps; ties: the later group (as the authors')
                best, chosen = steps, gid
        return best, chosen

    def _new_group(self, sim: SchedulerView, client: int, speed: float) -> int:
        open_groups = [
            (group["latest"], min(self.speed[c] for c in [*group["clients"], *group["arrived"]]))
            for _, group in sorted(self.groups.items())
            if sim.now < group["latest"]
        ]
        steps = new_group_steps(sim.now, speed, open_groups, self.q_min, self.q_max)
        gid, self.next_group = self.next_group, self.next_group + 1
        latest = sim.now + steps * speed * self.latest_time_factor
        self.groups[gid] = {"clients": [client], "arrived": [], "expected": sim.now + steps * speed, "latest": latest}
        self.group_of[client] = gid
        sim.schedule(latest, "group_latest", group=gid)
        return steps

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "speed": {str(k): v for k, v in self.speed.items()},
            "steps": {str(k): v for k, v in self.steps.items()},
            "group_of": {str(k): v for k, v in self.group_of.items()},
            "groups": {
                str(k): {**g, "clients": list(g["clients"]), "arrived": list(g["arrived"])}
                for k, g in self.groups.items()
            },
            "next_group": self.next_group,
            "owed": sorted(self.owed),
            "routes": {str(k): v for k, v in self.routes.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.speed = {int(k): float(v) for k, v in state["speed"].items()}
        self.steps = {int(k): int(v) for k, v in state["steps"].items()}
        self.group_of = {int(k): int(v) for k, v in state["group_of"].items()}
        self.groups = {
            int(k): {"clients": [int(c) for c in g["clients"]], "arrived": [int(c) for c in g["arrived"]],
                     "expected": float(g["expected"]), "latest": float(g["latest"])}
            for k, g in state["groups"].items()
        }  # fmt: skip
        self.next_group = int(state["next_group"])
        self.owed = {int(c) for c in state["owed"]}
        self.routes = {int(k): str(v) for k, v in state["routes"].items()}
