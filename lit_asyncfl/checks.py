"""Argument checks shared by the public constructors: each error names the parameter, the value and what is allowed."""

from __future__ import annotations

from typing import Any


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition``.

    Example:
        >>> check(1 > 0, "never raised")
    """
    if not condition:
        raise ValueError(message)


def check_int(name: str, value: Any, minimum: int, optional: bool = False) -> None:
    """Require an integer count ``>= minimum`` (or ``None`` when ``optional``); booleans are not counts.

    Example:
        >>> check_int("eval_every", 2.5, 1)
        Traceback (most recent call last):
        ...
        ValueError: eval_every must be an integer >= 1, got 2.5
    """
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    check(value >= minimum, f"{name} must be >= {minimum}, got {value}")
