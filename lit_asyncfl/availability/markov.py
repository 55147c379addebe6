"""Devices that switch on and off as a two-state Markov process in virtual time."""

from __future__ import annotations

import numpy as np

from lit_asyncfl.availability.base import Availability
from lit_asyncfl.checks import check_number

#: Durations drawn at a time from a device's stream (blocks keep a timeline's prefix independent of its length).
DURATION_BLOCK = 256


class MarkovOnOff(Availability):
    r"""Each device alternates online and offline periods of exponential lengths (a continuous-time two-state
    Markov chain), with means :math:`\mu^{on}_i` and :math:`\mu^{off}_i` of its own.

    The per-device means are the given means times independent log-normal factors of mean 1 (log standard deviation
    ``spread``; ``0``: every device alike). A device starts in its stationary state (online with probability
    :math:`\mu^{on}_i / (\mu^{on}_i + \mu^{off}_i)`), which is also the long-run fraction of time it is online. A
    device going offline drops its job in flight.

    Args:
        mean_on: Mean length of an online period, virtual seconds.
        mean_off: Mean length of an offline period, virtual seconds.
        spread: Log standard deviation of the per-device factors on both means (``>= 0``).
        crash_probability: Probability that a job crashes (see :class:`~lit_asyncfl.availability.Availability`).

    Example:
        >>> a = MarkovOnOff(mean_on=100.0, mean_off=100.0)
        >>> a.setup(1000, seed=0)
        >>> round(float(a.online(5000.0).mean()), 1)  # half of the devices online at any time
        0.5
        >>> a.stationary_fraction()
        0.5
    """

    def __init__(
        self, mean_on: float = 3600.0, mean_off: float = 3600.0, spread: float = 0.0, crash_probability: float = 0.0
    ) -> None:
        check_number("mean_on", mean_on, 0, open_min=True, unit=" virtual seconds")
        check_number("mean_off", mean_off, 0, open_min=True, unit=" virtual seconds")
        check_number("spread", spread, 0, 5)
        super().__init__(crash_probability)
        self.mean_on = mean_on
        self.mean_off = mean_off
        self.spread = spread
        self._on = np.zeros(0)
        self._off = np.zeros(0)

    def _setup(self, rng: np.random.Generator) -> None:
        shift = -0.5 * self.spread**2  # log-normal factors of mean 1
        self._on = self.mean_on * rng.lognormal(shift, self.spread, size=self.num_clients)
        self._off = self.mean_off * rng.lognormal(shift, self.spread, size=self.num_clients)

    def stationary_fraction(self) -> float:
        """The long-run fraction of devices online, :math:`\\frac1m \\sum_i \\mu^{on}_i / (\\mu^{on}_i + \\mu^{off}_i)`
        (after :meth:`setup`)."""
        return float(np.mean(self._on / (self._on + self._off)))

    def _horizon(self) -> float:
        return 8.0 * (self.mean_on + self.mean_off)

    def _timeline(self, client: int, until: float) -> tuple[bool, np.ndarray, float]:
        on, off = float(self._on[client]), float(self._off[client])
        rng = self.device_rng(client)
        initial = bool(rng.random() < on / (on + off))
        means = np.tile([on, off] if initial else [off, on], DURATION_BLOCK // 2)  # alternating periods
        times: list[np.ndarray] = []
        end = 0.0
        while end <= until:
            durations = rng.standard_exponential(DURATION_BLOCK) * means
            block = end + np.cumsum(durations)
            times.append(block)
            end = float(block[-1])
        return initial, np.concatenate(times), end
