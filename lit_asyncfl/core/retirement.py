"""Clients retired for good by a client callback (e.g. local DP's budget spent): seen by the simulator and its
scheduler as devices offline for good."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from lit_asyncfl.availability import Availability
    from lit_asyncfl.client_callbacks.base import ClientCallback


def retired_clients(callbacks: Sequence[ClientCallback]) -> np.ndarray | None:
    """The clients any of ``callbacks`` retired (a bool per client), ``None`` before the callbacks' fit start.

    Example:
        >>> retired_clients([]) is None
        True
    """
    masks = [cb.retired for cb in callbacks if cb.retired is not None]
    if not masks:
        return None
    return np.logical_or.reduce(masks) if len(masks) > 1 else masks[0]


class RetiredOffline:
    """An availability in which the clients that client callbacks retired (:attr:`ClientCallback.retired
    <lit_asyncfl.client_callbacks.base.ClientCallback.retired>`) are offline for good: every scheduler, whichever
    way it looks for clients (``idle_online``, ``sample_idle``, ``availability.online``/``is_online``), then leaves
    them alone, as it does a device that went away (and the rows' ``num_online``, read from :meth:`online`, counts
    them as offline). Everything else is the wrapped availability's.

    Args:
        availability: The run's availability.
        callbacks: The client callbacks that retire clients.

    Example:
        >>> from lit_asyncfl.availability import AlwaysAvailable
        >>> from lit_asyncfl.client_callbacks.base import ClientCallback
        >>> gate = ClientCallback()
        >>> gate.retired = np.array([False, True, False])
        >>> inner = AlwaysAvailable()
        >>> inner.setup(3, seed=0)
        >>> view = RetiredOffline(inner, [gate])
        >>> view.online(0.0).tolist(), view.is_online(1, 0.0), view.next_online(np.array([1]), 0.0)
        ([True, False, True], False, inf)
    """

    def __init__(self, availability: Availability, callbacks: Sequence[ClientCallback]) -> None:
        self.inner = availability
        self.callbacks = list(callbacks)

    @property
    def always_online(self) -> bool:
        """``False``: clients may retire, so every question must be asked (never shortcut as always online)."""
        return False

    def online(self, time: float) -> np.ndarray:
        online = self.inner.online(time)
        retired = retired_clients(self.callbacks)
        return online if retired is None else online & ~retired

    def is_online(self, client: int, time: float) -> bool:
        retired = retired_clients(self.callbacks)
        return not (retired is not None and retired[client]) and self.inner.is_online(client, time)

    def next_online(self, clients: np.ndarray, time: float) -> float:
        clients = np.asarray(clients, dtype=np.int64)
        retired = retired_clients(self.callbacks)
        return self.inner.next_online(clients if retired is None else clients[~retired[clients]], time)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found on self: ``inner`` itself before __init__ set it (copy and pickle build
        # the object without __init__, then look up __setstate__/__deepcopy__), and the dunder protocol names the
        # wrapper does not forward, raise as on any object instead of recursing
        if name == "inner" or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self.inner, name)
