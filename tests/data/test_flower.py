"""Flower Datasets partitioners as lit_asyncfl partitions (the ``flower`` extra), offline on a ``datasets.Dataset``
built here: each client holds exactly the rows the partitioner gives when called directly, a whole run on such
data trains the weights a plain tensor data module with those clients trains, and what cannot work is refused."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

EXTRA = "needs the flower extra: pip install 'lit-asyncfl[flower]'"
pytest.importorskip("datasets", reason=EXTRA)
fp = pytest.importorskip("flwr_datasets.partitioner", reason=EXTRA)

import datasets  # noqa: E402
import lightning as L  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from lit_asyncfl import FederatedTrainer  # noqa: E402
from lit_asyncfl.algorithms import FedAsync  # noqa: E402
from lit_asyncfl.cli import FederatedCLI  # noqa: E402
from lit_asyncfl.data import (  # noqa: E402
    DigitsDataModule,
    FlowerPartitioner,
    HuggingFaceDataModule,
    PartitionedDataModule,
    Partitioner,
)
from lit_asyncfl.models import LogisticRegression  # noqa: E402

N, K, WRITERS = 240, 4, 6


def make_rows(n: int = N, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, K, n)
    x = rng.normal(size=(n, 5)) + np.eye(K, 5)[labels] * 2.0
    writers = [f"w{int(w):02d}" for w in rng.integers(0, WRITERS, n)]
    return {"x": x.tolist(), "label": labels.tolist(), "writer": writers, "row": list(range(n))}


def make_dataset(n: int = N, seed: int = 0) -> datasets.Dataset:
    features = datasets.Features(
        {
            "x": datasets.Sequence(datasets.Value("float64")),
            "label": datasets.ClassLabel(num_classes=K),
            "writer": datasets.Value("string"),
            "row": datasets.Value("int64"),
        }
    )
    return datasets.Dataset.from_dict(make_rows(n, seed), features=features)


FLOWER = {
    "iid": lambda: fp.IidPartitioner(num_partitions=6),
    "dirichlet": lambda: fp.DirichletPartitioner(6, "label", alpha=0.5, min_partition_size=5, seed=3),
    "inner-dirichlet": lambda: fp.InnerDirichletPartitioner([30, 50, 40, 40, 60, 20], "label", alpha=0.4, seed=1),
    "shard": lambda: fp.ShardPartitioner(6, "label", num_shards_per_partition=2, seed=2),
    "pathological": lambda: fp.PathologicalPartitioner(6, "label", 2, class_assignment_mode="first-deterministic"),
    "linear": lambda: fp.LinearPartitioner(num_partitions=6),
    "square": lambda: fp.SquarePartitioner(num_partitions=6),
    "exponential": lambda: fp.ExponentialPartitioner(num_partitions=6),
    "natural-id": lambda: fp.NaturalIdPartitioner(partition_by="writer"),
    "grouped-natural-id": lambda: fp.GroupedNaturalIdPartitioner(partition_by="writer", group_size=2),
    "size": lambda: fp.SizePartitioner([10, 30, 50, 70, 40, 40]),
    "continuous": lambda: fp.ContinuousPartitioner(num_partitions=6, partition_by="row", strictness=0.5, seed=4),
}


def flower_rows(partitioner, dataset: datasets.Dataset) -> list[list[int]]:
    """What the partitioner gives when called directly: each partition's rows (by the dataset's ``row`` column)."""
    partitioner.dataset = dataset
    return [sorted(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]


@pytest.mark.parametrize("name", sorted(FLOWER))
def test_clients_hold_exactly_the_partitions_flower_gives(name):
    train = make_dataset()
    expected = flower_rows(FLOWER[name](), train)
    dm = HuggingFaceDataModule(train, make_dataset(40, seed=1), input_column="x", partition=FLOWER[name]())
    dm.setup("fit")
    assert isinstance(dm.partitioner, FlowerPartitioner)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ShardPartitioner may leave samples out, as in Flower
        shards = dm.client_shards(len(expected), seed=123)
    assert [p.tolist() for p in shards.indices_numpy()] == expected
    assert dm.client_shards(len(expected), seed=999).indices_numpy()[0].tolist() == expected[0]  # its own seed


def test_a_bundled_data_module_offers_its_labels_to_a_flower_partitioner():
    dm = DigitsDataModule(partition=fp.DirichletPartitioner(8, "label", alpha=0.3, seed=5))
    dm.setup("fit")
    labels = dm.train_set.tensors[1].numpy()
    table = datasets.Dataset.from_dict({"label": labels.tolist(), "row": list(range(len(labels)))})
    expected = flower_rows(fp.DirichletPartitioner(8, "label", alpha=0.3, seed=5), table)
    assert [p.tolist() for p in dm.client_shards(8, seed=0).indices_numpy()] == expected


def test_samples_flower_leaves_out_train_no_client_and_are_announced():
    dm = HuggingFaceDataModule(
        make_dataset(), make_dataset(40, 1), input_column="x",
        partition=fp.ShardPartitioner(7, "label", num_shards_per_partition=1, shard_size=30, seed=0),
    )  # fmt: skip
    dm.setup("fit")
    with pytest.warns(UserWarning, match=r"30 of the 240 training samples are in no partition of ShardPartitioner"):
        shards = dm.client_shards(7, seed=0)
    assert sum(shards.num_samples(c) for c in range(7)) == 210


class FixedParts(Partitioner):
    """Given clients (the test's reference for what a partition should be)."""

    def __init__(self, parts):
        self.parts = parts

    def split(self, targets, num_clients, rng):
        return [np.asarray(p) for p in self.parts]


class TensorData(L.LightningDataModule):
    def __init__(self, train: TensorDataset, test: TensorDataset):
        super().__init__()
        self.train, self.test = train, test

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=8, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.test, batch_size=64)


def _fit(datamodule, tmp_path, name):
    torch.manual_seed(0)
    model = LogisticRegression(input_dim=5, num_classes=K, lr=0.1)
    trainer = FederatedTrainer(
        FedAsync(concurrency=3), num_clients=WRITERS, max_versions=12, seed=7, logger=False,
        default_root_dir=str(tmp_path / name), enable_progress_bar=False, print_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    return {k: v.clone() for k, v in trainer.global_model.state_dict().items()}, trainer


def test_a_run_on_a_hugging_face_dataset_with_a_flower_partition_trains_the_tensor_run_weights(tmp_path):
    """The same clients from the tensors built here and the partition computed by Flower directly: same weights."""
    train, test = make_dataset(), make_dataset(40, seed=1)
    hf = HuggingFaceDataModule(
        train, test, input_column="x", batch_size=8, partition=fp.NaturalIdPartitioner(partition_by="writer")
    )
    weights, trainer = _fit(hf, tmp_path, "hf")
    again, _ = _fit(
        HuggingFaceDataModule(train, test, input_column="x", batch_size=8,
                              partition=fp.NaturalIdPartitioner(partition_by="writer")), tmp_path, "again",
    )  # fmt: skip
    rows, test_rows = make_rows(), make_rows(40, seed=1)

    def tensors(r):
        return TensorDataset(torch.tensor(r["x"], dtype=torch.float32), torch.tensor(r["label"]))

    parts = flower_rows(fp.NaturalIdPartitioner(partition_by="writer"), train)
    reference = PartitionedDataModule(TensorData(tensors(rows), tensors(test_rows)), partition=FixedParts(parts))
    expected, _ = _fit(reference, tmp_path, "tensors")
    assert trainer.summary["versions"] == 12 and trainer.summary["best_accuracy"] > 0.5
    assert weights.keys() == expected.keys() == again.keys()
    for key in expected:
        assert torch.equal(weights[key], expected[key]), key
        assert torch.equal(weights[key], again[key]), key


def test_a_client_count_other_than_the_partitions_is_refused_naming_both():
    dm = HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x",
                               partition=fp.IidPartitioner(num_partitions=5))  # fmt: skip
    dm.setup("fit")
    with pytest.raises(ValueError, match=r"IidPartitioner makes 5 partitions but num_clients=6: set num_clients=5"):
        dm.client_shards(6, seed=0)
    natural = HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x",
                                    partition=fp.NaturalIdPartitioner(partition_by="writer"))  # fmt: skip
    natural.setup("fit")
    with pytest.raises(ValueError, match=r"NaturalIdPartitioner makes 6 partitions but num_clients=10"):
        natural.client_shards(10, seed=0)


def test_a_column_the_training_set_lacks_is_refused_naming_its_columns():
    dm = HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x",
                               partition=fp.DirichletPartitioner(6, "fine_label", alpha=0.5))  # fmt: skip
    dm.setup("fit")
    lacks = r"by column 'fine_label', which the training set lacks; its columns: \['label', 'row', 'writer'\]"
    with pytest.raises(ValueError, match=lacks):
        dm.client_shards(6, seed=0)


def test_what_cannot_be_a_partition_is_refused_at_construction():
    with pytest.raises(ValueError, match="VerticalEvenPartitioner splits features"):
        HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x",
                              partition=fp.VerticalEvenPartitioner(num_partitions=2))  # fmt: skip
    used = fp.IidPartitioner(num_partitions=2)
    used.dataset = make_dataset()
    with pytest.raises(ValueError, match="IidPartitioner already has a dataset assigned: pass a fresh partitioner"):
        DigitsDataModule(partition=used)
    with pytest.raises(TypeError, match=r"FlowerPartitioner wraps a flwr_datasets\.partitioner\.Partitioner, got str"):
        FlowerPartitioner("iid")
    sparse = fp.DirichletPartitioner(6, "label", alpha=0.05, min_partition_size=0, seed=0)
    empty = HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x", partition=sparse)
    empty.setup("fit")
    with pytest.raises(ValueError, match=r"leaves clients \[1\] without training samples"):  # as Flower splits it
        empty.client_shards(6, seed=0)


def test_the_user_partitioner_is_not_given_a_dataset_and_splits_alike_twice():
    partitioner = fp.DirichletPartitioner(6, "label", alpha=0.5, min_partition_size=5, seed=3)
    before = copy.deepcopy(partitioner)
    dm = HuggingFaceDataModule(make_dataset(), make_dataset(40, 1), input_column="x", partition=partitioner)
    dm.setup("fit")
    first = [p.tolist() for p in dm.client_shards(6, seed=0).indices_numpy()]
    assert [p.tolist() for p in dm.client_shards(6, seed=1).indices_numpy()] == first
    assert not partitioner.is_dataset_assigned() and before.is_dataset_assigned() is False
    assert repr(dm.partitioner) == (
        "FlowerPartitioner(DirichletPartitioner(num_partitions=6, partition_by='label', alpha=[0.5, 0.5, 0.5, 0.5, "
        "0.5, 0.5], min_partition_size=5, self_balancing=False, shuffle=True, seed=3))"
    )


def test_a_flower_partitioner_is_configured_by_class_path_on_the_cli(tmp_path):
    cli = FederatedCLI(
        args=[
            "--config",
            "configs/quickstart.yaml",
            "--data.init_args.alpha=null",
            '--data.init_args.partition={"class_path": "flwr_datasets.partitioner.DirichletPartitioner", '
            '"init_args": {"num_partitions": 10, "partition_by": "label", "alpha": 0.3, "seed": 1}}',
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )
    partitioner = cli.datamodule.partitioner
    assert isinstance(partitioner, FlowerPartitioner) and isinstance(partitioner.partitioner, fp.DirichletPartitioner)
    assert partitioner.settings["num_partitions"] == 10 and partitioner.settings["seed"] == 1


def test_the_docs_example_trains_one_client_per_writer(tmp_path, monkeypatch):
    """The Python example of docs/lightning.md's Flower section runs as written."""
    import re
    from pathlib import Path

    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
    text = (root / "docs" / "lightning.md").read_text()
    code = re.search(r"<!-- test: flower -->\n```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "docs_flower"}
    exec(compile(code, "docs/lightning.md", "exec"), namespace)
    trainer, by_writer = namespace["trainer"], namespace["by_writer"]
    assert trainer.summary["versions"] == 20
    writers = np.asarray(namespace["train"]["writer"])
    for client, part in enumerate(by_writer.client_shards(10, seed=0).indices_numpy()):
        assert set(writers[part]) == {f"w{client}"}
    skewed = namespace["skewed"]
    skewed.setup("fit")
    assert sum(skewed.client_shards(10, seed=0).num_samples(c) for c in range(10)) == 300
