"""Rounds of a fixed duration whose stragglers keep training (REFL): late updates join the round they arrive in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lit_asyncfl.availability.prediction import SessionPredictor
from lit_asyncfl.checks import check_count_or_fraction, check_int, check_number
from lit_asyncfl.schedulers.base import Scheduler, resolve_count
from lit_asyncfl.schedulers.selection import Selection

if TYPE_CHECKING:
    from lit_asyncfl.core.simulator import Event
    from lit_asyncfl.core.update import ClientJob
    from lit_asyncfl.schedulers.view import SchedulerView


class AvailabilityPrioritySelection(Selection):
    r"""REFL's intelligent participant selection: the candidates a
    :class:`~lit_asyncfl.availability.prediction.SessionPredictor` expects to leave soon (online through the coming
    round of ``limit`` seconds, not through the next) first, in random order; the rest filled at random.

    Args:
        predictor: What the server learnt about the devices' availability (fed by the scheduler).

    Example:
        >>> p = SessionPredictor(); p.reset(4)
        >>> p.observe(0.0, np.ones(4, bool)); p.observe(20.0, np.array([False, True, True, True]))
        >>> p.observe(40.0, np.ones(4, bool))  # device 0 left once in ~10 s online: rate 0.1 per s
        >>> sel = AvailabilityPrioritySelection(p)
        >>> 0 in sel.select(np.arange(4), 1, np.zeros(4), 5.0, np.random.default_rng(0)).tolist()
        True
    """

    def __init__(self, predictor: SessionPredictor) -> None:
        self.predictor = predictor

    def select(
        self, candidates: np.ndarray, count: int, latency: np.ndarray, limit: float, rng: np.random.Generator
    ) -> np.ndarray:
        candidates = np.asarray(candidates)
        urgent = np.array([bool(self.predictor.about_to_leave(int(c), limit)) for c in candidates], dtype=bool)
        first = rng.permutation(candidates[urgent])
        rest = rng.permutation(candidates[~urgent])
        return np.sort(np.concatenate([first, rest])[:count]).astype(np.int64)


class DeadlineRounds(Scheduler):
    """Rounds of ``deadline`` virtual seconds: at a round's start ``clients_per_round`` idle online devices are
    selected and sent the model; at its end the server aggregates every update that arrived during it — the round's
    own (fresh) ones and those of earlier rounds' stragglers, which were never cancelled (stale) — when at least
    one fresh update is among them (else they wait for the next round), and the next round starts.

    A device that trained in one of the last ``prohibit_reselect`` rounds is passed over while enough others are
    available. A ``predictor`` is shown who is online at every round start and the devices whose jobs were lost
    because they went offline (see :class:`~lit_asyncfl.availability.prediction.SessionPredictor`); the selection
    sees each candidate's round window as ``limit``. Needs a flush-only aggregator (``buffer_size=None``).

    Args:
        clients_per_round: Devices selected per round (count, or fraction of all).
        deadline: Round duration in virtual seconds.
        selection: Who among the candidates (default: random).
        predictor: The availability predictor to feed (``None``: none).
        prohibit_reselect: Rounds during which a device that trained is passed over (0: never).

    Example:
        >>> s = DeadlineRounds(10, deadline=100.0)
        >>> s.setup(50)
        >>> s.count
        10
    """

    def __init__(
        self,
        clients_per_round: int | float = 10,
        deadline: float = 100.0,
        selection: Selection | None = None,
        predictor: SessionPredictor | None = None,
        prohibit_reselect: int = 0,
    ) -> None:
        check_count_or_fraction("clients_per_round", clients_per_round)
        check_number("deadline", deadline, 0, open_min=True, unit=" virtual seconds")
        check_int("prohibit_reselect", prohibit_reselect, 0)
        self.clients_per_round = clients_per_round
        self.deadline = deadline
        self.selection = selection if selection is not None else Selection()
        self.predictor = predictor
        self.prohibit_reselect = int(prohibit_reselect)
        self.count = 0
        self.round = 0
        self.last_run: dict[int, int] = {}
        self.rng = np.random.default_rng(0)

    def setup(self, num_clients: int) -> None:
        self.count = resolve_count("clients_per_round", self.clients_per_round, num_clients)

    def on_fit_start(self, sim: SchedulerView) -> None:
        if sim.server.aggregator.buffer_size is not None:
            raise ValueError(
                "DeadlineRounds aggregates when a round ends and needs a flush-only aggregator (buffer_size=None), "
                f"got buffer_size={sim.server.aggregator.buffer_size}"
            )
        self.round, self.last_run = 0, {}
        self.rng = np.random.default_rng([sim.seed, 0x4EF1])
        self.selection.on_fit_start(sim.num_clients)
        if self.predictor is not None:
            self.predictor.reset(sim.num_clients)
        self._start_round(sim)

    def _start_round(self, sim: SchedulerView) -> None:
        self.round += 1
        online = sim.availability.online(sim.now)
        if self.predictor is not None:
            self.predictor.observe(sim.now, online)
        idle = np.flatnonzero(~sim.busy & online)
        recent = np.array([self.round - self.last_run.get(int(c), -(10**9)) <= self.prohibit_reselect for c in idle],
                          dtype=bool)  # fmt: skip
        chosen = self.selection.select(idle[~recent], self.count, np.zeros(sim.num_clients), self.deadline, self.rng)
        short = self.count - len(chosen)
        if short > 0 and recent.any():  # not enough others: recently used devices, at random
            extra = self.rng.permutation(idle[recent])[:short]
            chosen = np.sort(np.concatenate([chosen, extra])).astype(np.int64)
        for client in chosen:
            self.last_run[int(client)] = self.round
            sim.dispatch(int(client))
        sim.schedule(sim.now + self.deadline, "round_end", round=self.round)

    def on_event(self, sim: SchedulerView, event: Event) -> None:
        if event.kind != "round_end" or event.data.get("round") != self.round:
            return
        server = sim.server
        if any(u.base_version == server.version for u, _ in server.aggregator.buffer):  # a fresh update
            sim.flush()
        self._start_round(sim)

    def on_drop(self, sim: SchedulerView, job: ClientJob, reason: str) -> None:
        if self.predictor is not None and reason == "offline":
            self.predictor.observe_offline(job.client, sim.now)

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "last_run": {str(k): v for k, v in self.last_run.items()},
            "rng": self.rng.bit_generator.state,
            "selection": self.selection.state_dict(),
            "predictor": None if self.predictor is None else self.predictor.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.last_run = {int(k): int(v) for k, v in state["last_run"].items()}
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self.selection.load_state_dict(state["selection"])
        if self.predictor is not None and state["predictor"] is not None:
            self.predictor.load_state_dict(state["predictor"])
