"""Tiny-ImageNet, IMDb, Synthetic and the scikit-learn tabular sets; augmentation; speed-tied and natural
partitions; the partition description saved with a run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_trainer

from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.data import (
    BreastCancerDataModule,
    CIFAR10DataModule,
    DiabetesDataModule,
    Dirichlet,
    IMDbDataModule,
    QuantitySkew,
    SpeedMatched,
    SyntheticDataModule,
    TinyImageNetDataModule,
    generate_synthetic,
    partition_counts,
)
from lit_asyncfl.data.imdb import tokenize
from lit_asyncfl.data.transforms import random_crop_flip
from lit_asyncfl.models import LogisticRegression

# -- Tiny-ImageNet ------------------------------------------------------------------------------------------------


def make_tiny_imagenet(root, wnids=("n02", "n01", "n03"), per_class=3, n_val=4):
    from PIL import Image

    rng = np.random.default_rng(0)
    base = root / "tiny-imagenet-200"
    (base / "val" / "images").mkdir(parents=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")  # not sorted on purpose
    for w in wnids:
        (base / "train" / w / "images").mkdir(parents=True)
        (base / "train" / w / f"{w}_boxes.txt").write_text("")  # present in the real layout, ignored
        for i in range(per_class):
            mode = "L" if i == 0 else "RGB"  # the real set has a few greyscale images
            shape = (64, 64) if mode == "L" else (64, 64, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(
                base / "train" / w / "images" / f"{w}_{i}.JPEG"
            )
    lines = []
    for i in range(n_val):
        name, w = f"val_{i}.JPEG", wnids[i % len(wnids)]
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(base / "val" / "images" / name)
        lines.append(f"{name}\t{w}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return base


def test_tiny_imagenet_folder_layout_loads_with_sorted_wnid_labels(tmp_path):
    from PIL import Image

    base = make_tiny_imagenet(tmp_path)
    dm = TinyImageNetDataModule(root=str(tmp_path))
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == (9, 3, 64, 64) and x.dtype == torch.uint8
    # labels follow the sorted wnids: n01 -> 0, n02 -> 1, n03 -> 2; files are read per class in sorted order
    assert y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    reference = np.asarray(Image.open(base / "train" / "n02" / "images" / "n02_1.JPEG").convert("RGB"))
    assert x[4].permute(1, 2, 0).numpy().tolist() == reference.tolist()
    grey = np.asarray(Image.open(base / "train" / "n01" / "images" / "n01_0.JPEG").convert("RGB"))
    assert x[0].permute(1, 2, 0).numpy().tolist() == grey.tolist()
    x_test, y_test = dm.test_set.tensors
    assert y_test.tolist() == [1, 0, 2, 1]  # val_i is labelled wnids[i % 3] = n02, n01, n03, n02
    assert x_test.dtype == torch.float32 and x_test.shape == (4, 3, 64, 64)
    val0 = np.asarray(Image.open(base / "val" / "images" / "val_0.JPEG").convert("RGB"))
    expected = (torch.tensor(val0[5, 7], dtype=torch.float32) / 255 - torch.tensor(dm.mean)) / torch.tensor(dm.std)
    assert torch.allclose(x_test[0, :, 5, 7], expected, atol=1e-6)


def test_tiny_imagenet_unknown_wnid_in_annotations_is_named(tmp_path):
    base = make_tiny_imagenet(tmp_path)
    (base / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99\t0\t0\t1\t1\n")
    with pytest.raises(ValueError, match="n99"):
        TinyImageNetDataModule(root=str(tmp_path)).setup("fit")


# -- IMDb ---------------------------------------------------------------------------------------------------------


def make_imdb(root):
    reviews = {
        ("train", "pos"): ["A great, great film.", "Great acting<br />great story"],
        ("train", "neg"): ["A bad film.", "Bad bad BAD.", "boring"],
        ("test", "pos"): ["great"],
        ("test", "neg"): ["unseen words, bad"],
    }
    for (split, label), texts in reviews.items():
        folder = root / "aclImdb" / split / label
        folder.mkdir(parents=True)
        for i, text in enumerate(texts):
            (folder / f"{i}_{7 if label == 'pos' else 2}.txt").write_text(text)
    (root / "aclImdb" / "imdb.vocab").write_text("ignored\n")
    return reviews


def test_imdb_folder_layout_tokenises_and_encodes_with_a_training_vocabulary(tmp_path):
    make_imdb(tmp_path)
    dm = IMDbDataModule(root=str(tmp_path), vocab_size=5, max_length=4)
    dm.setup("fit")
    # training counts: great 4, bad 4, a 2, film 2, acting/story/boring 1 -> top 3 by count, then alphabetically
    assert dm.vocabulary == ["<pad>", "<unk>", "bad", "great", "a"]
    x, y = dm.train_set.tensors
    assert y.tolist() == [1, 1, 0, 0, 0]  # pos files first, then neg
    assert x.tolist() == [
        [4, 3, 3, 1],  # a great great film (truncated to 4; film is not in the vocabulary)
        [3, 1, 3, 1],  # great acting great story
        [4, 2, 1, 0],  # a bad film + padding
        [2, 2, 2, 0],
        [1, 0, 0, 0],
    ]
    x_test, y_test = dm.test_set.tensors
    assert x_test.tolist() == [[3, 0, 0, 0], [1, 1, 2, 0]] and y_test.tolist() == [1, 0]


def test_tokenize_drops_html_breaks_and_lowercases():
    assert tokenize("Bad.<br /><br />VERY bad!") == ["bad", "very", "bad"]


# -- missing data ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [TinyImageNetDataModule, IMDbDataModule])
def test_missing_data_names_the_path_and_the_download_option(tmp_path, cls):
    with pytest.raises(FileNotFoundError, match=r"nowhere.*missing.*download=True"):
        cls(root=str(tmp_path / "nowhere")).setup("fit")


# -- Synthetic(alpha, beta) ----------------------------------------------------------------------------------------


def test_synthetic_labels_are_the_argmax_of_each_clients_softmax_model():
    clients = generate_synthetic(1.0, 1.0, num_clients=5, seed=3)
    for c in clients:
        logits = torch.tensor(c.x @ c.w.T + c.b)
        assert torch.equal(torch.softmax(logits, dim=1).argmax(dim=1), torch.tensor(c.y))
        assert c.w.shape == (10, 60) and c.b.shape == (10,) and len(c.x) >= 50


def test_synthetic_draws_follow_the_definition():
    """Over many clients: u_k ~ N(0, alpha), B_k ~ N(0, beta); W_k and b_k entries ~ N(u_k, 1); v_k ~ N(B_k, 1);
    x ~ N(v_k, diag(j^-1.2))."""
    alpha, beta = 2.0, 0.5
    clients = generate_synthetic(alpha, beta, num_clients=400, seed=0)
    u = np.array([c.u for c in clients])
    big_b = np.array([c.big_b for c in clients])
    assert abs(u.std() - alpha) < 0.2 and abs(big_b.std() - beta) < 0.05
    w_dev = np.concatenate([np.concatenate([(c.w - c.u).ravel(), c.b - c.u]) for c in clients[:50]])
    v_dev = np.concatenate([c.v - c.big_b for c in clients[:50]])
    assert abs(w_dev.mean()) < 0.03 and abs(w_dev.std() - 1) < 0.03 and abs(v_dev.std() - 1) < 0.05
    big = max(clients, key=lambda c: len(c.x))
    spread = (big.x - big.v).std(axis=0)
    assert len(big.x) > 2000
    assert np.allclose(spread[[0, 9, 59]], np.power([1.0, 10.0, 60.0], -0.6), rtol=0.1)


def test_synthetic_iid_shares_one_model_and_same_seed_same_data():
    iid = generate_synthetic(0.0, 0.0, num_clients=3, iid=True, seed=1)
    assert all(np.array_equal(c.w, iid[0].w) for c in iid) and all(np.allclose(c.v, 0) for c in iid)
    a, b = SyntheticDataModule(num_clients=6), SyntheticDataModule(num_clients=6)
    a.setup("fit")
    b.setup("fit")
    assert all(torch.equal(s, t) for s, t in zip(a.train_set.tensors, b.train_set.tensors))
    other = SyntheticDataModule(num_clients=6, data_seed=1)
    other.setup("fit")
    assert not torch.equal(a.train_set.tensors[0][:50], other.train_set.tensors[0][:50])


def test_synthetic_natural_partition_gives_each_client_its_own_samples():
    dm = SyntheticDataModule(alpha=0.5, beta=0.5, num_clients=4)
    dm.setup("fit")
    shards = dm.client_shards(num_clients=4, seed=0)
    for k, client in enumerate(dm.clients):
        n_train = int(0.9 * len(client.y))
        assert shards.num_samples(k) == n_train
        rows = shards.inputs[shards.indices[k]].double().numpy()
        assert np.allclose(rows, client.x[:n_train], atol=1e-6)
    assert len(dm.test_set) == sum(len(c.y) - int(0.9 * len(c.y)) for c in dm.clients)
    with pytest.raises(ValueError, match="generated 4 clients but the trainer has num_clients=5"):
        dm.client_shards(num_clients=5, seed=0)


def test_natural_partition_names_clients_left_without_samples():
    from lit_asyncfl.data import Natural

    with pytest.raises(ValueError, match=r"clients \[1\] have no training samples"):
        Natural()(np.zeros(4, dtype=np.int64), 3, np.random.default_rng(0), groups=np.array([0, 0, 2, 2]))
    with pytest.raises(ValueError, match="assigns samples to client 2, but num_clients=2"):
        Natural()(np.zeros(4, dtype=np.int64), 2, np.random.default_rng(0), groups=np.array([0, 1, 2, 2]))


def test_natural_partition_survives_a_server_data_split():
    dm = SyntheticDataModule(num_clients=3)
    dm.setup("fit")
    full_x = dm.train_set.tensors[0].clone()
    dm.split_server_data(0.1, seed=0)
    shards = dm.client_shards(num_clients=3, seed=0)
    for k, client in enumerate(dm.clients):
        rows = shards.inputs[shards.indices[k]]
        own = torch.as_tensor(client.x[: int(0.9 * len(client.y))], dtype=torch.float32)
        assert all(any(torch.equal(r, o) for o in own) for r in rows[:5])  # still this client's samples
    assert sum(shards.num_samples(k) for k in range(3)) + len(dm.server_set) == len(full_x)


# -- tabular ------------------------------------------------------------------------------------------------------


def test_diabetes_is_a_standardised_regression_set_that_refuses_label_partitions():
    from sklearn.datasets import load_diabetes

    dm = DiabetesDataModule()
    dm.setup("fit")
    x, y = dm.train_set.tensors
    assert x.shape == (353, 10) and y.dtype == torch.float32
    assert torch.allclose(x.mean(0), torch.zeros(10), atol=1e-5) and abs(float(y.mean())) < 1e-5
    raw = load_diabetes().target
    restored = y.double().numpy() * dm.target_std + dm.target_mean  # the raw targets come back
    assert np.abs(restored[:, None] - raw[None, :]).min(axis=1).max() < 1e-3
    assert dm.target_mean == pytest.approx(restored.mean()) and dm.target_std == pytest.approx(restored.std())
    bad = DiabetesDataModule(partition="dirichlet", alpha=0.5)
    bad.setup("fit")
    with pytest.raises(ValueError, match=r"integer labels.*'iid' or 'quantity'"):
        bad.client_shards(num_clients=5, seed=0)


def test_breast_cancer_is_a_stratified_binary_set():
    dm = BreastCancerDataModule()
    dm.setup("fit")
    y_train, y_test = dm.train_set.tensors[1], dm.test_set.tensors[1]
    assert dm.train_set.tensors[0].shape == (455, 30) and set(y_train.tolist()) == {0, 1}
    assert abs(float(y_train.float().mean()) - float(y_test.float().mean())) < 0.02  # stratified


# -- augmentation ---------------------------------------------------------------------------------------------------


def test_random_crop_flip_matches_an_explicit_per_image_crop():
    x = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    out = random_crop_flip(x, padding=2, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    offsets = torch.randint(0, 5, (2, 6), generator=g)
    flips = torch.rand(6, generator=g) < 0.5
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(6):
        r, c = int(offsets[0, i]), int(offsets[1, i])
        crop = padded[i, :, r : r + 8, c : c + 8]
        assert torch.equal(out[i], crop.flip(-1) if flips[i] else crop)


def test_cifar_augmentation_is_applied_per_client_batch_and_reproducibly(tmp_path):
    from builders import make_cifar

    make_cifar(tmp_path, per_batch=4)
    plain = CIFAR10DataModule(root=str(tmp_path))
    augmented = CIFAR10DataModule(root=str(tmp_path), augmentation=True)
    batches = {}
    for name, dm in (("plain", plain), ("aug", augmented), ("aug2", augmented)):
        dm.setup("fit")
        shards = dm.client_shards(num_clients=2, seed=0)
        batches[name] = next(shards.batches(0, batch_size=10, generator=torch.Generator().manual_seed(1)))[0]
    assert torch.equal(batches["aug"], batches["aug2"])  # same generator, same crops
    assert not torch.equal(batches["plain"], batches["aug"])
    assert batches["aug"].dtype == torch.float32 and batches["aug"].shape == batches["plain"].shape


# -- partitions -----------------------------------------------------------------------------------------------------


def test_speed_matched_gives_the_largest_shards_to_the_slowest_devices():
    targets = np.zeros(600, dtype=np.int64)
    slowness = np.random.default_rng(0).uniform(1, 5, 12)
    rng = np.random.default_rng(1)
    parts = SpeedMatched(base=QuantitySkew(a=0.5))(targets, 12, rng, slowness=slowness)
    sizes = np.array([len(p) for p in parts])
    assert np.array_equal(np.argsort(-sizes, kind="stable"), np.argsort(-slowness, kind="stable"))
    # same shards as the base partition with the same generator, only placed differently
    base = QuantitySkew(a=0.5)(targets, 12, np.random.default_rng(1))
    assert sorted(map(len, base)) == sorted(sizes)


def test_speed_matched_on_classes_puts_the_hard_class_on_the_slowest():
    targets = np.repeat(np.arange(5), 40)
    slowness = np.array([1.0, 4.0, 2.0, 8.0, 3.0, 5.0, 0.5, 6.0])
    p = SpeedMatched(base=Dirichlet(alpha=0.2), key="classes", classes=[4], slowest_get="most")
    parts = p(targets, 8, np.random.default_rng(0), slowness=slowness)
    hard = np.array([(targets[q] == 4).sum() for q in parts])
    by_speed = hard[np.argsort(-slowness)]  # slowest first
    assert np.all(np.diff(by_speed) <= 0) and by_speed[0] > by_speed[-1]
    with pytest.raises(ValueError, match="slowest_get"):
        SpeedMatched(slowest_get="fastest")


def test_partition_description_is_saved_with_the_run(tmp_path):
    from lit_asyncfl.data import DigitsDataModule

    trainer = make_trainer(tmp_path, FedAsync(concurrency=2), num_clients=6, max_versions=2)
    dm = DigitsDataModule(partition="dirichlet", alpha=0.5)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=dm)
    rows = list(csv.DictReader(open(f"{trainer.log_dir}/partition.csv")))
    targets = dm.train_set.tensors[1].numpy()
    shards = trainer.simulator.executor.trainer.shards  # the run's own split, counted here independently
    expected = np.stack([np.bincount(targets[idx], minlength=10) for idx in shards.indices_numpy()])
    assert [int(r["num_samples"]) for r in rows] == expected.sum(1).tolist()
    assert [[int(r[f"class_{k}"]) for k in range(10)] for r in rows] == expected.tolist()
    slowness = trainer.simulator.profiles.time_per_sample
    assert [float(r["seconds_per_sample"]) for r in rows] == pytest.approx(slowness.tolist(), rel=1e-5)
    assert (Path(trainer.log_dir) / "partition.png").stat().st_size > 0


def test_partition_counts_fall_back_to_sizes_for_targets_that_are_not_class_labels():
    parts = [np.array([0, 1]), np.array([2])]
    assert partition_counts(np.array([-1, 1, 1]), parts).tolist() == [[2], [1]]
    assert partition_counts(np.zeros((3, 4), dtype=np.int64), parts).tolist() == [[2], [1]]
    assert partition_counts(np.array([0.5, 1.5, 2.5]), parts).tolist() == [[2], [1]]


def test_compactly_stored_images_reach_every_consumer_as_model_inputs(tmp_path):
    """uint8 training images are standardised for clients, for the pooled train loader, for validation, for the
    server's data, and through a PartitionedDataModule wrapper."""
    from builders import make_cifar

    from lit_asyncfl.data import PartitionedDataModule

    make_cifar(tmp_path, per_batch=4)
    dm = CIFAR10DataModule(root=str(tmp_path), val_fraction=0.25)
    dm.setup("fit")
    raw_x = dm.train_set.tensors[0]
    expected = (raw_x[:1].float() / 255 - torch.tensor(dm.mean).view(1, 3, 1, 1)) / torch.tensor(dm.std).view(
        1, 3, 1, 1
    )
    x, _ = next(iter(torch.utils.data.DataLoader(dm.train_set, batch_size=1, collate_fn=dm._collate_prepared)))
    assert torch.allclose(x, expected)
    assert next(iter(dm.train_dataloader()))[0].dtype == torch.float32
    val_x = dm.val_set.tensors[0]
    assert val_x.dtype == torch.float32 and abs(float(val_x.mean())) < 1.0
    server = dm.split_server_data(0.2, seed=0)
    assert server.tensors[0].dtype == torch.float32
    wrapped = PartitionedDataModule(CIFAR10DataModule(root=str(tmp_path)), partition="iid")
    wrapped.setup("fit")
    shards = wrapped.client_shards(num_clients=2, seed=0)
    batch = next(shards.batches(0, batch_size=4, generator=torch.Generator()))
    assert batch[0].dtype == torch.float32 and batch[0].shape[1:] == (3, 32, 32)


def test_mnist_augmentation_crops_but_never_flips():
    """Through the data modules' own augment: digits are never mirrored, CIFAR images sometimes are."""
    from lit_asyncfl.data import MNISTDataModule

    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.uint8).view(2, 1, 5, 5)
    mnist = MNISTDataModule(augmentation=True, crop_padding=0)
    cifar = CIFAR10DataModule(augmentation=True, crop_padding=0)
    flipped = 0
    for seed in range(20):
        assert torch.equal(mnist.augment(x, torch.Generator().manual_seed(seed)), x)  # no padding, no flip
        out = cifar.augment(x, torch.Generator().manual_seed(seed))
        flipped += int(torch.equal(out[0], x[0].flip(-1)))
    assert 0 < flipped < 20


def test_a_text_model_smaller_than_the_vocabulary_is_refused_before_training(tmp_path):
    from lit_asyncfl.models import TextCNN

    make_imdb(tmp_path / "data")
    trainer = make_trainer(tmp_path, FedAsync(concurrency=1), num_clients=2, max_versions=1)
    dm = IMDbDataModule(root=str(tmp_path / "data"), vocab_size=50, max_length=8)
    with pytest.raises(ValueError, match="vocab_size=10 is smaller than the data's vocab_size=50"):
        trainer.fit(TextCNN(vocab_size=10, embed_dim=4, num_filters=2), datamodule=dm)
