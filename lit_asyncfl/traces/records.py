"""The trace records (:class:`AvailabilityTrace`, :class:`CapacityTrace`) and the checks every reader and writer runs on
their values (formats in :mod:`lit_asyncfl.traces`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lit_asyncfl.checks import is_number

_EMPTY_INTERVALS = np.empty((0, 2), dtype=np.float64)


@dataclass
class AvailabilityTrace:
    """Per-device active (online) intervals in virtual seconds.

    Args:
        devices: Device ids, in file order.
        intervals: Per device, a float64 array of shape ``(k, 2)``: sorted, non-overlapping ``[start, end)`` rows
            with ``0 <= start < end``.
        period: Per device (float64): the timeline repeats with this period (``math.inf``: it does not repeat;
            after its last interval the device stays offline).
    """

    devices: list[str]
    intervals: list[np.ndarray]
    period: np.ndarray


@dataclass
class CapacityTrace:
    """Per-device compute speed and bandwidth.

    Args:
        devices: Device ids, in file order.
        time_per_sample: Virtual seconds of compute per training sample (float64, ``> 0``).
        bandwidth: Bytes per virtual second, for download and upload (float64, ``> 0``; may be ``inf``).
    """

    devices: list[str]
    time_per_sample: np.ndarray
    bandwidth: np.ndarray


# -- values -------------------------------------------------------------------------------------------------------


def _number(where: str, name: str, value: Any, *, positive: bool = False, infinite: bool = False) -> float:
    """``value`` (a number, or a number's text) as a float ``>= 0`` (``> 0`` when ``positive``; ``inf`` allowed
    when ``infinite``), else a ``ValueError`` naming ``where``, ``name`` and the value."""
    number: float | None = None
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    elif is_number(value):
        number = float(value)
    if (
        number is None
        or math.isnan(number)
        or (math.isinf(number) and not infinite)
        or number < 0
        or (positive and number == 0)
    ):
        allowed = f"a number {'> 0' if positive else '>= 0'}{' or inf' if infinite else ''}"
        shown = value.item() if isinstance(value, np.generic) else value  # -1.0, not np.float64(-1.0)
        raise ValueError(f"{where}: {name} must be {allowed}, got {shown!r}")
    return number


def _device_id(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: the device id must be a non-empty string, got {value!r}")
    return value.strip()


def _merge(intervals: np.ndarray) -> np.ndarray:
    """Sort ``[start, end)`` rows and merge touching or overlapping ones."""
    if len(intervals) == 0:
        return _EMPTY_INTERVALS.copy()
    intervals = intervals[np.argsort(intervals[:, 0], kind="stable")]
    reach = np.maximum.accumulate(intervals[:, 1])  # furthest end so far
    first = np.concatenate([[True], intervals[1:, 0] > reach[:-1]])  # an interval that starts a merged group
    last = np.concatenate([first[1:], [True]])
    return np.column_stack([intervals[first, 0], reach[last]]).astype(np.float64)


class _Availability:
    """Collects and checks devices, periods and intervals, then builds the :class:`AvailabilityTrace`."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.periods: dict[str, tuple[float, str]] = {}  # device -> (period, where it was given)
        self.spans: dict[str, list[tuple[float, float]]] = {}

    def device(self, where: str, device: str, period: float) -> None:
        known = self.periods.get(device)
        if known is None:
            self.periods[device] = (period, where)
            self.spans[device] = []
        elif known[0] != period:
            raise ValueError(f"{where}: device {device!r} has period {period!r} here but {known[0]!r} at {known[1]}")

    def interval(
        self, where: str, device: str, start: Any, end: Any, names: tuple[str, str] = ("start", "end")
    ) -> None:
        s = _number(where, names[0], start)
        e = _number(where, names[1], end, infinite=True)
        if not e > s:
            raise ValueError(f"{where}: {names[1]} must be > {names[0]} {s!r}, got {end!r}")
        period = self.periods[device][0]
        if e > period:
            raise ValueError(f"{where}: device {device!r}: interval end {end!r} is after its period {period!r}")
        self.spans[device].append((s, e))

    def build(self) -> AvailabilityTrace:
        if not self.periods:
            raise ValueError(f"{self.path}: the availability trace holds no device")
        devices = list(self.periods)
        return AvailabilityTrace(
            devices=devices,
            intervals=[_merge(np.asarray(self.spans[d], dtype=np.float64).reshape(-1, 2)) for d in devices],
            period=np.array([self.periods[d][0] for d in devices], dtype=np.float64),
        )


class _Capacity:
    """Collects and checks per-device capacities, then builds the :class:`CapacityTrace`."""

    def __init__(self, path: Any) -> None:
        self.path = path
        self.rows: dict[str, tuple[float, float, str]] = {}

    def add(self, where: str, device: str, time_per_sample: float, bandwidth: float) -> None:
        if device in self.rows:
            raise ValueError(f"{where}: device {device!r} appears twice (first at {self.rows[device][2]})")
        self.rows[device] = (time_per_sample, bandwidth, where)

    def build(self) -> CapacityTrace:
        if not self.rows:
            raise ValueError(f"{self.path}: the capacity trace holds no device")
        rows = list(self.rows.values())
        return CapacityTrace(
            devices=list(self.rows),
            time_per_sample=np.array([r[0] for r in rows], dtype=np.float64),
            bandwidth=np.array([r[1] for r in rows], dtype=np.float64),
        )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
