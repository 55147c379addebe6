"""Image data modules read tiny files written in the datasets' real on-disk formats."""

from __future__ import annotations

import gzip
import pickle

import numpy as np
import pytest
import torch
from builders import make_cifar
from conftest import make_trainer

from lit_asyncfl.algorithms import FedASMU
from lit_asyncfl.data import CIFAR10DataModule, CIFAR100DataModule, FashionMNISTDataModule, MNISTDataModule
from lit_asyncfl.models import LeNet5, SimpleCNN


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def make_mnist(root, folder, n_train=40, n_test=12, compress=False):
    rng = np.random.default_rng(0)
    raw = root / folder / "raw"
    raw.mkdir(parents=True)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": (np.arange(n_test) * 3) % 10,
    }
    for name, array in arrays.items():
        write_idx(raw / name, array, compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gz"])
@pytest.mark.parametrize(("cls", "folder"), [(MNISTDataModule, "MNIST"), (FashionMNISTDataModule, "FashionMNIST")])
def test_mnist_style_idx_files_load_standardised(tmp_path, cls, folder, compress):
    arrays = make_mnist(tmp_path, folder, compress=compress)
    dm = cls(root=str(tmp_path))
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == (40, 1, 28, 28) and y.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    assert x.dtype == torch.uint8  # stored compactly, standardised per client batch
    assert x[3, 0].tolist() == arrays["train-images-idx3-ubyte"][3].tolist()
    expected = (torch.tensor(arrays["train-images-idx3-ubyte"][3], dtype=torch.float32) / 255 - cls.mean[0]) / cls.std[
        0
    ]
    assert torch.allclose(dm.prepare_inputs(x[3:4])[0, 0], expected)
    # a client's batch reaches the model standardised
    shards = dm.client_shards(num_clients=40, seed=0)
    client = next(c for c in range(40) if 3 in shards.indices[c].tolist())
    (batch_x, _), *_ = shards.batches(client, batch_size=1, generator=torch.Generator())
    assert batch_x.dtype == torch.float32 and torch.allclose(batch_x[0, 0], expected)
    test_image = torch.tensor(arrays["t10k-images-idx3-ubyte"][0], dtype=torch.float32)
    expected_test = (test_image / 255 - cls.mean[0]) / cls.std[0]
    assert torch.allclose(dm.test_set.tensors[0][0, 0], expected_test)
    assert dm.test_set.tensors[1].tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()


@pytest.mark.parametrize("hundred", [False, True], ids=["cifar10", "cifar100"])
def test_cifar_pickled_batches_load_in_order_as_nchw(tmp_path, hundred):
    written = make_cifar(tmp_path, hundred)
    dm = (CIFAR100DataModule if hundred else CIFAR10DataModule)(root=str(tmp_path), val_fraction=0.25)
    dm.setup("fit")
    train_names = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    all_labels = [v for n in train_names for v in written[n][1]]
    x_train, y_train = dm.train_set.tensors
    _x_val, y_val = dm.val_set.tensors
    assert len(y_train) + len(y_val) == len(all_labels) and x_train.shape[1:] == (3, 32, 32)
    assert sorted(y_train.tolist() + y_val.tolist()) == sorted(int(v) for v in all_labels)
    # first test image, channel 1 (green), pixel (0, 5): CIFAR stores each row as R plane, G plane, B plane
    data, labels = written["test" if hundred else "test_batch"]
    pixel = data[0].reshape(3, 32, 32)[1, 0, 5]
    x_test, y_test = dm.test_set.tensors
    assert x_test[0, 1, 0, 5].item() == pytest.approx((pixel / 255 - dm.mean[1]) / dm.std[1], abs=1e-6)
    assert y_test.tolist() == [int(v) for v in labels]


@pytest.mark.parametrize("cls", [MNISTDataModule, CIFAR10DataModule, CIFAR100DataModule])
def test_missing_files_name_the_path_and_the_download_option(tmp_path, cls):
    dm = cls(root=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=r"nowhere.*missing.*download=True"):
        dm.setup("fit")


def test_fedasmu_runs_on_a_tiny_cifar_with_the_paper_models(tmp_path):
    make_cifar(tmp_path / "data", per_batch=20)
    for model in (LeNet5(in_channels=3, input_size=32, lr=0.03), SimpleCNN(in_channels=3, input_size=32)):
        trainer = make_trainer(
            tmp_path / type(model).__name__,
            FedASMU(clients_per_trigger=2, max_parallel=3),
            num_clients=5,
            max_versions=6,
        )
        trainer.fit(model, datamodule=CIFAR10DataModule(root=str(tmp_path / "data"), batch_size=8))
        assert trainer.summary["versions"] == 6 and trainer.history[-1]["accuracy"] is not None


class _Payload:
    """What a crafted batch carries: unpickling it calls ``os.system``."""

    def __init__(self, marker) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("hundred", [False, True], ids=["cifar10", "cifar100"])
def test_a_crafted_cifar_batch_is_refused_naming_the_file_without_running_its_code(tmp_path, hundred):
    make_cifar(tmp_path, hundred)
    folder = tmp_path / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    first = folder / ("train" if hundred else "data_batch_1")
    marker = tmp_path / "ran"
    with open(first, "wb") as fh:
        pickle.dump({"data": np.zeros((8, 3072), dtype=np.uint8), "labels": [0] * 8, "x": _Payload(marker)}, fh)
    dm = (CIFAR100DataModule if hundred else CIFAR10DataModule)(root=str(tmp_path), val_fraction=0.25)
    with pytest.raises(ValueError, match=rf"{first}: refused to load the global posix.system from the pickle: a CIFAR"):
        dm.setup("fit")
    assert not marker.exists()


def test_cifar_batches_in_python_2_s_protocol_with_bytes_keys_still_load(tmp_path):
    written = make_cifar(tmp_path)
    folder = tmp_path / "cifar-10-batches-py"
    for name, (data, labels) in written.items():  # as the real files: protocol 2, keys as bytes
        with open(folder / name, "wb") as fh:
            pickle.dump({b"data": data, b"labels": [int(v) for v in labels], b"batch_label": name.encode()}, fh,
                        protocol=2)  # fmt: skip
    dm = CIFAR10DataModule(root=str(tmp_path), val_fraction=0.25)
    dm.setup("fit")
    assert len(dm.train_set.tensors[1]) + len(dm.val_set.tensors[1]) == 40
    assert dm.test_set.tensors[1].tolist() == [int(v) for v in written["test_batch"][1]]
