"""The papers' partition schemes lit_asyncfl builds natively: pathological label shards with exactly c classes per
client (``Shards(c, distinct_classes=True)``, ``partition="pathological"``) and natural partitions by a per-sample
user/writer column (``Natural(column=...)``); and the refusals of partitions that would leave a client empty."""

from __future__ import annotations

import numpy as np
import pytest

from lit_asyncfl.data import DigitsDataModule, Natural, Partitioner, Shards
from lit_asyncfl.data.partition import PARTITIONERS, resolve_partitioner


def _mcmahan_reference(targets: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator):
    """McMahan et al.'s split as the library has always drawn it: sort by label, cut, hand out at random."""
    shuffled = rng.permutation(len(targets))
    by_label = shuffled[np.argsort(targets[shuffled], kind="stable")]
    shards = np.array_split(by_label, num_clients * per_client)
    order = rng.permutation(num_clients * per_client).reshape(num_clients, per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in order]


def test_mcmahan_shards_are_unchanged_by_the_distinct_classes_option():
    targets = np.random.default_rng(3).integers(0, 10, 500)
    parts = Shards(2)(targets, 20, np.random.default_rng(7))
    expected = _mcmahan_reference(targets, 20, 2, np.random.default_rng(7))
    assert all(np.array_equal(a, b) for a, b in zip(parts, expected))


def test_equal_classes_give_every_client_c_classes_and_n_over_N_samples():
    # K = 10 classes of 40 samples, N = 20 clients, c = 2: every class goes to Nc/K = 4 clients, 10 samples each
    targets = np.repeat(np.arange(10), 40)
    parts = Shards(2, distinct_classes=True)(targets, 20, np.random.default_rng(0))
    assert sorted(np.concatenate(parts).tolist()) == list(range(400))
    for part in parts:
        counts = np.bincount(targets[part], minlength=10)
        assert len(part) == 400 // 20
        assert sorted(counts[counts > 0].tolist()) == [10, 10]
    holders = [sum(int((targets[p] == k).any()) for p in parts) for k in range(10)]
    assert holders == [4] * 10
    assert len({tuple(np.unique(targets[p])) for p in parts}) > 5  # random pairs, not five repeated ones


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uneven_classes_follow_the_formula(seed):
    """Class k (n_k samples) goes to h_k in {floor(Nc/K), ceil(Nc/K)} clients with floor/ceil(n_k / h_k) each."""
    sizes = [13, 7, 22, 9, 30]
    targets = np.repeat(np.arange(5), sizes)
    rng = np.random.default_rng(seed)
    targets = targets[rng.permutation(len(targets))]
    n_clients, c = 7, 3
    parts = Shards(c, distinct_classes=True)(targets, n_clients, np.random.default_rng(seed))
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(targets)))
    counts = np.stack([np.bincount(targets[p], minlength=5) for p in parts])  # clients x classes
    assert ((counts > 0).sum(axis=1) == c).all()  # exactly c classes each
    holders = (counts > 0).sum(axis=0)
    assert holders.sum() == n_clients * c and set(holders.tolist()) <= {21 // 5, -(-21 // 5)}
    for k, n_k in enumerate(sizes):
        held = counts[:, k][counts[:, k] > 0]
        assert held.sum() == n_k and set(held.tolist()) <= {n_k // holders[k], -(-n_k // holders[k])}


def test_pathological_is_deterministic_given_the_seed_and_moves_with_it():
    targets = np.repeat(np.arange(10), 30)
    a = Shards(2, distinct_classes=True)(targets, 15, np.random.default_rng(4))
    b = Shards(2, distinct_classes=True)(targets, 15, np.random.default_rng(4))
    c = Shards(2, distinct_classes=True)(targets, 15, np.random.default_rng(5))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_the_pathological_name_is_two_classes_per_client():
    assert repr(resolve_partitioner("pathological")) == "Shards(shards_per_client=2, distinct_classes=True)"
    assert repr(PARTITIONERS["pathological"]()) == "Shards(shards_per_client=2, distinct_classes=True)"
    with pytest.raises(ValueError, match=r"alpha=0\.3 only applies to partition='dirichlet', not 'pathological'"):
        resolve_partitioner("pathological", alpha=0.3)


@pytest.mark.parametrize(
    ("targets", "clients", "c", "message"),
    [
        (np.repeat(np.arange(3), 10), 5, 4, r"shards_per_client=4 .* at least 4 classes; the training targets have 3"),
        (np.repeat(np.arange(10), 10), 4, 2, r"num_clients=4 x shards_per_client=2 = 8 shards cannot cover the 10 "),
        (np.array([0] * 30 + [1] * 2 + [2] * 30), 6, 2, r"class 1 has 2 training samples but 4 clients must hold"),
    ],
)
def test_impossible_pathological_splits_are_refused_naming_the_values(targets, clients, c, message):
    with pytest.raises(ValueError, match=message):
        Shards(c, distinct_classes=True)(targets, clients, np.random.default_rng(0))


def test_distinct_classes_must_be_a_bool():
    with pytest.raises(ValueError, match="distinct_classes"):
        Shards(2, distinct_classes="yes")  # type: ignore[arg-type]


def test_natural_column_gives_one_client_per_distinct_id():
    writers = np.array(["f12", "f03", "f12", "f40", "f03", "f03", "f40", "f12", "f99"])
    parts = Natural("writer")(np.zeros(len(writers)), 4, np.random.default_rng(0), columns={"writer": writers})
    for client, writer in enumerate(["f03", "f12", "f40", "f99"]):  # the i-th smallest id is client i
        assert parts[client].tolist() == np.flatnonzero(writers == writer).tolist()


def test_natural_column_refuses_a_client_count_other_than_the_ids():
    writers = {"writer": np.array([5, 5, 9, 2])}
    with pytest.raises(ValueError, match=r"3 distinct ids, but num_clients=4: set num_clients=3"):
        Natural("writer")(np.zeros(4), 4, np.random.default_rng(0), columns=writers)


def test_natural_column_refuses_a_missing_column_naming_those_there_are():
    with pytest.raises(ValueError, match=r"no such column; its columns: \['label', 'user'\]"):
        Natural("writer")(np.zeros(3), 1, np.random.default_rng(0), columns={"user": np.zeros(3)})
    with pytest.raises(ValueError, match="column must be a column name or None, got 3"):
        Natural(3)  # type: ignore[arg-type]


def test_a_bundled_data_module_offers_its_labels_as_a_column():
    """Digits has no writer column, so ``Natural("label")`` (one client per class) is what a column can do there."""
    dm = DigitsDataModule(partition=Natural("label"))
    dm.setup("fit")
    shards = dm.client_shards(10, seed=0)
    labels = dm.train_set.tensors[1].numpy()
    for client, part in enumerate(shards.indices_numpy()):
        assert part.tolist() == np.flatnonzero(labels == client).tolist()
    dm = DigitsDataModule(partition=Natural("writer"))
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"Natural\(column='writer'\).*its columns: \['label'\]"):
        dm.client_shards(10, seed=0)


def test_a_partition_leaving_a_client_empty_is_refused_naming_it():
    class LeavesOneOut(Partitioner):
        def split(self, targets, num_clients, rng):
            return [np.arange(len(targets)), *[np.empty(0, np.int64)] * (num_clients - 1)]

    with pytest.raises(ValueError, match=r"leaves clients \[1, 2\] without training samples"):
        LeavesOneOut()(np.zeros(6), 3, np.random.default_rng(0))
