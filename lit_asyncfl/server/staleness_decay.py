"""Pull a stale model toward the current global one before aggregating it (ASFL)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_fraction
from lit_asyncfl.functional.asfl import staleness_decayed
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate

#: The staleness decay :math:`c` by default (ASFL's 0.9), every semi-asynchronous preset's.
DECAY = 0.9


class StalenessDecay(ServerCallback):
    r"""Replace an update's model by :math:`w^*_i = c^{s_i} w_i + (1 - c^{s_i}) w_G` (ASFL Eq. 1), where
    :math:`s_i` is its staleness and :math:`w_G` the current global model.

    Args:
        decay: The decay coefficient :math:`c` (ASFL: 0.9), in ``(0, 1]``.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> from lit_asyncfl.core.update import ClientJob, ClientUpdate, JobTiming
        >>> job = ClientJob(0, 0, base_version=1, dispatch_time=0.0, timing=JobTiming(0, 1, 0), seed=0, local_epochs=1)
        >>> update = ClientUpdate(job, torch.tensor([1.0]), torch.tensor([0.0]), 5, 1, 0.1, staleness=2)
        >>> StalenessDecay(0.5).transform_update(SimpleNamespace(weights=torch.tensor([0.0])), update).weights
        tensor([0.2500])
    """

    def __init__(self, decay: float = DECAY) -> None:
        check_fraction("decay", decay, open_min=True)
        self.decay = decay

    def transform_update(self, server: Server, update: ClientUpdate) -> ClientUpdate:
        if update.staleness <= 0:
            return update
        weights = staleness_decayed(update.weights, server.weights, update.staleness, self.decay)
        return dataclasses.replace(update, weights=weights)
