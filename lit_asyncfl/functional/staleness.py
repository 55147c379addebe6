r"""Staleness functions :math:`s(\tau)` of FedAsync (Xie et al., 2019) and related work.

Each maps the staleness :math:`\tau = t - o \ge 0` of an update (current global version ``t`` minus the version
``o`` the client started from) to a factor in ``(0, 1]``. They are pure functions of plain numbers so that every
algorithm composes the same formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable


def _check_staleness(staleness: float) -> None:
    if staleness < 0:
        raise ValueError(f"staleness must be >= 0, got {staleness}")


def constant_staleness(staleness: float, a: float = 0.5, b: float = 4.0) -> float:
    r"""Constant staleness function :math:`s(\tau) = 1`.

    Example:
        >>> constant_staleness(7)
        1.0
    """
    _check_staleness(staleness)
    return 1.0


def polynomial_staleness(staleness: float, a: float = 0.5, b: float = 4.0) -> float:
    r"""Polynomial staleness function :math:`s_a(\tau) = (\tau + 1)^{-a}`.

    With ``a = 0.5`` this is FedBuff's :math:`1/\sqrt{1 + \tau}` weighting.

    Example:
        >>> polynomial_staleness(3, a=0.5)
        0.5
    """
    _check_staleness(staleness)
    return float((staleness + 1.0) ** (-a))


def hinge_staleness(staleness: float, a: float = 10.0, b: float = 4.0) -> float:
    r"""Hinge staleness function of FedAsync.

    .. math:: s_{a,b}(\tau) = 1 \text{ if } \tau \le b \text{ else } \frac{1}{a (\tau - b) + 1}

    Example:
        >>> hinge_staleness(4, a=10, b=4), hinge_staleness(6, a=10, b=4)
        (1.0, 0.047619047619047616)
    """
    _check_staleness(staleness)
    if staleness <= b:
        return 1.0
    return 1.0 / (a * (staleness - b) + 1.0)


def exponential_staleness(staleness: float, a: float = 0.5, b: float = 4.0) -> float:
    r"""Exponential staleness function :math:`s_a(\tau) = e^{-a \tau}`.

    Example:
        >>> round(exponential_staleness(2, a=0.5), 6)
        0.367879
    """
    _check_staleness(staleness)
    return math.exp(-a * staleness)


STALENESS_FUNCTIONS: dict[str, Callable[..., float]] = {
    "constant": constant_staleness,
    "polynomial": polynomial_staleness,
    "hinge": hinge_staleness,
    "exponential": exponential_staleness,
}


def staleness_weight(name: str, staleness: float, a: float, b: float) -> float:
    """Evaluate the staleness function called ``name`` (one of :data:`STALENESS_FUNCTIONS`).

    Example:
        >>> staleness_weight("polynomial", 8, a=0.5, b=0)
        0.3333333333333333
    """
    try:
        fn = STALENESS_FUNCTIONS[name]
    except KeyError:
        raise ValueError(f"unknown staleness function {name!r}; allowed: {sorted(STALENESS_FUNCTIONS)}") from None
    return fn(staleness, a=a, b=b)
