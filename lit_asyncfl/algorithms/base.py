"""An algorithm is a composition: a scheduler, server callbacks, an aggregator and client callbacks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lit_asyncfl.checks import check_str
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.schedulers.base import Scheduler
from lit_asyncfl.server.aggregators import Aggregator
from lit_asyncfl.server.base import ServerCallback


def hyperparameters(local_vars: dict[str, Any]) -> dict[str, Any]:
    """A preset's constructor arguments, from ``locals()`` taken first thing in its ``__init__``.

    Example:
        >>> def f(self, alpha=0.5):
        ...     return hyperparameters(locals())
        >>> f(None)
        {'alpha': 0.5}
    """
    return {k: v for k, v in local_vars.items() if k != "self" and not k.startswith("__")}


class Algorithm:
    """A federated algorithm assembled from shared parts.

    Presets (``FedAvg``, ``FedAsync``, ...) are subclasses whose ``__init__`` takes the paper's hyper-parameters and
    builds the parts; a custom algorithm can be written the same way, or built directly from parts in Python or
    YAML.

    Args:
        scheduler: When and whom to dispatch.
        aggregator: How buffered updates become the next global model.
        server_callbacks: Ordered hooks applied to every arriving update.
        client_callbacks: Hooks into local training.
        name: Display name (defaults to the class name).
        hparams: The preset's own hyper-parameters (recorded with the run and checked on resume).

    Example:
        >>> from lit_asyncfl.schedulers import KeepConcurrency
        >>> from lit_asyncfl.server import Mixing, StalenessBound
        >>> algo = Algorithm(KeepConcurrency(5), Mixing(alpha=0.5), [StalenessBound(10)], name="bounded-async")
        >>> algo.name
        'bounded-async'
    """

    def __init__(
        self,
        scheduler: Scheduler,
        aggregator: Aggregator,
        server_callbacks: Sequence[ServerCallback] = (),
        client_callbacks: Sequence[ClientCallback] = (),
        name: str | None = None,
        hparams: dict[str, Any] | None = None,
    ) -> None:
        check_str("name", name, optional=True)
        self.hparams = dict(hparams or {})
        self.scheduler = scheduler
        self.aggregator = aggregator
        self.server_callbacks = list(server_callbacks)
        self.client_callbacks = list(client_callbacks)
        self.name = name or type(self).__name__

    def __repr__(self) -> str:
        return f"{self.name}(scheduler={type(self.scheduler).__name__}, aggregator={type(self.aggregator).__name__})"
