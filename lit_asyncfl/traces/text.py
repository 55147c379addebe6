"""Reading and writing a plain trace file's text: its suffix, UTF-8, CSV rows and JSON device objects (formats in
:mod:`lit_asyncfl.traces`)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from lit_asyncfl.traces.records import _short

#: Suffixes of the plain trace formats.
PLAIN_SUFFIXES = (".csv", ".json")
#: Suffixes read as FedScale's pickled traces (its files have none: name them so).
PICKLE_SUFFIXES = (".pkl", ".pickle")


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


def _keys(where: str, entry: dict[str, Any], required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    missing = [k for k in required if k not in entry]
    unknown = [k for k in entry if k not in required + optional]
    if missing or unknown:
        raise ValueError(
            f"{where}: expected the keys {list(required)}"
            f"{f' and optionally {list(optional)}' if optional else ''}, got {sorted(map(str, entry))!r}"
        )


def _csv_cell(text: str) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="").writerow([text])
    return out.getvalue()


def _write(path: Any, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
