"""Argument checks shared by the public constructors: each error names the parameter, the value and what is allowed.

Every check raises a ``ValueError`` (also for a value of the wrong type, so that a caller, e.g. the command line,
has one kind of error to report) whose message reads ``<name> must be <what is allowed>, got <value!r>``. A
constructor checks each of its own settings once, in one line, before it builds anything.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable
from typing import Any


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``.

    Example:
        >>> check(1 > 0, "never raised")
    """
    if not condition:
        raise ValueError(message)


def check_hooks_run(module_name: str, hooks: list[str], engine: str) -> None:
    """Refuse Lightning training-loop hooks ``hooks`` a module overrides under an engine that does not run them
    (every engine but ``"lightning"``, which gives each client job a real ``lightning.Trainer``).

    Example:
        >>> check_hooks_run("M", [], "fast")
        >>> check_hooks_run("M", ["setup"], "lightning")
        >>> check_hooks_run("M", ["setup"], "fast")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: M overrides ['setup'], which engine='fast' does not run (...); use engine='lightning' (...)
    """
    if hooks and engine != "lightning":
        raise ValueError(
            f"{module_name} overrides {hooks}, which engine={engine!r} does not run (it calls training_step, "
            "configure_optimizers and the optimizer only); use engine='lightning' (a real lightning.Trainer "
            "per client job)"
        )


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy) and not a boolean.

    Example:
        >>> is_int(3), is_int(3.0), is_int(True)
        (True, False, False)
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or NumPy, possibly non-finite) and not a boolean.

    Example:
        >>> is_number(0.5), is_number(float("nan")), is_number("0.5"), is_number(False)
        (True, True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(name: str, value: Any, minimum: int, optional: bool = False, maximum: int | None = None) -> None:
    """Require an integer count ``>= minimum`` (and ``<= maximum`` if given; ``None`` too when ``optional``);
    booleans are not counts.

    Example:
        >>> check_int("eval_every", 2.5, 1)
        Traceback (most recent call last):
        ...
        ValueError: eval_every must be an integer >= 1, got 2.5
        >>> check_int("num_slots", 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: num_slots must be >= 1, got 0
    """
    if optional and value is None:
        return
    allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if not is_int(value):
        raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")
    check(minimum <= value and (maximum is None or value <= maximum), f"{name} must be {allowed}, got {value!r}")


def _range_text(minimum: float | None, maximum: float | None, open_min: bool, open_max: bool) -> str:
    """``"> 0"``, ``"<= 1"``, ``"in (0, 1]"`` or ``""`` for the bounds of :func:`check_number`."""
    if minimum is not None and maximum is not None:
        return f"in {'(' if open_min else '['}{minimum}, {maximum}{')' if open_max else ']'}"
    if minimum is not None:
        return f"{'>' if open_min else '>='} {minimum}"
    if maximum is not None:
        return f"{'<' if open_max else '<='} {maximum}"
    return ""


def check_number(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    open_min: bool = False,
    open_max: bool = False,
    optional: bool = False,
    finite: bool = True,
    unit: str = "",
) -> None:
    """Require a real number (not a boolean, not NaN, finite unless ``finite=False``) within the given bounds.

    Args:
        name: The parameter's name, as the caller wrote it.
        value: The value given.
        minimum: Lower bound (``None``: none).
        maximum: Upper bound (``None``: none).
        open_min: Exclude ``minimum`` itself (``> minimum``).
        open_max: Exclude ``maximum`` itself (``< maximum``).
        optional: Also accept ``None``.
        finite: Refuse infinities (``False``: ``inf`` is a meaningful value, e.g. a free communication link).
        unit: Appended to the allowed range in the message (e.g. ``" virtual seconds"``).

    Raises:
        ValueError: naming the parameter, the allowed range and the value.

    Example:
        >>> check_number("lr", 0.1, 0, open_min=True)
        >>> check_number("lambda0", float("nan"), 0, open_min=True)
        Traceback (most recent call last):
        ...
        ValueError: lambda0 must be a finite number > 0, got nan
        >>> check_number("alpha", 1.5, 0, 1, open_min=True)
        Traceback (most recent call last):
        ...
        ValueError: alpha must be in (0, 1], got 1.5
    """
    if optional and value is None:
        return
    allowed = _range_text(minimum, maximum, open_min, open_max) + unit
    kind = "a finite number" if finite else "a number"
    if not is_number(value) or math.isnan(value) or (finite and math.isinf(value)):
        none = " or None" if optional else ""
        raise ValueError(f"{name} must be {kind}{' ' + allowed if allowed else ''}{none}, got {value!r}")
    low_ok = minimum is None or (value > minimum if open_min else value >= minimum)
    high_ok = maximum is None or (value < maximum if open_max else value <= maximum)
    check(low_ok and high_ok, f"{name} must be {allowed}, got {value!r}")


def check_finite(name: str, value: Any, optional: bool = False) -> None:
    """Require a finite real number, of any sign.

    Example:
        >>> check_finite("iota0", -2.0)
        >>> check_finite("iota0", float("inf"))
        Traceback (most recent call last):
        ...
        ValueError: iota0 must be a finite number, got inf
    """
    check_number(name, value, optional=optional)


def check_fraction(
    name: str, value: Any, open_min: bool = False, open_max: bool = False, optional: bool = False
) -> None:
    """Require a number in ``[0, 1]`` (either end excluded with ``open_min`` / ``open_max``): a probability or a share.

    Example:
        >>> check_fraction("epsilon", 0.1)
        >>> check_fraction("data_fraction", 1.0, open_min=True, open_max=True)
        Traceback (most recent call last):
        ...
        ValueError: data_fraction must be in (0, 1), got 1.0
    """
    check_number(name, value, 0, 1, open_min=open_min, open_max=open_max, optional=optional)


def check_bool(name: str, value: Any, optional: bool = False) -> None:
    """Require ``True`` or ``False`` (or ``None`` when ``optional``); truthy strings and numbers are refused.

    Example:
        >>> check_bool("egs", "no")
        Traceback (most recent call last):
        ...
        ValueError: egs must be True or False, got 'no'
    """
    if optional and value is None:
        return
    check(isinstance(value, bool), f"{name} must be True or False{' or None' if optional else ''}, got {value!r}")


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> None:
    """Require one of ``allowed``.

    Example:
        >>> check_choice("mode", "max", ("max", "min"))
        >>> check_choice("mode", "best", ("max", "min"))
        Traceback (most recent call last):
        ...
        ValueError: unknown mode 'best'; allowed: ['max', 'min']
    """
    choices = list(allowed)
    check(
        isinstance(value, str | int | float | type(None)) and value in choices,
        f"unknown {name} {value!r}; allowed: {choices}",
    )


def check_str(name: str, value: Any, optional: bool = False) -> None:
    """Require a non-empty string (e.g. a path or a metric name), or ``None`` when ``optional``.

    Example:
        >>> check_str("root", 3)
        Traceback (most recent call last):
        ...
        ValueError: root must be a non-empty string, got 3
    """
    if optional and value is None:
        return
    none = " or None" if optional else ""
    check(isinstance(value, str) and value != "", f"{name} must be a non-empty string{none}, got {value!r}")


def check_path(name: str, value: Any, optional: bool = False) -> None:
    """Require a path: a non-empty string or an ``os.PathLike`` (or ``None`` when ``optional``).

    Example:
        >>> from pathlib import Path
        >>> check_path("root", Path("data"))
        >>> check_path("root", 3)
        Traceback (most recent call last):
        ...
        ValueError: root must be a path (a non-empty string or a PathLike), got 3
    """
    if optional and value is None:
        return
    none = " or None" if optional else ""
    ok = isinstance(value, os.PathLike) or (isinstance(value, str) and value != "")
    check(ok, f"{name} must be a path (a non-empty string or a PathLike){none}, got {value!r}")


def check_count_or_fraction(name: str, value: Any) -> None:
    """Require a count of clients (an integer ``>= 1``) or a fraction of them (a float in ``(0, 1]``).

    Example:
        >>> check_count_or_fraction("concurrency", 0.1)
        >>> check_count_or_fraction("concurrency", 2.5)
        Traceback (most recent call last):
        ...
        ValueError: concurrency as a fraction must be in (0, 1], got 2.5; pass an int for a count
    """
    if is_int(value):
        check(value >= 1, f"{name} must be >= 1, got {value!r}")
        return
    check(
        is_number(value) and not math.isnan(value),
        f"{name} must be a count (int >= 1) or a fraction (float in (0, 1]), got {value!r}",
    )
    check(0 < value <= 1, f"{name} as a fraction must be in (0, 1], got {value!r}; pass an int for a count")


def check_ordered(low_name: str, low: float, high_name: str, high: float, strict: bool = False) -> None:
    """Require ``low <= high`` (``<`` when ``strict``) between two settings already checked on their own.

    Example:
        >>> check_ordered("weight_min", 0.8, "weight_max", 0.6)
        Traceback (most recent call last):
        ...
        ValueError: weight_min must be <= weight_max, got weight_min=0.8 > weight_max=0.6
    """
    ok = low < high if strict else low <= high
    got = f"{low_name}={low!r} {'>=' if strict else '>'} {high_name}={high!r}"
    check(ok, f"{low_name} must be {'<' if strict else '<='} {high_name}, got {got}")
