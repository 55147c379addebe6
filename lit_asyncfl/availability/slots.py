"""Availability re-drawn per time slot: independent (Bernoulli) and diurnal (a sinusoid of the virtual day)."""

from __future__ import annotations

import math

import numpy as np

from lit_asyncfl.availability.base import Availability
from lit_asyncfl.checks import check, check_fraction, check_number

#: Slots drawn at a time from a device's stream (blocks keep a timeline's prefix independent of its length).
SLOT_BLOCK = 1024


class SlotAvailability(Availability):
    """Base class: time is cut into slots of ``slot`` virtual seconds; in slot ``s`` device ``i`` is online with
    probability :meth:`probability`, independently of the other slots and devices.

    Args:
        slot: Slot length in virtual seconds.
        crash_probability: Probability that a job crashes (see :class:`~lit_asyncfl.availability.Availability`).
    """

    def __init__(self, slot: float, crash_probability: float = 0.0) -> None:
        check_number("slot", slot, 0, open_min=True, unit=" virtual seconds")
        super().__init__(crash_probability)
        self.slot = slot

    def probability(self, client: int, times: np.ndarray) -> np.ndarray:
        """Device ``client``'s probability of being online in the slots whose midpoints are ``times``."""
        raise NotImplementedError

    def _horizon(self) -> float:
        return SLOT_BLOCK * self.slot

    def always_online_device(self, client: int) -> bool:
        """Whether device ``client`` is online in every slot (its probability is 1 throughout)."""
        return False

    def _timeline(self, client: int, until: float) -> tuple[bool, np.ndarray, float]:
        if self.always_online_device(client):
            return True, np.empty(0), math.inf
        blocks = max(1, math.ceil(until / (SLOT_BLOCK * self.slot)))
        rng = self.device_rng(client)
        draws = np.concatenate([rng.random(SLOT_BLOCK) for _ in range(blocks)])
        starts = np.arange(len(draws), dtype=np.float64) * self.slot
        online = draws < self.probability(client, starts + 0.5 * self.slot)
        changes = np.flatnonzero(online[1:] != online[:-1]) + 1
        return bool(online[0]), starts[changes], float(len(draws) * self.slot)


class Bernoulli(SlotAvailability):
    r"""Each device is online with probability ``p`` in every slot, independently: availability per dispatch.

    A device is looked at when a scheduler wants to dispatch it; a job, once dispatched, always finishes
    (``interrupts = False``: jobs are lost only through ``crash_probability``). The long-run fraction of devices
    online is ``p``.

    Args:
        p: Probability that a device is online in a slot, in ``(0, 1]``.
        slot: How long one draw holds, in virtual seconds (a scheduler looking again within the slot sees the same
            answer; FLGo-style per-round availability is a slot of one round's length).
        crash_probability: Probability that a job crashes (see :class:`~lit_asyncfl.availability.Availability`).

    Example:
        >>> a = Bernoulli(p=0.5, slot=10.0)
        >>> a.setup(1000, seed=0)
        >>> round(float(a.online(5.0).mean()), 1), a.next_offline(0, 5.0)
        (0.5, inf)
    """

    interrupts = False

    def __init__(self, p: float = 0.5, slot: float = 60.0, crash_probability: float = 0.0) -> None:
        check_fraction("p", p, open_min=True)
        super().__init__(slot, crash_probability)
        self.p = p

    def probability(self, client: int, times: np.ndarray) -> np.ndarray:
        return np.full(len(times), self.p)

    def always_online_device(self, client: int) -> bool:
        return self.p == 1


class Diurnal(SlotAvailability):
    r"""A daily rhythm: device :math:`i` is online in a slot with probability

    .. math:: p_i(t) = \bar p + A \sin\left(2\pi \left(\frac{t}{D} + \varphi_i\right)\right),

    at the slot's midpoint :math:`t` (FLGo's sinusoidal availability, in virtual time). The phases
    :math:`\varphi_i` are drawn uniformly from ``[0, phase_spread)`` (fractions of a day): ``0`` puts every device on
    one clock (everyone sleeps at once), ``1`` spreads them over all time zones. A device going offline drops its
    job in flight. Over whole days the fraction of time a device is online is :math:`\bar p` (the sine averages out
    when a day holds a whole number of slots).

    Args:
        mean: The mean probability :math:`\bar p`.
        amplitude: The swing :math:`A` (``mean - amplitude >= 0`` and ``mean + amplitude <= 1``).
        day: The length of a day :math:`D` in virtual seconds.
        slot: Slot length in virtual seconds (a day should hold a whole number of slots).
        phase_spread: Width of the phases' range, in days, in ``[0, 1]``.
        crash_probability: Probability that a job crashes (see :class:`~lit_asyncfl.availability.Availability`).

    Example:
        >>> a = Diurnal(mean=0.5, amplitude=0.4, day=240.0, slot=10.0, phase_spread=0.0)
        >>> a.setup(2000, seed=0)
        >>> float(a.probability(0, np.array([60.0]))[0])  # a quarter of the way through the day: the peak
        0.9
        >>> round(float(a.online(65.0).mean()), 1), round(float(a.online(185.0).mean()), 1)
        (0.9, 0.1)
    """

    def __init__(
        self,
        mean: float = 0.5,
        amplitude: float = 0.4,
        day: float = 86400.0,
        slot: float = 3600.0,
        phase_spread: float = 1.0,
        crash_probability: float = 0.0,
    ) -> None:
        check_fraction("mean", mean, open_min=True)
        check_fraction("amplitude", amplitude)
        check(
            mean - amplitude >= 0 and mean + amplitude <= 1,
            f"mean - amplitude and mean + amplitude must lie in [0, 1] (they are probabilities), got mean={mean!r}, "
            f"amplitude={amplitude!r}",
        )
        check_number("day", day, 0, open_min=True, unit=" virtual seconds")
        check_fraction("phase_spread", phase_spread)
        super().__init__(slot, crash_probability)
        check(slot <= day, f"slot must be at most day={day!r} virtual seconds, got {slot!r}")
        self.mean = mean
        self.amplitude = amplitude
        self.day = day
        self.phase_spread = phase_spread
        self._phase = np.zeros(0)

    def _setup(self, rng: np.random.Generator) -> None:
        self._phase = (
            rng.uniform(0.0, self.phase_spread, size=self.num_clients)
            if self.phase_spread
            else (np.zeros(self.num_clients))
        )

    def always_online_device(self, client: int) -> bool:
        return self.mean == 1  # (then the amplitude is 0)

    def probability(self, client: int, times: np.ndarray) -> np.ndarray:
        angle = 2.0 * np.pi * (np.asarray(times) / self.day + self._phase[client])
        return np.clip(self.mean + self.amplitude * np.sin(angle), 0.0, 1.0)
