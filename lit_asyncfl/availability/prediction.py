"""Availability prediction from what the server has observed (REFL's participant selection reads it)."""

from __future__ import annotations

from typing import Any

import numpy as np

from lit_asyncfl.checks import check_number
from lit_asyncfl.functional.refl import ips_priority, offline_rate, stays_online

#: The probability threshold by default, which REFL's preset repeats by name.
CONFIDENCE = 0.5


class SessionPredictor:
    r"""Predicts whether a device stays online, from its *observed* history only.

    What it sees (and nothing else): which devices are online at the moments its scheduler looks
    (:meth:`observe`, e.g. at each round start: the devices checked in), and the moment a device's job is lost
    because the device went offline (:meth:`observe_offline`: the server sees the connection drop). It never reads
    the availability model's future (timelines, next switch times).

    Model: online sessions are exponential with a per-device rate :math:`\hat\lambda_i` = sessions seen ending /
    online time observed (:func:`~lit_asyncfl.functional.refl.offline_rate`); between two looks at which a device
    was online it counts as online; a session seen ended between two looks ends, for the estimate, halfway. A
    device never seen leaving has :math:`\hat\lambda_i = 0` (predicted to stay): with always-available devices
    nothing is ever prioritized. All state is checkpointed.

    Args:
        confidence: Probability threshold :math:`c` of the predictions (see
            :func:`~lit_asyncfl.functional.refl.ips_priority`).

    Example:
        >>> p = SessionPredictor()
        >>> p.reset(2)
        >>> p.observe(0.0, np.array([True, True])); p.observe(10.0, np.array([False, True]))
        >>> p.rate(0), p.rate(1)  # device 0: one session ended after ~5 s online
        (0.2, 0.0)
    """

    def __init__(self, confidence: float = CONFIDENCE) -> None:
        check_number("confidence", confidence, 0, 1, open_min=True, open_max=True)
        self.confidence = confidence
        self.reset(0)

    def reset(self, num_clients: int) -> None:
        """Forget everything (a new run)."""
        self.ends = np.zeros(num_clients)
        self.exposure = np.zeros(num_clients)
        self.state = np.zeros(num_clients, dtype=bool)
        self.seen_at = np.full(num_clients, np.nan)

    def observe(self, now: float, online: np.ndarray) -> None:
        """The devices online at ``now`` (a boolean per device)."""
        online = np.asarray(online, dtype=bool)
        seen = ~np.isnan(self.seen_at)
        gap = np.where(seen, now - np.nan_to_num(self.seen_at), 0.0)
        stayed = seen & self.state & online
        left = seen & self.state & ~online
        self.exposure += np.where(stayed, gap, 0.0) + np.where(left, gap / 2, 0.0)
        self.ends += left
        self.state = online.copy()
        self.seen_at = np.full(len(online), float(now))

    def observe_offline(self, client: int, now: float) -> None:
        """``client`` was seen going offline at ``now`` (its job was lost)."""
        if self.state[client] and not np.isnan(self.seen_at[client]):
            self.exposure[client] += now - self.seen_at[client]
            self.ends[client] += 1
        self.state[client] = False
        self.seen_at[client] = now

    def rate(self, client: int) -> float:
        """:math:`\\hat\\lambda_i`."""
        return offline_rate(float(self.ends[client]), float(self.exposure[client]))

    def stays_online(self, client: int, horizon: float) -> float:
        """Probability that ``client``, online now, stays online for ``horizon``."""
        return stays_online(self.rate(client), horizon)

    def about_to_leave(self, client: int, window: float) -> bool:
        """IPS's priority (:func:`~lit_asyncfl.functional.refl.ips_priority`) for rounds of ``window``."""
        return ips_priority(self.rate(client), window, self.confidence)

    def state_dict(self) -> dict[str, Any]:
        return {"ends": self.ends.tolist(), "exposure": self.exposure.tolist(), "state": self.state.tolist(),
                "seen_at": self.seen_at.tolist()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ends = np.asarray(state["ends"], dtype=np.float64)
        self.exposure = np.asarray(state["exposure"], dtype=np.float64)
        self.state = np.asarray(state["state"], dtype=bool)
        self.seen_at = np.asarray(state["seen_at"], dtype=np.float64)
