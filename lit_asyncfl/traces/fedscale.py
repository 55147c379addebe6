"""FedScale's pickled traces (``client_behave_trace``, ``client_device_capacity``) imported as trace records (the
differences with FedScale's own replay are in :mod:`lit_asyncfl.traces`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from lit_asyncfl.traces.records import AvailabilityTrace, CapacityTrace, _Availability, _Capacity, _number, _short
from lit_asyncfl.traces.safe_pickle import _RefusedGlobal, _TraceUnpickler

#: Kilobit per second (FedScale's ``communication``, 1024 bits to the kbit) in bytes per second.
KBIT_PER_SECOND = 1024 / 8


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


def _entries(path: Any, kind: str, keys: tuple[str, ...]) -> Iterator[tuple[str, Any, dict[Any, Any]]]:
    """``(where, client id, entry)`` for every client of FedScale's ``kind`` pickle, each entry checked to be a dict
    with ``keys`` (``where`` names the file and the client in messages)."""
    for key, entry in _load_pickle(path, kind).items():
        where = f"{path}, client {key!r}"
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise ValueError(f"{where}: expected a dict with the keys {list(keys)}, got {_short(entry)}")
        yield where, key, entry


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
    for where, key, entry in _entries(path, "client_behave_trace", ("active", "inactive", "finish_time")):
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
    for where, key, entry in _entries(path, "client_device_capacity", ("computation", "communication")):
        computation = _number(where, "computation", entry["computation"], positive=True)
        communication = _number(where, "communication", entry["communication"], positive=True, infinite=True)
        trace.add(where, str(key), computation / 1000.0, communication * KBIT_PER_SECOND)
    return trace.build()
