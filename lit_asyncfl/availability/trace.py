"""Availability replayed from a trace of per-device active intervals (a plain CSV/JSON file or FedScale's pickle)."""

from __future__ import annotations

import math

import numpy as np

from lit_asyncfl.availability.base import Availability
from lit_asyncfl.checks import check, check_number, check_path
from lit_asyncfl.traces import AvailabilityTrace, file_digest, load_trace


class TraceAvailability(Availability):
    """Devices online exactly during the active intervals of a trace.

    Client ``i`` replays trace device ``i % n`` (``n`` devices in the trace, in file order), so a small trace can
    drive a large federation. A device whose trace has a period repeats its intervals every period (FedScale's
    traces wrap around their ``finish_time``); without one it stays offline after its last interval. A device going
    offline drops its job in flight. The file formats are described in :mod:`lit_asyncfl.traces`.

    A periodic device is answered arithmetically from its one period (time modulo the period): memory and time per
    question do not grow with the virtual time reached, however small the period.

    Args:
        path: An availability trace: ``.csv`` or ``.json`` in this library's format, or ``.pkl``/``.pickle``, FedScale's
            ``client_behave_trace`` (loaded without executing code).
        time_scale: Multiplies every time of the trace (e.g. ``1/60`` replays a trace written in seconds with one
            virtual second per minute).
        crash_probability: Probability that a job crashes (see :class:`~lit_asyncfl.availability.Availability`).

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "trace.csv")
        >>> _ = open(path, "w").write("device,start,end\\na,0,10\\na,20,30\\nb,5,15\\n")
        >>> a = TraceAvailability(path)
        >>> a.setup(3, seed=0)  # client 2 replays device a again
        >>> a.online(7.0).tolist(), a.online(17.0).tolist(), a.next_offline(0, 25.0)
        ([True, True, True], [False, False, False], 30.0)
    """

    def __init__(self, path: str, time_scale: float = 1.0, crash_probability: float = 0.0) -> None:
        check_path("path", path)
        check_number("time_scale", time_scale, 0, open_min=True)
        super().__init__(crash_probability)
        self.path = str(path)
        self.time_scale = time_scale
        trace = load_trace(path, "availability")
        assert isinstance(trace, AvailabilityTrace)
        check(len(trace.devices) > 0, f"the availability trace {path!r} holds no device")
        self._intervals = [np.asarray(iv, dtype=np.float64).reshape(-1, 2) * time_scale for iv in trace.intervals]
        self._period = np.asarray(trace.period, dtype=np.float64) * time_scale
        self._num_devices = len(trace.devices)
        #: The trace file's digest (:func:`~lit_asyncfl.traces.file_digest`), in the run's fingerprint.
        self.content_sha256 = file_digest(path)
        ends = [float(iv[-1, 1]) for iv in self._intervals if len(iv) and math.isfinite(iv[-1, 1])]
        self._search = max([1.0, *ends])  # every switch of a non-periodic device lies within the search
        self._cycles = [self._cycle(device) for device in range(self._num_devices)]

    def _horizon(self) -> float:
        return self._search

    def _cycle(self, device: int) -> tuple[bool, float, np.ndarray, np.ndarray] | None:
        """A periodic device's one period: whether it is online at time 0, the period, the switch offsets of the
        first period and of every later one (``None``: not periodic, or never switching)."""
        intervals, period = self._intervals[device], float(self._period[device])
        if math.isinf(period) or len(intervals) == 0 or (intervals[0, 0] <= 0 and intervals[-1, 1] >= period
                                                         and len(intervals) == 1):  # fmt: skip
            return None
        initial = bool(intervals[0, 0] <= 0)
        flat = intervals.ravel()
        touching = initial and intervals[-1, 1] >= period  # the last interval runs into the next period's first
        later = flat[1:-1] if touching else flat
        first = later if touching else (flat[1:] if initial else flat)
        return initial, period, first, later

    def setup(self, num_clients: int, seed: int) -> None:
        super().setup(num_clients, seed)
        for client in range(num_clients):
            cycle = self._cycles[client % self._num_devices]
            if cycle is not None:
                self._initial[client] = cycle[0]

    def _locate(self, client: int, time: float) -> tuple[int, float, float]:
        cycle = self._cycles[client % self._num_devices]
        if cycle is None:
            return super()._locate(client, time)
        _, period, first, later = cycle
        k0 = max(math.floor(time / period), 0) if math.isfinite(time) else 0
        lo = max(k0 - 1, 0)
        count = 0 if lo == 0 else len(first) + (lo - 1) * len(later)
        following = math.inf
        for k in range(lo, k0 + 3):  # the periods around ``time`` (float rounding of time / period)
            switches = (first if k == 0 else later) + k * period  # as the switch times were always computed
            n = int(np.searchsorted(switches, time, side="right"))
            count += n
            if n < len(switches) and following == math.inf:
                following = float(switches[n])
        return count, following, math.inf

    def online_time(self, client: int, end: float) -> float:
        cycle = self._cycles[client % self._num_devices]
        if cycle is None:
            return super().online_time(client, end)
        intervals, period = self._intervals[client % self._num_devices], cycle[1]
        full = max(math.floor(end / period), 0)
        rest = end - full * period
        partial = np.clip(np.minimum(intervals[:, 1], rest) - intervals[:, 0], 0.0, None).sum()
        return float(full * (intervals[:, 1] - intervals[:, 0]).sum() + partial)

    def online_counts(self, times: np.ndarray) -> np.ndarray:
        times = np.asarray(times, dtype=np.float64)
        counts = np.zeros(len(times), dtype=np.int64)
        for client in range(self._num_clients):
            cycle = self._cycles[client % self._num_devices]
            if cycle is None:  # (as every model: its few switches, all drawn)
                switches = self._ensure(client, float(times.max()) if len(times) else 0.0)
                count = np.searchsorted(switches, times, side="right")
                counts += (count % 2 == 1) != bool(self._initial[client])
                continue
            intervals, period = self._intervals[client % self._num_devices], cycle[1]
            phase = times - np.floor(times / period) * period
            index = np.searchsorted(intervals[:, 0], phase, side="right") - 1
            counts += (index >= 0) & (phase < intervals[np.maximum(index, 0), 1])
        return counts

    def _timeline(self, client: int, until: float) -> tuple[bool, np.ndarray, float]:
        device = client % self._num_devices
        intervals, period = self._intervals[device], float(self._period[device])
        if len(intervals) == 0:
            return False, np.empty(0), math.inf
        if len(intervals) == 1 and intervals[0, 0] <= 0 and intervals[0, 1] >= period:  # online all along
            return True, np.empty(0), math.inf
        if math.isinf(period):
            repeats, covered = 1, math.inf
        else:
            repeats = math.ceil(until / period) + 2
            covered = (repeats - 1) * period  # the last period's end may still merge with the next one's start
        shifts = np.repeat(np.arange(repeats) * (0.0 if math.isinf(period) else period), len(intervals))
        starts = np.tile(intervals[:, 0], repeats) + shifts
        ends = np.tile(intervals[:, 1], repeats) + shifts
        touching = np.flatnonzero(ends[:-1] >= starts[1:])  # an interval running into the next period's first
        starts, ends = np.delete(starts, touching + 1), np.delete(ends, touching)
        switches = np.column_stack([starts, ends]).ravel()
        initial = bool(switches[0] <= 0.0)
        return initial, switches[1:] if initial else switches, covered
