"""Partitioners: split a training set's sample indices among clients.

Every partitioner is a callable ``(targets, num_clients, rng) -> list of index arrays`` that assigns every
sample to exactly one client and leaves no client empty. :func:`partition_counts` describes the result (samples
per client and class), as saved with every run (``partition.csv``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lit_asyncfl.checks import check, check_bool, check_int, check_number


class Partitioner:
    """Base class of partitioners.

    A partitioner that places data by device speed sets ``needs_slowness = True`` and implements
    :meth:`split_by_speed`; the trainer then draws the device profiles before partitioning and passes each
    client's slowness (virtual seconds per sample). A partitioner that splits by class sets
    ``needs_labels = True`` and refuses real-valued (regression) targets. One that follows a client assignment
    given by the dataset sets ``needs_groups = True`` and implements :meth:`split_by_group`. One that reads
    per-sample columns of the training set (e.g. a writer id) sets ``needs_columns = True`` and implements
    :meth:`split_by_columns`. Every client must receive at least one sample.
    """

    needs_slowness = False
    needs_labels = False
    needs_groups = False
    needs_columns = False

    def __call__(
        self,
        targets: np.ndarray,
        num_clients: int,
        rng: np.random.Generator,
        slowness: np.ndarray | None = None,
        groups: np.ndarray | None = None,
        columns: dict[str, np.ndarray] | None = None,
    ) -> list[np.ndarray]:
        targets = np.asarray(targets)
        if num_clients < 1:
            raise ValueError(f"num_clients must be >= 1, got {num_clients}")
        if num_clients > len(targets):
            raise ValueError(
                f"cannot split {len(targets)} training samples among {num_clients} clients: "
                f"num_clients must be <= {len(targets)}"
            )
        if self.needs_labels and not np.issubdtype(targets.dtype, np.integer):
            raise ValueError(
                f"{self!r} splits by class and needs integer labels, got {targets.dtype} targets "
                f"(for regression use 'iid' or 'quantity')"
            )
        if self.needs_groups:
            if groups is None or len(groups) != len(targets):
                raise ValueError(f"{self!r} follows the dataset's own client assignment, which this dataset lacks")
            parts = self.split_by_group(np.asarray(groups), num_clients)
        elif self.needs_slowness:
            if slowness is None or len(slowness) != num_clients:
                raise ValueError(f"{self!r} places data by device speed: pass one slowness per client")
            parts = self.split_by_speed(targets, num_clients, rng, np.asarray(slowness))
        elif self.needs_columns:
            parts = self.split_by_columns(targets, training_columns(targets, columns), num_clients, rng)
        else:
            parts = self.split(targets, num_clients, rng)
        empty = [c for c, p in enumerate(parts) if len(p) == 0]
        if empty:
            raise ValueError(
                f"{self!r} leaves clients {empty[:10]} without training samples: every client needs at least one "
                f"(use fewer than num_clients={num_clients} clients, or another partition)"
            )
        return [np.sort(p).astype(np.int64) for p in parts]

    def split_by_speed(
        self, targets: np.ndarray, num_clients: int, rng: np.random.Generator, slowness: np.ndarray
    ) -> list[np.ndarray]:
        """Return one index array per client, knowing each client's slowness (for ``needs_slowness``)."""
        raise NotImplementedError

    def split_by_group(self, groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
        """Return one index array per client from each sample's client id (for ``needs_groups``)."""
        raise NotImplementedError

    def split_by_columns(
        self, targets: np.ndarray, columns: dict[str, np.ndarray], num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """Return one index array per client from the training set's per-sample ``columns`` (for
        ``needs_columns``; the labels are the column ``"label"`` unless the dataset has its own of that name)."""
        raise NotImplementedError

    def split(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Return one index array per client (validated inputs)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _fill_empty(parts: list[np.ndarray], min_samples: int) -> list[np.ndarray]:
    """Move samples from the largest clients to clients holding fewer than ``min_samples`` (deterministic)."""
    parts = [list(p) for p in parts]
    sizes = np.array([len(p) for p in parts])
    for small in np.flatnonzero(sizes < min_samples):
        while len(parts[small]) < min_samples:
            donor = int(np.argmax([len(p) for p in parts]))
            parts[small].append(parts[donor].pop())
    return [np.asarray(p, dtype=np.int64) for p in parts]


class IID(Partitioner):
    """Uniformly random, (almost) equal-sized shards.

    Example:
        >>> parts = IID()(np.zeros(10), 3, np.random.default_rng(0))
        >>> [len(p) for p in parts]
        [4, 3, 3]
    """

    def split(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        return np.array_split(rng.permutation(len(targets)), num_clients)


class Dirichlet(Partitioner):
    r"""Label skew: for each class, client proportions :math:`p \sim \mathrm{Dir}(\alpha \mathbf{1})`.

    Smaller ``alpha`` gives more skewed clients. Clients left with fewer than ``min_samples`` samples receive
    samples taken from the largest clients, so that no client is empty.

    Args:
        alpha: Concentration :math:`\alpha > 0`.
        min_samples: Smallest number of samples per client (>= 1).

    Example:
        >>> targets = np.repeat(np.arange(10), 50)
        >>> parts = Dirichlet(alpha=0.1)(targets, 20, np.random.default_rng(0))
        >>> sum(len(p) for p in parts), min(len(p) for p in parts) >= 1
        (500, True)
    """

    needs_labels = True

    def __init__(self, alpha: float = 0.5, min_samples: int = 1) -> None:
        check_number("Dirichlet alpha", alpha, 0, open_min=True)
        check_int("min_samples", min_samples, 1)
        self.alpha = alpha
        self.min_samples = min_samples

    def split(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        if num_clients * self.min_samples > len(targets):
            raise ValueError(
                f"min_samples={self.min_samples} x num_clients={num_clients} exceeds the {len(targets)} samples"
            )
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for label in np.unique(targets):
            members = rng.permutation(np.flatnonzero(targets == label))
            proportions = rng.dirichlet(np.full(num_clients, self.alpha))
            cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(np.int64)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].append(chunk)
        merged = [np.concatenate(p) if p else np.empty(0, np.int64) for p in parts]
        return _fill_empty(merged, self.min_samples)


class Shards(Partitioner):
    r"""Pathological non-IID split of McMahan et al.: sort by label, cut into shards, give each client a few.

    The label-sorted samples are cut into ``num_clients * shards_per_client`` shards and every client gets
    ``shards_per_client`` of them. With ``distinct_classes=False`` (McMahan et al. 2017 as written) the shards are
    equal slices handed out at random, so a client may get two shards of one class, or a shard straddling two.
    With ``distinct_classes=True`` (``partition="pathological"``) every client holds exactly
    :math:`c` = ``shards_per_client`` different classes: client by client, :math:`c` classes are chosen among the
    least-used so far (ties at random), so class :math:`k` goes to :math:`h_k \in \{\lfloor Nc/K \rfloor,
    \lceil Nc/K \rceil\}` of the :math:`N` clients (:math:`K` classes), and its :math:`n_k` samples are cut, in
    random order, into :math:`h_k` shards of :math:`\lfloor n_k / h_k \rfloor` or :math:`\lceil n_k / h_k \rceil`
    samples (the first :math:`n_k \bmod h_k` holders, in client order, get one more). With equal classes and
    :math:`K \mid Nc`, every client holds :math:`n / N` samples, as in McMahan's split.

    Args:
        shards_per_client: Number of label-sorted shards per client (:math:`c`).
        distinct_classes: Give each client's shards from :math:`c` different classes (every class to at least one
            client: needs :math:`c \le K \le Nc`, and at least :math:`h_k` samples of every class).

    Example:
        >>> parts = Shards(2)(np.repeat(np.arange(5), 4), 5, np.random.default_rng(0))
        >>> sorted(len(p) for p in parts)
        [4, 4, 4, 4, 4]
        >>> targets = np.repeat(np.arange(4), 6)
        >>> parts = Shards(2, distinct_classes=True)(targets, 4, np.random.default_rng(0))
        >>> [len(set(targets[p].tolist())) for p in parts], [len(p) for p in parts]
        ([2, 2, 2, 2], [6, 6, 6, 6])
    """

    needs_labels = True

    def __init__(self, shards_per_client: int = 2, distinct_classes: bool = False) -> None:
        check_int("shards_per_client", shards_per_client, 1)
        check_bool("distinct_classes", distinct_classes)
        self.shards_per_client = shards_per_client
        self.distinct_classes = distinct_classes

    def split(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        num_shards = num_clients * self.shards_per_client
        if num_shards > len(targets):
            raise ValueError(
                f"{num_clients} clients x {self.shards_per_client} shards_per_client = {num_shards} shards, "
                f"more than the {len(targets)} samples"
            )
        if self.distinct_classes:
            return self._split_by_class(targets, num_clients, rng)
        shuffled = rng.permutation(len(targets))
        by_label = shuffled[np.argsort(targets[shuffled], kind="stable")]
        shards = np.array_split(by_label, num_shards)
        order = rng.permutation(num_shards).reshape(num_clients, self.shards_per_client)
        return [np.concatenate([shards[s] for s in row]) for row in order]

    def _split_by_class(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        classes = np.unique(targets)
        c, k = self.shards_per_client, len(classes)
        if c > k:
            raise ValueError(
                f"shards_per_client={c} with distinct_classes=True needs at least {c} classes; the training "
                f"targets have {k}: {classes.tolist()[:20]}"
            )
        if num_clients * c < k:
            raise ValueError(
                f"num_clients={num_clients} x shards_per_client={c} = {num_clients * c} shards cannot cover the "
                f"{k} classes with distinct_classes=True: use at least {-(-k // c)} clients, more shards_per_client, "
                "or distinct_classes=False"
            )
        uses = np.zeros(k, dtype=np.int64)
        holders: list[list[int]] = [[] for _ in range(k)]
        for client in range(num_clients):
            chosen = np.lexsort((rng.random(k), uses))[:c]  # the least-used classes, ties at random
            uses[chosen] += 1
            for j in chosen:
                holders[int(j)].append(client)
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for j, label in enumerate(classes):
            members = rng.permutation(np.flatnonzero(targets == label))
            if len(members) < len(holders[j]):
                raise ValueError(
                    f"class {label} has {len(members)} training samples but {len(holders[j])} clients must hold "
                    f"it (distinct_classes=True): use fewer clients or a smaller shards_per_client"
                )
            for client, chunk in zip(holders[j], np.array_split(members, len(holders[j]))):
                parts[client].append(chunk)
        return [np.concatenate(p) for p in parts]


class QuantitySkew(Partitioner):
    r"""IID contents, Gaussian sizes :math:`n_i \sim \mathcal{N}(\mu, a \mu)` with :math:`\mu = n / N`.

    Sizes are clipped at 1 and rescaled to add up to the number of samples.

    Args:
        a: Relative standard deviation ``a`` (ASFL uses 0.2, 0.3, 0.4).

    Example:
        >>> parts = QuantitySkew(a=0.3)(np.zeros(1000), 10, np.random.default_rng(0))
        >>> sum(len(p) for p in parts)
        1000
    """

    def __init__(self, a: float = 0.3) -> None:
        check_number("quantity skew a", a, 0)
        self.a = a

    def split(self, targets: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        n = len(targets)
        mu = n / num_clients
        raw = np.clip(rng.normal(mu, self.a * mu, size=num_clients), 1.0, None)
        exact = raw / raw.sum() * n
        sizes = np.maximum(np.floor(exact).astype(np.int64), 1)
        while sizes.sum() < n:  # hand out the remainder by largest fractional part
            sizes[int(np.argmax(exact - sizes))] += 1
        while sizes.sum() > n:  # clipping at 1 overshot: take from the largest
            sizes[int(np.argmax(sizes))] -= 1
        return np.split(rng.permutation(n), np.cumsum(sizes)[:-1])


class Natural(Partitioner):
    """Natural clients: each sample belongs to the client the dataset names for it.

    Without ``column``, the dataset's own client assignment (for naturally federated data generated per client, such
    as FedProx's Synthetic(alpha, beta)): ``num_clients`` must equal the dataset's number of clients. With
    ``column`` (e.g. FEMNIST's writer, a Hugging Face dataset's ``"user_id"``), one client per distinct value of that
    per-sample column: client ``i`` holds every sample of the ``i``-th smallest id, and ``num_clients`` must equal the
    number of distinct ids.

    Args:
        column: The training set's per-sample column naming each sample's user, writer or device (``None``: the
            dataset's own client assignment).

    Example:
        >>> parts = Natural()(np.zeros(5), 2, np.random.default_rng(0), groups=np.array([1, 0, 1, 1, 0]))
        >>> [p.tolist() for p in parts]
        [[1, 4], [0, 2, 3]]
        >>> writers = {"writer": np.array(["f07", "f03", "f07", "f11"])}
        >>> [p.tolist() for p in Natural("writer")(np.zeros(4), 3, np.random.default_rng(0), columns=writers)]
        [[1], [0, 2], [3]]
    """

    def __init__(self, column: str | None = None) -> None:
        check(
            column is None or (isinstance(column, str) and column != ""),
            f"column must be a column name or None, got {column!r}",
        )
        self.column = column

    @property
    def needs_groups(self) -> bool:  # type: ignore[override]
        return self.column is None

    @property
    def needs_columns(self) -> bool:  # type: ignore[override]
        return self.column is not None

    def split_by_columns(
        self, targets: np.ndarray, columns: dict[str, np.ndarray], num_clients: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        if self.column not in columns:
            raise ValueError(
                f"Natural(column={self.column!r}): the training set has no such column; its columns: {sorted(columns)}"
            )
        ids, groups = np.unique(np.asarray(columns[self.column]), return_inverse=True)
        if len(ids) != num_clients:
            raise ValueError(
                f"Natural(column={self.column!r}): the training set has {len(ids)} distinct ids, but "
                f"num_clients={num_clients}: set num_clients={len(ids)} (one client per id)"
            )
        return [np.flatnonzero(groups == c) for c in range(num_clients)]

    def split_by_group(self, groups: np.ndarray, num_clients: int) -> list[np.ndarray]:
        if groups.max() >= num_clients:
            raise ValueError(
                f"the dataset assigns samples to client {int(groups.max())}, but num_clients={num_clients}: "
                "set num_clients to the dataset's number of clients"
            )
        parts = [np.flatnonzero(groups == c) for c in range(num_clients)]
        empty = [c for c, p in enumerate(parts) if len(p) == 0]
        if empty:
            raise ValueError(
                f"clients {empty[:10]} have no training samples left (too few after the server or validation "
                f"split, or num_clients larger than the dataset's {len(np.unique(groups))} clients)"
            )
        return parts


def training_columns(targets: np.ndarray, columns: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The per-sample columns a partitioner reads: the dataset's own (``columns``) and the labels as ``"label"``
    (unless the dataset has a column of that name). Each column must hold one value per sample.

    Example:
        >>> sorted(training_columns(np.array([0, 1]), {"writer": np.array(["a", "b"])}))
        ['label', 'writer']
    """
    out = {"label": np.asarray(targets), **(columns or {})}
    wrong = {name: len(values) for name, values in out.items() if len(values) != len(targets)}
    if wrong:
        raise ValueError(f"columns must hold one value per training sample ({len(targets)}), got lengths {wrong}")
    return out


@runtime_checkable
class FlowerPartitionerLike(Protocol):
    """What a Flower Datasets partitioner (``flwr_datasets.partitioner.Partitioner``) offers: ``load_partition(i)``
    (and ``num_partitions``). A type that needs no import of ``flwr_datasets``: such an object passed as
    ``partition=`` is wrapped in :class:`~lit_asyncfl.data.FlowerPartitioner`."""

    def load_partition(self, partition_id: int) -> Any: ...


#: What ``partition=`` of a data module takes: a name, a :class:`Partitioner`, or a Flower Datasets partitioner.
PartitionArg = str | Partitioner | FlowerPartitionerLike


def partition_counts(targets: np.ndarray, parts: list[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """Samples per client and class, shape ``(clients, classes)`` (one column of sizes for targets that are not
    non-negative integer class labels, e.g. real values, -1/+1 or multi-label rows).

    Example:
        >>> partition_counts(np.array([0, 1, 1, 2]), [np.array([0, 1]), np.array([2, 3])]).tolist()
        [[1, 1, 0], [0, 1, 1]]
    """
    targets = np.asarray(targets)
    if not np.issubdtype(targets.dtype, np.integer) or targets.ndim != 1 or (len(targets) and targets.min() < 0):
        return np.array([[len(p)] for p in parts], dtype=np.int64)  # not class labels: sizes only
    k = int(num_classes if num_classes is not None else (targets.max() + 1 if len(targets) else 0))
    return np.stack([np.bincount(targets[p], minlength=k)[:k] for p in parts]).astype(np.int64)


#: The partitions ``partition=`` names, each a callable that makes it with its defaults.
PARTITIONERS: dict[str, Callable[[], Partitioner]] = {
    "iid": IID,
    "dirichlet": Dirichlet,
    "shards": Shards,
    "pathological": functools.partial(Shards, 2, distinct_classes=True),
    "quantity": QuantitySkew,
    "natural": Natural,
}


def resolve_partitioner(partition: PartitionArg, alpha: float | None = None, name: str = "partition") -> Partitioner:
    """Turn a name (``"iid"``, ``"dirichlet"``, ``"shards"``, ``"pathological"``, ``"quantity"``, ``"natural"``), an
    instance, or a Flower Datasets partitioner into a partitioner.

    ``alpha`` is the Dirichlet concentration (default 0.5) and only goes with ``"dirichlet"``; other settings
    are given by passing an instance, e.g. ``QuantitySkew(a=0.2)`` or ``Shards(shards_per_client=3)``;
    ``"pathological"`` is ``Shards(2, distinct_classes=True)`` (two classes per client). A
    ``flwr_datasets.partitioner.Partitioner`` is wrapped in :class:`~lit_asyncfl.data.FlowerPartitioner` (its
    partitions become the clients). ``name`` is the caller's parameter, named in the error for an unknown partition.

    Example:
        >>> resolve_partitioner("dirichlet", alpha=0.1)
        Dirichlet(alpha=0.1, min_samples=1)
        >>> resolve_partitioner("pathological")
        Shards(shards_per_client=2, distinct_classes=True)
    """
    if isinstance(partition, FlowerPartitionerLike) and not isinstance(partition, Partitioner):
        from lit_asyncfl.data.flower import FlowerPartitioner

        partition = FlowerPartitioner(partition)
    if isinstance(partition, Partitioner):
        if alpha is not None:
            raise ValueError(f"alpha={alpha!r} goes with partition='dirichlet'; set it on {partition!r} instead")
        return partition
    check(
        isinstance(partition, str) and partition in PARTITIONERS,
        f"unknown {name} {partition!r}; allowed: {sorted(PARTITIONERS)}, a Partitioner, or a Flower Datasets "
        "partitioner",
    )
    if partition == "dirichlet":
        return Dirichlet(0.5 if alpha is None else alpha)
    if alpha is not None:
        raise ValueError(f"alpha={alpha!r} only applies to partition='dirichlet', not {partition!r}")
    return PARTITIONERS[partition]()


# Partitions tied to device speed live in their own module; re-exported here (``lit_asyncfl.data.partition``).
from lit_asyncfl.data.speed_partition import RareClassOnSlowClients, SpeedMatched  # noqa: E402, F401
