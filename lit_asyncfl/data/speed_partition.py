"""Partitions tied to device speed: which client holds which data depends on how slow its device is.

Both use the simulator's per-client slowness (``split_by_speed``), so a run's partition follows its device model:
:class:`RareClassOnSlowClients` (FedHist's "specific labels only on a few slow clients") and :class:`SpeedMatched`
(a base partition's shards handed to clients ordered by speed).
"""

from __future__ import annotations

import numpy as np

from lit_asyncfl.checks import check_choice, check_int
from lit_asyncfl.data.partition import Partitioner, QuantitySkew, resolve_partitioner  # noqa: F401 (example)

__all__ = ["RareClassOnSlowClients", "SpeedMatched"]


class RareClassOnSlowClients(Partitioner):
    """Some classes only on the slowest devices (FedHist's "specific labels only on a few slow clients").

    The samples of ``rare_classes`` are split evenly among the ``num_slow_clients`` slowest clients; the other
    samples are partitioned among all clients by ``base``.

    Args:
        rare_classes: Labels held only by slow clients.
        num_slow_clients: How many of the slowest clients hold them.
        base: Partition of the other samples (a name or a partitioner).
        alpha: Dirichlet concentration when ``base="dirichlet"``.

    Example:
        >>> targets = np.repeat(np.arange(4), 10)
        >>> p = RareClassOnSlowClients(rare_classes=[3], num_slow_clients=2, base="iid")
        >>> parts = p(targets, 5, np.random.default_rng(0), slowness=np.array([1.0, 5.0, 2.0, 4.0, 3.0]))
        >>> [int((targets[q] == 3).sum()) for q in parts]  # clients 1 and 3 are the slowest
        [0, 5, 0, 5, 0]
    """

    needs_slowness = True
    needs_labels = True

    def __init__(
        self,
        rare_classes: list[int] | tuple[int, ...] = (0,),
        num_slow_clients: int = 5,
        base: str | Partitioner = "dirichlet",
        alpha: float | None = None,
    ) -> None:
        check_int("num_slow_clients", num_slow_clients, 1)
        if not rare_classes:
            raise ValueError("rare_classes must name at least one label")
        self.rare_classes = [int(c) for c in rare_classes]
        self.num_slow_clients = num_slow_clients
        self.base = resolve_partitioner(base, alpha, name="base")
        if self.base.needs_slowness:
            raise ValueError("the base partition of a RareClassOnSlowClients cannot itself depend on speed")

    def split_by_speed(
        self, targets: np.ndarray, num_clients: int, rng: np.random.Generator, slowness: np.ndarray
    ) -> list[np.ndarray]:
        if self.num_slow_clients > num_clients:
            raise ValueError(f"num_slow_clients={self.num_slow_clients} exceeds num_clients={num_clients}")
        rare = np.isin(targets, self.rare_classes)
        missing = sorted(set(self.rare_classes) - set(np.unique(targets[rare]).tolist()))
        if missing:
            raise ValueError(f"rare classes {missing} do not occur in the training targets")
        common = np.flatnonzero(~rare)
        parts = [common[p] for p in self.base(targets[common], num_clients, rng)]
        slowest = np.argsort(-slowness, kind="stable")[: self.num_slow_clients]
        for client, chunk in zip(slowest, np.array_split(rng.permutation(np.flatnonzero(rare)), len(slowest))):
            parts[client] = np.concatenate([parts[client], chunk])
        return parts


class SpeedMatched(Partitioner):
    """Tie a partition to device speed: the ``base`` partition's shards are handed to clients ordered by speed.

    Shards are ranked by ``key`` — their size (``"num_samples"``) or how many samples of ``classes`` they hold
    (``"classes"``, e.g. the hard classes) — and the highest-ranked shard goes to the slowest device when
    ``slowest_get="most"`` (to the fastest with ``"least"``). The shards themselves are those of ``base``, so
    the label or quantity skew is unchanged; only who holds which shard depends on speed.

    Args:
        base: The partition whose shards are placed (a name or a partitioner that does not itself use speed).
        alpha: Dirichlet concentration when ``base="dirichlet"``.
        key: ``"num_samples"`` or ``"classes"``.
        classes: The labels counted when ``key="classes"``.
        slowest_get: ``"most"`` or ``"least"``.

    Example:
        >>> p = SpeedMatched(base=QuantitySkew(a=0.5), key="num_samples", slowest_get="most")
        >>> parts = p(np.zeros(100), 3, np.random.default_rng(0), slowness=np.array([2.0, 9.0, 1.0]))
        >>> [len(q) for q in parts][1] == max(len(q) for q in parts)  # client 1 is the slowest
        True
    """

    needs_slowness = True

    def __init__(
        self,
        base: str | Partitioner = "dirichlet",
        alpha: float | None = None,
        key: str = "num_samples",
        classes: list[int] | tuple[int, ...] = (),
        slowest_get: str = "most",
    ) -> None:
        check_choice("key", key, ("num_samples", "classes"))
        if key == "classes" and not classes:
            raise ValueError("key='classes' needs the labels to count in `classes`")
        check_choice("slowest_get", slowest_get, ("most", "least"))
        self.base = resolve_partitioner(base, alpha, name="base")
        if self.base.needs_slowness or self.base.needs_groups:
            raise ValueError(f"the base partition of a SpeedMatched must not depend on speed or groups: {self.base!r}")
        self.key = key
        self.classes = [int(c) for c in classes]
        self.slowest_get = slowest_get

    @property
    def needs_labels(self) -> bool:  # type: ignore[override]
        return self.key == "classes" or self.base.needs_labels

    def split_by_speed(
        self, targets: np.ndarray, num_clients: int, rng: np.random.Generator, slowness: np.ndarray
    ) -> list[np.ndarray]:
        shards = self.base(targets, num_clients, rng)
        if self.key == "num_samples":
            score = np.array([len(s) for s in shards], dtype=np.float64)
        else:
            score = np.array([np.isin(targets[s], self.classes).sum() for s in shards], dtype=np.float64)
        ranked = np.argsort(-score if self.slowest_get == "most" else score, kind="stable")
        slowest_first = np.argsort(-np.asarray(slowness), kind="stable")
        parts: list[np.ndarray] = [np.empty(0, np.int64)] * num_clients
        for client, shard in zip(slowest_first, ranked):
            parts[int(client)] = shards[int(shard)]
        return parts
