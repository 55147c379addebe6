"""Aggregation weights: staleness functions and data size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_choice, check_number
from lit_asyncfl.functional.staleness import STALENESS_FUNCTIONS, staleness_weight
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class StalenessWeight(ServerCallback):
    r"""Multiply an update's weight by a staleness function :math:`s(t - o)`.

    Args:
        function: One of ``"constant"``, ``"polynomial"`` (:math:`(\tau+1)^{-a}`), ``"hinge"``
            (:math:`1` if :math:`\tau \le b` else :math:`1/(a(\tau-b)+1)`), ``"exponential"`` (:math:`e^{-a\tau}`).
        a: Decay parameter ``a`` of the function.
        b: Hinge point ``b`` (hinge only).

    Example:
        >>> cb = StalenessWeight("polynomial", a=0.5)
        >>> from types import SimpleNamespace
        >>> cb.weight_update(None, SimpleNamespace(staleness=3), 1.0)
        0.5
    """

    def __init__(self, function: str = "polynomial", a: float = 0.5, b: float = 4.0) -> None:
        check_choice("staleness function", function, sorted(STALENESS_FUNCTIONS))
        check_number("staleness parameter a", a, 0)
        check_number("staleness parameter b", b, 0)
        self.function, self.a, self.b = function, a, b

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        return weight * staleness_weight(self.function, update.staleness, a=self.a, b=self.b)


class DataSizeWeight(ServerCallback):
    r"""Multiply an update's weight by the client's number of samples :math:`n_i` (FedAvg's :math:`n_k / n`).

    Example:
        >>> from types import SimpleNamespace
        >>> DataSizeWeight().weight_update(None, SimpleNamespace(num_samples=30), 0.5)
        15.0
    """

    def weight_update(self, server: Server, update: ClientUpdate, weight: float) -> float:
        return weight * update.num_samples
