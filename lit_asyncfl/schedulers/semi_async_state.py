"""The per-run bookkeeping of :class:`~lit_asyncfl.schedulers.SemiAsyncRounds` and its checkpoint: the round in
progress (its start, action and arrivals), the totals the controller's state is built from, the devices'
positions and the mobility's random generator."""

from __future__ import annotations

from typing import Any

import numpy as np


class SemiAsyncRoundState:
    """What a semi-asynchronous run remembers between events (a mix-in of ``SemiAsyncRounds``, whose
    ``selection`` and ``controller`` are checkpointed with it)."""

    selection: Any
    controller: Any

    def _reset(self) -> None:
        self.round = 0
        self.round_start = 0.0
        self.open_time = 0.0
        self.dist_latency = 0.0
        self.action: tuple[int, int] = (0, 0)  # (M_k in effect, tau_k)
        self.state: list[float] = []  # the state the action was chosen in
        self.requested = 0  # M_k as the controller chose it (0: every device training)
        self.arrivals = 0
        self.closing = False
        self.finished = False
        self.picked_versions: list[int] = []
        self.deprecated: list[int] = []
        self.spent = 0.0
        self.deprecated_total = 0
        self.variance_total = 0.0
        self.accuracy = 0.0
        self.objective: float | None = None
        self.total_reward = 0.0
        self.positions = np.zeros((0, 2))
        self.rng = np.random.default_rng(0)
        self.deferred: tuple[list[float], float] | None = None  # (state, since): a round waiting for a device

    def state_dict(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "round_start": self.round_start,
            "open_time": self.open_time,
            "dist_latency": self.dist_latency,
            "action": list(self.action),
            "arrivals": self.arrivals,
            "requested": self.requested,
            "closing": self.closing,
            "finished": self.finished,
            "picked_versions": list(self.picked_versions),
            "state": list(self.state),
            "deprecated": list(self.deprecated),
            "spent": self.spent,
            "deprecated_total": self.deprecated_total,
            "variance_total": self.variance_total,
            "accuracy": self.accuracy,
            "objective": self.objective,
            "total_reward": self.total_reward,
            "positions": self.positions.tolist(),
            "rng": self.rng.bit_generator.state,
            "selection": self.selection.state_dict(),
            "controller": self.controller.state_dict(),
            "deferred": None if self.deferred is None else [list(self.deferred[0]), self.deferred[1]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("round", "arrivals", "deprecated_total", "requested"):
            setattr(self, key, int(state[key]))
        for key in ("round_start", "open_time", "dist_latency", "spent", "variance_total", "accuracy", "total_reward"):
            setattr(self, key, float(state[key]))
        self.action = (int(state["action"][0]), int(state["action"][1]))
        self.closing, self.finished = bool(state["closing"]), bool(state["finished"])
        self.picked_versions = [int(v) for v in state["picked_versions"]]
        self.state = [float(x) for x in state["state"]]
        self.deprecated = [int(c) for c in state["deprecated"]]
        self.objective = state["objective"]
        self.positions = np.asarray(state["positions"], dtype=np.float64)
        self.rng = np.random.default_rng()
        self.rng.bit_generator.state = state["rng"]
        self.selection.load_state_dict(state["selection"])
        self.controller.load_state_dict(state.get("controller", {}))
        deferred = state.get("deferred")
        self.deferred = None if deferred is None else ([float(x) for x in deferred[0]], float(deferred[1]))
