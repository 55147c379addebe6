"""Discard updates that are too stale."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lit_asyncfl.checks import check_int
from lit_asyncfl.server.base import ServerCallback

if TYPE_CHECKING:
    from lit_asyncfl.core.server import Server
    from lit_asyncfl.core.update import ClientUpdate


class StalenessBound(ServerCallback):
    r"""Discard an update whose staleness exceeds a bound (FedASMU's :math:`\tau`, SAFA's lag tolerance).

    Discarded updates are counted in the summary's ``discarded``, apart from invalid (``rejected``) ones.

    Args:
        max_staleness: Largest accepted staleness ``t - o`` (an update with staleness ``max_staleness + 1`` is
            discarded).

    Example:
        >>> StalenessBound(max_staleness=4).max_staleness
        4
    """

    rejection_kind = "discarded"

    def __init__(self, max_staleness: int) -> None:
        check_int("max_staleness", max_staleness, 0)
        self.max_staleness = max_staleness

    def reject_update(self, server: Server, update: ClientUpdate) -> str | None:
        return "stale" if update.staleness > self.max_staleness else None
