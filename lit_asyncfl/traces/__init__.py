"""Trace files: when real devices are online and how fast they are, read from and written to plain files.

Two kinds of trace drive a simulation with measured devices instead of drawn ones: an *availability* trace (when each
device is online; replayed by :class:`~lit_asyncfl.availability.TraceAvailability`) and a *capacity* trace (each
device's compute time per sample and bandwidth; replayed by :class:`~lit_asyncfl.devices.TraceDevices`). Both have
a plain, readable format in CSV and in JSON, and both can be imported from FedScale's pickled traces. Times are
virtual seconds, bandwidths bytes per virtual second, device ids strings. Every bad input raises a ``ValueError``
naming the file, the line (CSV) or device (JSON, pickle) and the bad value.

**Availability, CSV**: header ``device,start,end`` and optionally a 4th column ``period``; one row per active
(online) interval ``[start, end)``. A device whose ``period`` is given (the same on each of its rows) repeats its
intervals every ``period`` seconds (its intervals must end by then); an empty or absent ``period`` means no repeat:
after its last interval the device stays offline. ``end`` may be ``inf`` (online from ``start`` on). Rows of a
device need not be contiguous nor sorted; device order is that of first appearance::

    device,start,end,period
    phone-1,0,3600,86400
    phone-1,7200,9000.5,86400
    laptop,100,200,

**Availability, JSON**: the same, one object per device (``period``: a number or ``null``)::

    {"devices": [
      {"id": "phone-1", "period": 86400.0, "active": [[0, 3600], [7200, 9000.5]]},
      {"id": "laptop", "period": null, "active": [[100, 200]]}
    ]}

On load, each device's intervals are sorted and touching or overlapping ones merged (``[0, 10)`` and ``[10, 20)``
become ``[0, 20)``).

**Capacity, CSV**: header ``device,time_per_sample,bandwidth``: virtual seconds of compute per training sample
(``> 0``) and bytes per virtual second for both directions (``> 0``, ``inf``: free communication)::

    device,time_per_sample,bandwidth
    phone-1,0.486,276250.0
    laptop,0.02,inf

**Capacity, JSON**::

    {"devices": [{"id": "phone-1", "time_per_sample": 0.486, "bandwidth": 276250.0}]}

**FedScale's traces** (``benchmark/dataset/data/device_info`` of SymbioticLab/FedScale; pickles, loaded without
executing code: only dicts, lists, numbers, strings and NumPy numbers and arrays are accepted):

* ``client_behave_trace`` (:func:`load_fedscale_behave_trace`): ``{client_id: {"active": [t, ...], "inactive":
  [t, ...], "finish_time": T, "duration": ..., "model": ...}}``. FedScale's ``ClientMetadata.is_active`` takes
  ``norm_time = cur_time % finish_time`` and calls the client active iff ``active[i] <= norm_time <= inactive[i]``
  for its current interval ``i``. Imported as intervals ``[active[j], inactive[j])`` repeating with ``period =
  finish_time``. Differences: FedScale's intervals are closed, ours half-open (they differ only at the instant
  ``inactive[j]``; an interval with ``active[j] == inactive[j]``, online for one instant in FedScale, is dropped);
  FedScale advances its interval index by at most one per query, so a client queried rarely can be missed while in a
  later interval, whereas an interval here is online whenever it is queried; parts of an interval at or after
  ``finish_time`` (never reached by FedScale's ``norm_time``; its index never moves past such an interval) are
  cut off.
* ``client_device_capacity`` (:func:`load_fedscale_device_capacity`): ``{client_id: {"computation": c,
  "communication": b}}``, ``c`` the inference latency in milliseconds per sample and ``b`` the bandwidth in kbit/s.
  FedScale's ``get_completion_time`` gives ``augmentation_factor * batch_size * local_steps * c / 1000`` seconds of
  compute (``augmentation_factor`` 3.0: a backward pass costs about twice a forward one) and ``(upload_size +
  download_size) / b`` seconds of communication, with model sizes in kbit computed as ``bytes / 1024 * 8``.
  Imported as ``time_per_sample = c / 1000`` seconds and ``bandwidth = b * 1024 / 8`` bytes per second (FedScale's
  simulator counts 1024 bits to the kbit, so that ``model_bytes / bandwidth`` is exactly its communication time);
  :class:`~lit_asyncfl.devices.TraceDevices` multiplies compute by its ``augmentation_factor``.

Client ids become device ids as strings, in the pickle's key order. FedScale itself maps its (1-based) client ``c``
to the ``c % n``-th key of the availability trace, and to the capacity entry whose key *is* ``c % n`` (a default
device when there is none); the replaying classes here map (0-based) client ``i`` to the ``i % n``-th device.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "availability.csv")
    >>> _ = open(path, "w").write("device,start,end,period\\na,0,10,100\\na,10,20,100\\nb,5,7,\\n")
    >>> trace = read_availability_trace(path)
    >>> trace.devices, trace.intervals[0].tolist(), trace.period.tolist()
    (['a', 'b'], [[0.0, 20.0]], [100.0, inf])
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import math
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lit_asyncfl.checks import is_number

#: Suffixes of the plain trace formats.
PLAIN_SUFFIXES = (".csv", ".json")
#: Suffixes read as FedScale's pickled traces (its files have none: name them so).
PICKLE_SUFFIXES = (".pkl", ".pickle")
#: Kilobit per second (FedScale's ``communication``, 1024 bits to the kbit) in bytes per second.
KBIT_PER_SECOND = 1024 / 8
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


# -- files --------------------------------------------------------------------------------------------------------


def _suffix(path: Any, kind: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in PLAIN_SUFFIXES:
        loader = "load_fedscale_behave_trace" if kind == "availability" else "load_fedscale_device_capacity"
        hint = f" (FedScale's pickled traces: {loader})"
        raise ValueError(f"{path}: unknown suffix {suffix!r} for {kind} trace; allowed: {list(PLAIN_SUFFIXES)}{hint}")
    return suffix


def _read_text(path: Any) -> str:
    r"""A trace file's text (UTF-8, an optional BOM); a file that is not UTF-8 text (another encoding, a binary
    file) is a ``ValueError`` naming the file, the line and the bytes.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
        >>> _ = open(path, "wb").write(b"device,start,end\nt\xe9l\xe9phone,0,1\n")
        >>> _read_text(path)
        Traceback (most recent call last):
        ...
        ValueError: ...t.csv, line 2: not UTF-8 text (byte b'\xe9' at column 2): save the trace as UTF-8
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        line = data.count(b"\n", 0, error.start) + 1
        bad = data[error.start : error.end]
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {bad!r} at column {error.start - line_start + 1}): save the "
            "trace as UTF-8"
        ) from None
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ValueError(f"{path}, line {line}: a NUL byte: a binary file, not a text trace") from None
    return text


def _csv_rows(path: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[tuple[str, dict[str, str]]]:
    """The data rows of a CSV file as ``(where, {column: text})``, after checking its header."""
    text = _read_text(path)
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or not any(cell.strip() for cell in header):
        raise ValueError(f"{path}: the file is empty (expected the header {','.join(required)})")
    columns = [cell.strip() for cell in header]
    missing = [c for c in required if c not in columns]
    unknown = [c for c in columns if c not in required + optional]
    if missing or unknown or len(set(columns)) != len(columns):
        raise ValueError(
            f"{path}, line 1: the header must hold the columns {list(required)}"
            f"{f' and optionally {list(optional)}' if optional else ''}, each once, got {columns!r}"
        )
    rows = []
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        where = f"{path}, line {reader.line_num}"
        if len(row) != len(columns):
            raise ValueError(f"{where}: expected {len(columns)} values ({','.join(columns)}), got {row!r}")
        rows.append((where, dict(zip(columns, row))))
    return rows


def _json_devices(path: Any, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """The device objects of a JSON trace as ``(where, object)``."""
    text = _read_text(path)
    if not text.strip():
        raise ValueError(f'{path}: the file is empty (expected {{"devices": [...]}})')
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from error
    except RecursionError:
        depth, line = 0, 1
        for char in text:  # where the nesting went too deep
            line += char == "\n"
            depth += (char in "[{") - (char in "]}")
            if depth > 100:
                break
        raise ValueError(
            f"{path}, line {line}: JSON nested deeper than Python can read (more than 100 levels here; a trace needs 4)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list) or set(data) != {"devices"}:
        raise ValueError(f'{path}: a JSON {kind} trace must be an object {{"devices": [...]}}, got {_short(data)}')
    out = []
    for index, entry in enumerate(data["devices"]):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}, device {index}: expected an object, got {_short(entry)}")
        out.append((f"{path}, device {entry.get('id', index)!r}", entry))
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _keys(where: str, entry: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    missing = [k for k in required if k not in entry]
    unknown = [k for k in entry if k not in required + optional]
    if missing or unknown:
        raise ValueError(
            f"{where}: expected the keys {list(required)}"
            f"{f' and optionally {list(optional)}' if optional else ''}, got {sorted(map(str, entry))!r}"
        )


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


def _csv_cell(text: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([text])
    return out.getvalue()


def _write(path: Any, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


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


# -- FedScale's pickles -------------------------------------------------------------------------------------------

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bytearray", "bool")
#: Globals a trace pickle may name: ``(module, name) -> (module to import, attribute)``. Plain containers and
#: numbers, NumPy scalars, dtypes and arrays (for traces written from NumPy values), ``_codecs.encode`` (protocol 2
#: writes bytes with it) and Python 2's names of the builtins.
_SAFE_GLOBALS: dict[tuple[str, str], tuple[str, str]] = {
    **{("builtins", n): ("builtins", n) for n in _BUILTINS},
    **{("__builtin__", n): ("builtins", n) for n in _BUILTINS},
    ("__builtin__", "unicode"): ("builtins", "str"),
    ("__builtin__", "long"): ("builtins", "int"),
    ("collections", "OrderedDict"): ("collections", "OrderedDict"),
    ("_codecs", "encode"): ("_codecs", "encode"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    **{
        (f"numpy.{core}.{module}", name): (f"numpy.{core}.{module}", name)
        for core in ("core", "_core")
        for module, name in (("multiarray", "scalar"), ("multiarray", "_reconstruct"), ("numeric", "_frombuffer"))
    },
}


class _RefusedGlobal(ValueError):
    pass


class _TraceUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`_SAFE_GLOBALS`, so that a pickle cannot run code on load."""

    def __init__(self, file: Any, path: Any, what: str = "a FedScale trace", **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.path, self.what = path, what

    def find_class(self, module: str, name: str) -> Any:
        target = _SAFE_GLOBALS.get((module, name))
        if target is None:
            raise _RefusedGlobal(
                f"{self.path}: refused to load the global {module}.{name} from the pickle: {self.what} holds only "
                f"dicts, lists, numbers, strings and arrays (the file is not {self.what}, or is malicious)"
            )
        target_module, attribute = target
        if target_module.startswith(("numpy.core.", "numpy._core.")):  # written by NumPy 1 or 2: this NumPy's own
            core = "numpy._core." if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else "numpy.core."
            target_module = core + target_module.split(".", 2)[2]
        return getattr(importlib.import_module(target_module), attribute)


def safe_pickle_load(path: Any, what: str, encoding: str = "ASCII") -> Any:
    """Load a pickle of plain data (containers, numbers, strings, NumPy arrays) without running code: any other
    global it names is refused with a ``ValueError`` naming the file and the global (``what``: what the file
    should be, for the message).

    Example:
        >>> import os, pickle, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "batch")
        >>> _ = open(path, "wb").write(pickle.dumps({"data": [1, 2], "labels": [0, 1]}))
        >>> safe_pickle_load(path, "a CIFAR batch")
        {'data': [1, 2], 'labels': [0, 1]}
        >>> _ = open(path, "wb").write(pickle.dumps(os.getcwd))
        >>> safe_pickle_load(path, "a CIFAR batch")
        Traceback (most recent call last):
        ...
        ValueError: ...: refused to load the global posix.getcwd from the pickle: a CIFAR batch holds only ...
    """
    with open(path, "rb") as f:
        try:
            return _TraceUnpickler(f, path, what, encoding=encoding).load()
        except _RefusedGlobal as error:
            raise ValueError(str(error)) from None
        except Exception as error:
            raise ValueError(f"{path}: not a readable pickle of {what} ({type(error).__name__}: {error})") from error


def _load_pickle(path: Any, kind: str) -> dict[Any, Any]:
    with open(path, "rb") as f:
        try:
            data = _TraceUnpickler(f, path).load()
        except _RefusedGlobal:
            raise
        except Exception as error:
            raise ValueError(f"{path}: not a readable pickle ({type(error).__name__}: {error})") from error
    if not isinstance(data, dict) or not data:
        raise ValueError(
            f"{path}: FedScale's {kind} must be a non-empty dict {{client_id: {{...}}}}, got {_short(data)}"
        )
    return data


def _entry(where: str, entry: Any, keys: tuple[str, ...]) -> dict[Any, Any]:
    if not isinstance(entry, dict) or any(k not in entry for k in keys):
        raise ValueError(f"{where}: expected a dict with the keys {list(keys)}, got {_short(entry)}")
    return entry


def _times(where: str, name: str, value: Any) -> list[Any]:
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    if not isinstance(value, list | tuple):
        raise ValueError(f"{where}: {name} must be a list of times, got {_short(value)}")
    return list(value)


def load_fedscale_behave_trace(path: str | os.PathLike[str]) -> AvailabilityTrace:
    """Import FedScale's availability trace (``client_behave_trace``, a pickle), loading no code.

    Client ``k``'s intervals are ``[active[j], inactive[j])``, repeating with ``period = finish_time`` (see the
    module's notes for the differences with FedScale's ``is_active``); device ids are the client ids as strings.

    Raises:
        ValueError: for a refused global (naming it), a file that is not such a pickle, or a bad entry (naming the
            client and the value).
    """
    trace = _Availability(path)
    for key, entry in _load_pickle(path, "client_behave_trace").items():
        where = f"{path}, client {key!r}"
        entry = _entry(where, entry, ("active", "inactive", "finish_time"))
        device = str(key)
        if device in trace.periods:
            raise ValueError(f"{where}: client {device!r} appears twice")
        finish = _number(where, "finish_time", entry["finish_time"], positive=True)
        trace.device(where, device, finish)
        active = _times(where, "active", entry["active"])
        inactive = _times(where, "inactive", entry["inactive"])
        if len(active) != len(inactive):
            raise ValueError(
                f"{where}: active and inactive must have one time per interval, got {len(active)} and {len(inactive)}"
            )
        for j, (start, end) in enumerate(zip(active, inactive)):
            at = f"{where}, interval {j}"
            s, e = _number(at, "active", start), _number(at, "inactive", end)
            if e < s:
                raise ValueError(f"{at}: inactive must be >= active {s!r}, got {end!r}")
            if min(e, finish) > s:  # FedScale's norm_time never reaches finish_time; empty intervals dropped
                trace.interval(at, device, s, min(e, finish), names=("active", "inactive"))
    return trace.build()


def load_fedscale_device_capacity(path: str | os.PathLike[str]) -> CapacityTrace:
    """Import FedScale's capacity trace (``client_device_capacity``, a pickle), loading no code.

    ``computation`` (milliseconds per sample) becomes ``time_per_sample = computation / 1000`` seconds and
    ``communication`` (kbit/s, 1024 bits to the kbit as in FedScale's simulator) ``bandwidth = communication * 1024
    / 8`` bytes per second; device ids are the client ids as strings, in the pickle's order.

    Raises:
        ValueError: for a refused global (naming it), a file that is not such a pickle, or a bad entry (naming the
            client and the value).
    """
    trace = _Capacity(path)
    for key, entry in _load_pickle(path, "client_device_capacity").items():
        where = f"{path}, client {key!r}"
        entry = _entry(where, entry, ("computation", "communication"))
        computation = _number(where, "computation", entry["computation"], positive=True)
        communication = _number(where, "communication", entry["communication"], positive=True, infinite=True)
        trace.add(where, str(key), computation / 1000.0, communication * KBIT_PER_SECOND)
    return trace.build()


def file_digest(path: str | os.PathLike[str]) -> str:
    """The first 16 hex digits of a file's SHA-256: recorded in a run's fingerprint by the classes that replay a
    trace, so that a resume refuses a trace file changed under the same name.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
        >>> _ = open(path, "w").write("device,start,end\\n")
        >>> len(file_digest(path))
        16
    """
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def load_trace(path: str | os.PathLike[str], kind: str) -> AvailabilityTrace | CapacityTrace:
    """Read an ``"availability"`` or ``"capacity"`` trace by its suffix: the plain formats (``.csv``, ``.json``) or
    FedScale's pickle (``.pkl``, ``.pickle``); a missing file or another suffix raises ``ValueError`` naming it.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "t.csv")
        >>> _ = open(path, "w").write("device,start,end\\na,0,10\\n")
        >>> load_trace(path, "availability").intervals[0].tolist()
        [[0.0, 10.0]]
    """
    suffix = Path(path).suffix.lower()
    allowed = (*PLAIN_SUFFIXES, *PICKLE_SUFFIXES)
    if suffix not in allowed:
        fedscale = "client_behave_trace" if kind == "availability" else "client_device_capacity"
        article = "an" if kind == "availability" else "a"
        raise ValueError(
            f"path must be {article} {kind} trace ending in one of {list(allowed)} (FedScale's {fedscale}: give it "
            f"the suffix .pkl), got {str(path)!r}"
        )
    if not Path(path).is_file():
        raise ValueError(f"path must be an existing {kind} trace file, got {str(path)!r}")
    if kind == "availability":
        return load_fedscale_behave_trace(path) if suffix in PICKLE_SUFFIXES else read_availability_trace(path)
    return load_fedscale_device_capacity(path) if suffix in PICKLE_SUFFIXES else read_capacity_trace(path)
