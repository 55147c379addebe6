"""The plain trace formats (CSV and JSON; described in :mod:`lit_asyncfl.traces`): read and written."""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

from lit_asyncfl.traces.records import (
    AvailabilityTrace,
    CapacityTrace,
    _Availability,
    _Capacity,
    _device_id,
    _number,
    _short,
)
from lit_asyncfl.traces.text import _csv_cell, _csv_rows, _json_devices, _keys, _suffix, _write


def read_availability_trace(path: str | os.PathLike[str]) -> AvailabilityTrace:
    """Read an availability trace from a ``.csv`` or ``.json`` file (formats in :mod:`lit_asyncfl.traces`).

    Raises:
        ValueError: for an unknown suffix or any bad content, naming the file, the line or device and the value.
    """
    trace = _Availability(path)
    if _suffix(path, "availability") == ".csv":
        for where, row in _csv_rows(path, ("device", "start", "end"), ("period",)):
            device = _device_id(where, row["device"])
            text = row.get("period", "").strip()
            period = math.inf if text == "" else _number(where, "period", row["period"], positive=True, infinite=True)
            trace.device(where, device, period)
            trace.interval(where, device, row["start"], row["end"])
        return trace.build()
    for where, entry in _json_devices(path, "availability"):
        _keys(where, entry, ("id", "active"), ("period",))
        device = _device_id(where, entry["id"])
        if device in trace.periods:
            raise ValueError(f"{where}: device {device!r} appears twice")
        raw = entry.get("period")
        trace.device(
            where, device, math.inf if raw is None else _number(where, "period", raw, positive=True, infinite=True)
        )
        if not isinstance(entry["active"], list):
            raise ValueError(f"{where}: active must be a list of [start, end] pairs, got {_short(entry['active'])}")
        for j, pair in enumerate(entry["active"]):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{where}, interval {j}: expected [start, end], got {_short(pair)}")
            trace.interval(f"{where}, interval {j}", device, pair[0], pair[1])
    return trace.build()


def _check_availability(trace: AvailabilityTrace, path: Any) -> None:
    """Run a trace through the reader's checks (so that a writer never writes a file its reader refuses)."""
    if not len(trace.devices) == len(trace.intervals) == len(trace.period):
        raise ValueError(
            f"{path}: the trace has {len(trace.devices)} devices, {len(trace.intervals)} interval arrays and "
            f"{len(trace.period)} periods"
        )
    check = _Availability(path)
    for device, intervals, period in zip(trace.devices, trace.intervals, trace.period):
        where = f"writing {path}, device {device!r}"
        device = _device_id(where, device)
        if device in check.periods:
            raise ValueError(f"{where}: device {device!r} appears twice")
        check.device(where, device, _number(where, "period", period, positive=True, infinite=True))
        for start, end in np.asarray(intervals, dtype=np.float64).reshape(-1, 2):
            check.interval(where, device, float(start), float(end))
    check.build()


def write_availability_trace(trace: AvailabilityTrace, path: str | os.PathLike[str]) -> None:
    """Write an availability trace as ``.csv`` or ``.json`` (read back by :func:`read_availability_trace`).

    A CSV file cannot hold a device without intervals: write JSON for such a trace.
    """
    suffix = _suffix(path, "availability")
    _check_availability(trace, path)
    if suffix == ".csv":
        lines = ["device,start,end,period"]
        for device, intervals, period in zip(trace.devices, trace.intervals, trace.period):
            if len(intervals) == 0:
                raise ValueError(f"writing {path}: device {device!r} has no interval, which a CSV file cannot hold")
            text = "" if math.isinf(period) else repr(float(period))
            lines += [
                f"{_csv_cell(device)},{float(s)!r},{float(e)!r},{text}" for s, e in np.reshape(intervals, (-1, 2))
            ]
        _write(path, "\n".join(lines) + "\n")
        return
    entries = [
        json.dumps(
            {
                "id": device,
                "period": None if math.isinf(period) else float(period),
                "active": np.asarray(intervals, dtype=np.float64).reshape(-1, 2).tolist(),
            }
        )
        for device, intervals, period in zip(trace.devices, trace.intervals, trace.period)
    ]
    _write(path, '{"devices": [\n  ' + ",\n  ".join(entries) + "\n]}\n")


def read_capacity_trace(path: str | os.PathLike[str]) -> CapacityTrace:
    """Read a capacity trace from a ``.csv`` or ``.json`` file (formats in :mod:`lit_asyncfl.traces`).

    Raises:
        ValueError: for an unknown suffix or any bad content, naming the file, the line or device and the value.
    """
    trace = _Capacity(path)
    if _suffix(path, "capacity") == ".csv":
        rows = _csv_rows(path, ("device", "time_per_sample", "bandwidth"))
    else:
        rows = _json_devices(path, "capacity")
        for where, entry in rows:
            _keys(where, entry, ("id", "time_per_sample", "bandwidth"))
        rows = [(where, {**entry, "device": entry["id"]}) for where, entry in rows]
    for where, row in rows:
        trace.add(
            where,
            _device_id(where, row["device"]),
            _number(where, "time_per_sample", row["time_per_sample"], positive=True),
            _number(where, "bandwidth", row["bandwidth"], positive=True, infinite=True),
        )
    return trace.build()


def write_capacity_trace(trace: CapacityTrace, path: str | os.PathLike[str]) -> None:
    """Write a capacity trace as ``.csv`` or ``.json`` (read back by :func:`read_capacity_trace`)."""
    suffix = _suffix(path, "capacity")
    if not len(trace.devices) == len(trace.time_per_sample) == len(trace.bandwidth):
        raise ValueError(
            f"writing {path}: the trace has {len(trace.devices)} devices, {len(trace.time_per_sample)} times per "
            f"sample and {len(trace.bandwidth)} bandwidths"
        )
    check = _Capacity(path)
    rows = []
    for device, tps, bandwidth in zip(trace.devices, trace.time_per_sample, trace.bandwidth):
        where = f"writing {path}, device {device!r}"
        row = (
            _device_id(where, device),
            _number(where, "time_per_sample", tps, positive=True),
            _number(where, "bandwidth", bandwidth, positive=True, infinite=True),
        )
        check.add(where, *row)
        rows.append(row)
    check.build()
    if suffix == ".csv":
        lines = ["device,time_per_sample,bandwidth"] + [f"{_csv_cell(d)},{t!r},{b!r}" for d, t, b in rows]
        _write(path, "\n".join(lines) + "\n")
        return
    # JSON has no infinity: Python writes (and reads) the non-standard token Infinity
    entries = [json.dumps({"id": d, "time_per_sample": t, "bandwidth": b}) for d, t, b in rows]
    _write(path, '{"devices": [\n  ' + ",\n  ".join(entries) + "\n]}\n")
