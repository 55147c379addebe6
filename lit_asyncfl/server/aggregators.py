"""Aggregation: the generic weights :math:`p_i` of an update (a staleness function, the data size) and the
aggregators, which turn the buffered updates and their weights into the next global model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from torch import Tensor

from lit_asyncfl.checks import check, check_bool, check_choice, check_number, is_int
from lit_asyncfl.core.update import ClientUpdate
from lit_asyncfl.functional.aggregation import mix, weighted_average
from lit_asyncfl.functional.staleness import STALENESS_FUNCTIONS, staleness_weight
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server


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


class Aggregator:
    """Holds accepted updates with their weights and turns them into the next global model.

    The server calls :meth:`add` for every accepted update and aggregates when :meth:`ready` says so, or when a
    scheduler flushes (synchronous rounds end when every selected client has answered). ``buffer_size=None``
    means "only when flushed".

    Buffers (BatchNorm running statistics) are averaged, never stepped (see
    :class:`~lit_asyncfl.core.server.Server`): when :attr:`averages_models` is ``False`` the server replaces the
    buffer part of :meth:`aggregate`'s model by the weighted mean of the aggregated uploads' buffers.

    Args:
        buffer_size: Number of updates that triggers an aggregation, or ``None``.
    """

    #: Whether :meth:`aggregate` is a convex combination of models (the current one and the uploads), so that the
    #: server may apply it to the floating buffers as to the parameters. ``False``: a step rule for parameters only.
    averages_models: ClassVar[bool] = False

    def __init__(self, buffer_size: int | None = None) -> None:
        check(
            buffer_size is None or (is_int(buffer_size) and buffer_size >= 1),
            f"buffer_size must be >= 1 or None, got {buffer_size!r}",
        )
        self.buffer_size = buffer_size
        self.buffer: list[tuple[ClientUpdate, float]] = []

    def on_fit_start(self, server: Server) -> None:
        """Empty the buffer at the start of a run."""
        self.buffer = []

    def add(self, server: Server, update: ClientUpdate, weight: float) -> None:
        """Buffer an accepted update with its aggregation weight."""
        if not weight >= 0:
            raise ValueError(f"aggregation weight must be >= 0, got {weight} for client {update.client}")
        self.buffer.append((update, weight))

    def ready(self) -> bool:
        """Whether the buffer is full."""
        return self.buffer_size is not None and len(self.buffer) >= self.buffer_size

    def aggregate(self, server: Server) -> Tensor:
        """Return the new global weights from the buffered updates (the buffer is non-empty)."""
        raise NotImplementedError

    def aggregate_step(self, server: Server) -> Tensor:
        """Return the step of the aggregation, ``aggregate(server) - server.weights`` (the buffer is non-empty).

        The server asks for the step rather than the model when server callbacks transform it (a server optimizer).
        Aggregators that move the model by a sum of client deltas override it to return that sum as computed:
        rebuilding it as ``(w + step) - w`` in float32 rounds it to the spacing of ``w``'s values, an error
        that an adaptive step (FADAS's AMSGrad divides by the step's own scale) turns into a large one.
        """
        return self.aggregate(server) - server.weights

    def on_aggregated(self, server: Server, updates: list[ClientUpdate]) -> None:
        """Called once the server has applied the model :meth:`aggregate` returned (never when it refused a
        non-finite one): commit here any state learned from the buffer, so that a refused step teaches nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Buffered updates and weights."""
        return {"buffer": [(u.state_dict(), w) for u, w in self.buffer]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
        self.buffer = [(ClientUpdate.from_state_dict(u), float(w)) for u, w in state["buffer"]]


class Mixing(Aggregator):
    r"""Immediate asynchronous mixing (FedAsync, FedASMU, FedADT).

    .. math:: w_{t+1} = (1 - \alpha_t) w_t + \alpha_t w_i, \quad \alpha_t = \min(1, \alpha \cdot p_i)

    where :math:`p_i` is the weight computed by the server callbacks (e.g. a staleness function).

    Args:
        alpha: Base mixing weight :math:`\alpha \in (0, 1]`.

    Example:
        >>> Mixing(alpha=0.6).buffer_size
        1
    """

    averages_models = True

    def __init__(self, alpha: float = 0.6) -> None:
        check_number("alpha", alpha, 0, 1, open_min=True)
        super().__init__(buffer_size=1)
        self.alpha = alpha

    def aggregate(self, server: Server) -> Tensor:
        weights = server.weights
        for update, weight in self.buffer:
            weights = mix(weights, update.weights, min(1.0, self.alpha * weight))
        return weights


class ModelAverage(Aggregator):
    r"""Weighted average of client models (FedAvg).

    .. math:: w_{t+1} = \sum_i \frac{p_i}{\sum_j p_j} w_i

    With :class:`DataSizeWeight`, :math:`p_i = n_i`. Synchronous schedulers flush it
    at the end of each round.

    Args:
        buffer_size: Aggregate after this many updates, or ``None`` to wait for a flush.
    """

    averages_models = True

    def aggregate(self, server: Server) -> Tensor:
        return weighted_average([u.weights for u, _ in self.buffer], [w for _, w in self.buffer])


class DeltaAverage(Aggregator):
    r"""Buffered average of client deltas applied with a server learning rate (FedBuff).

    .. math:: w_{t+1} = w_t + \eta_g \frac{1}{K} \sum_{i=1}^{K} p_i \Delta_i, \quad \Delta_i = w_i - w_{o_i}

    With ``normalize=True`` the sum is divided by :math:`\sum_i p_i` instead of :math:`K`.

    Args:
        buffer_size: Number of updates ``K`` per aggregation.
        server_lr: Server learning rate :math:`\eta_g > 0`.
        normalize: Divide by the sum of weights instead of the number of updates.

    Example:
        >>> DeltaAverage(buffer_size=10, server_lr=1.0).buffer_size
        10
    """

    def __init__(self, buffer_size: int | None = 10, server_lr: float = 1.0, normalize: bool = False) -> None:
        super().__init__(buffer_size)
        check_number("server_lr", server_lr, 0, open_min=True)
        check_bool("normalize", normalize)
        self.server_lr = server_lr
        self.normalize = normalize

    def aggregate(self, server: Server) -> Tensor:
        return self._accumulate(server.weights.clone())

    def aggregate_step(self, server: Server) -> Tensor:
        return self._accumulate(server.weights.new_zeros(server.weights.shape))

    def _accumulate(self, out: Tensor) -> Tensor:
        r"""Add :math:`\eta_g \frac{1}{K} \sum_i p_i \Delta_i` to ``out`` in place."""
        total = sum(w for _, w in self.buffer) if self.normalize else len(self.buffer)
        if total > 0:
            for update, weight in self.buffer:
                out.add_(update.delta, alpha=self.server_lr * weight / total)
        return out
