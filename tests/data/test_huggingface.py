"""A Hugging Face ``datasets.Dataset`` as a data source (offline, on datasets built here): its inputs become the
tensors the user's transform makes, resident or read at every draw with the same weights, its plain columns are
what column partitions read, and what cannot be used is refused naming the alternative."""

from __future__ import annotations

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("datasets", reason="needs the datasets package: pip install 'lit-asyncfl[flower]'")

from lit_asyncfl import FederatedTrainer  # noqa: E402
from lit_asyncfl.algorithms import FedAsync  # noqa: E402
from lit_asyncfl.cli import FederatedCLI  # noqa: E402
from lit_asyncfl.data import DatasetShards, HuggingFaceDataModule, Natural  # noqa: E402
from lit_asyncfl.data.shards import ClientShards  # noqa: E402
from lit_asyncfl.models import LogisticRegression  # noqa: E402


def images(n: int, seed: int = 0) -> tuple[datasets.Dataset, np.ndarray]:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (n, 6, 6), dtype=np.uint8)
    features = datasets.Features({"img": datasets.Image(), "digit": datasets.ClassLabel(num_classes=10)})
    ds = datasets.Dataset.from_dict({"img": list(pixels), "digit": (np.arange(n) % 3).tolist()}, features=features)
    return ds, pixels


def table(n: int, seed: int = 0) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 4)) + np.eye(3, 4)[labels] * 2
    users = [f"u{u}" for u in rng.integers(0, 5, n)]
    return datasets.Dataset.from_dict({"x": x.tolist(), "label": labels.tolist(), "user": users})


def test_images_become_to_tensor_inputs_and_a_class_label_gives_the_classes():
    train, pixels = images(12)
    test, _ = images(4, seed=1)
    dm = HuggingFaceDataModule(train, test, input_column="img", label_column="digit")
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.dtype == torch.float32 and x.shape == (12, 1, 6, 6)
    assert torch.equal(x, torch.from_numpy(pixels.astype(np.float32) / 255.0).unsqueeze(1))  # torchvision's ToTensor
    assert y.tolist() == (np.arange(12) % 3).tolist() and y.dtype == torch.long
    assert dm.num_classes == 10 and dm.train_columns is not None and sorted(dm.train_columns) == ["digit"]


def test_a_transform_makes_the_inputs_and_integer_labels_give_the_largest_plus_one():
    ds = table(20)
    dm = HuggingFaceDataModule(ds, table(6, 1), input_column="x", transform=lambda v: torch.tensor(v[:2]) * 10)
    dm.setup("fit")
    assert torch.allclose(dm.train_set.tensors[0], torch.tensor(ds["x"])[:, :2] * 10)
    assert dm.num_classes == 3


def _fit(dm, tmp_path, name):
    torch.manual_seed(0)
    trainer = FederatedTrainer(
        FedAsync(concurrency=2), num_clients=5, max_versions=10, seed=3, logger=False,
        default_root_dir=str(tmp_path / name), enable_progress_bar=False, print_summary=False,
    )  # fmt: skip
    trainer.fit(LogisticRegression(input_dim=4, num_classes=3, lr=0.1), datamodule=dm)
    return trainer.global_model.state_dict()


def test_resident_and_read_at_every_draw_train_the_same_weights(tmp_path):
    train, test = table(120), table(30, 1)
    resident = HuggingFaceDataModule(train, test, input_column="x", batch_size=8, partition=Natural("user"))
    read = HuggingFaceDataModule(train, test, input_column="x", batch_size=8, partition=Natural("user"), resident=False)
    a, b = _fit(resident, tmp_path, "resident"), _fit(read, tmp_path, "read")
    assert isinstance(resident.client_shards(5, 3), ClientShards)
    assert isinstance(read.client_shards(5, 3), DatasetShards)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_random_transform_is_drawn_afresh_at_every_read():
    dm = HuggingFaceDataModule(table(10), table(4, 1), input_column="x", resident=False,
                               transform=lambda v: torch.tensor(v, dtype=torch.float32) + torch.rand(4))  # fmt: skip
    dm.setup("fit")
    assert not torch.equal(dm.train_set[0][0], dm.train_set[0][0])


@pytest.mark.parametrize("resident", [True, False])
def test_the_validation_split_keeps_each_sample_with_its_user(resident):
    ds = table(60)
    users = np.asarray(ds["user"])
    dm = HuggingFaceDataModule(ds, table(10, 1), input_column="x", partition=Natural("user"), val_fraction=0.25,
                               resident=resident)  # fmt: skip
    dm.setup("fit")
    held, kept = dm.validation_split(60)
    assert len(dm.val_set) == len(held) == 15 and len(dm.train_set) == 45
    shards = dm.client_shards(len(set(users[kept])), seed=0)
    for client, part in enumerate(shards.indices_numpy()):
        assert set(users[kept][part]) == {sorted(set(users[kept]))[client]}


def test_a_dataset_saved_to_disk_is_a_source_on_the_cli(tmp_path):
    table(40).save_to_disk(str(tmp_path / "train"))
    table(10, 1).save_to_disk(str(tmp_path / "test"))
    cli = FederatedCLI(
        args=[
            "--config", "configs/quickstart.yaml",
            '--model={"class_path": "lit_asyncfl.models.LogisticRegression", "init_args": {"input_dim": 4}}',
            '--data={"class_path": "lit_asyncfl.data.HuggingFaceDataModule", "init_args": {'
            f'"train": "{tmp_path / "train"}", "test": "{tmp_path / "test"}", "input_column": "x", "alpha": null, '
            '"partition": {"class_path": "lit_asyncfl.data.Natural", "init_args": {"column": "user"}}}}',
            f"--trainer.default_root_dir={tmp_path}",
        ],
        run=False,
    )  # fmt: skip
    dm = cli.datamodule
    dm.setup("fit")
    assert (
        isinstance(dm, HuggingFaceDataModule)
        and len(dm.train_set) == 40
        and repr(dm.partitioner) == ("Natural(column='user')")
    )


def test_unusable_sources_are_refused_naming_the_alternative():
    ds = table(10)
    with pytest.raises(ValueError, match=r"train has no column \['image'\]; its columns: \['x', 'label', 'user'\]"):
        HuggingFaceDataModule(ds, ds)
    with pytest.raises(ValueError, match=r"label column 'user' holds <U2 values: .*class_encode_column\('user'\)"):
        HuggingFaceDataModule(ds, ds, input_column="x", label_column="user")
    splits = datasets.DatasetDict({"train": ds, "test": ds})
    with pytest.raises(TypeError, match=r"got DatasetDict \(for a DatasetDict pass its splits, e\.g\. train=dataset_"):
        HuggingFaceDataModule(splits, ds, input_column="x")
    with pytest.raises(ValueError, match="input_column and label_column are both 'x'"):
        HuggingFaceDataModule(ds, ds, input_column="x", label_column="x")
    with pytest.raises(ValueError, match="transform must be a function value -> Tensor or None, got 3"):
        HuggingFaceDataModule(ds, ds, input_column="x", transform=3)  # type: ignore[arg-type]


def test_server_data_held_out_keeps_each_remaining_sample_with_its_user():
    """Server data (e.g. FedADT's distillation set) leaves the training rows, and their columns with them."""
    ds = table(80)
    users = np.asarray(ds["user"])
    dm = HuggingFaceDataModule(ds, table(10, 1), input_column="x", partition=Natural("user"))
    dm.setup("fit")
    server = dm.split_server_data(0.25, seed=0)
    x_all, rest = torch.tensor(ds["x"], dtype=torch.float32), []
    for x in dm.train_set.tensors[0]:  # the remaining rows, found by their inputs
        rest.append(int(torch.nonzero((x_all == x).all(dim=1))[0]))
    assert len(server) == 20 and len(rest) == 60
    shards = dm.client_shards(len(set(users[rest])), seed=0)
    for client, part in enumerate(shards.indices_numpy()):
        assert set(users[rest][part]) == {sorted(set(users[rest]))[client]}
