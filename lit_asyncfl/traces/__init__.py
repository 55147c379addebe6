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

import os
from pathlib import Path

from lit_asyncfl.traces.fedscale import KBIT_PER_SECOND, load_fedscale_behave_trace, load_fedscale_device_capacity
from lit_asyncfl.traces.plain import (
    read_availability_trace,
    read_capacity_trace,
    write_availability_trace,
    write_capacity_trace,
)
from lit_asyncfl.traces.records import AvailabilityTrace, CapacityTrace
from lit_asyncfl.traces.safe_pickle import safe_pickle_load
from lit_asyncfl.traces.text import PICKLE_SUFFIXES, PLAIN_SUFFIXES

__all__ = [
    "KBIT_PER_SECOND",
    "PICKLE_SUFFIXES",
    "PLAIN_SUFFIXES",
    "AvailabilityTrace",
    "CapacityTrace",
    "file_digest",
    "load_fedscale_behave_trace",
    "load_fedscale_device_capacity",
    "load_trace",
    "read_availability_trace",
    "read_capacity_trace",
    "safe_pickle_load",
    "write_availability_trace",
    "write_capacity_trace",
]


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
