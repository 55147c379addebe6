"""A checkpoint written before a setting existed resumes when the setting keeps its default, and is refused naming the
setting otherwise: the keys that descriptions gained (a partition's ``distinct_classes``, ``Natural``'s ``column``,
the DP accountant, the data module's ``shuffle``) read as their defaults where a checkpoint lacks them."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_trainer

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.algorithms import FedAsync
from lit_asyncfl.client_callbacks.privacy import LocalGaussianNoise
from lit_asyncfl.data import DigitsDataModule
from lit_asyncfl.data.partition import Natural, Shards
from lit_asyncfl.hparams import describe
from lit_asyncfl.models import LogisticRegression
from lit_asyncfl.privacy import DifferentiallyPrivate
from lit_asyncfl.server.privacy import GaussianAggregateNoise

pytest.importorskip("opacus")


def _algorithm(accountant="rdp"):
    return DifferentiallyPrivate(FedAsync(concurrency=2), clip_norm=1.0, noise_multiplier=0.5, accountant=accountant)


def _fit(root, max_versions, partition=None, accountant="rdp", ckpt_path=None):
    trainer = make_trainer(root, _algorithm(accountant), max_versions=max_versions)
    data = DigitsDataModule(partition=partition if partition is not None else Shards(2))
    torch.manual_seed(0)
    trainer.fit(LogisticRegression(input_dim=64), datamodule=data, ckpt_path=ckpt_path)
    return trainer


def _without(fingerprint, paths):
    """``fingerprint`` as a version before the keys at ``paths`` (tuples of keys and list indices) wrote it."""
    older = copy.deepcopy(fingerprint)
    for path in paths:
        entry = older
        for step in path[:-1]:
            entry = entry[step]
        del entry[path[-1]]
    return older


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A run's last checkpoint rewritten as before this session's keys existed, and the run's own fingerprint."""
    root = tmp_path_factory.mktemp("older")
    _fit(root / "a", 3)
    path = next((root / "a").rglob("last.ckpt"))
    checkpoint = torch.load(path, weights_only=True)
    fingerprint = checkpoint["lit_asyncfl"]["fingerprint"]
    callbacks = fingerprint["algorithm"]["server_callbacks"]
    noise = [i for i, cb in enumerate(callbacks) if cb["class"] == "GaussianAggregateNoise"]
    assert len(noise) == 1
    new_keys = [
        ("data", "shuffle"),
        ("data", "train_columns"),
        ("data", "partitioner", "distinct_classes"),
        ("algorithm", "server_callbacks", noise[0], "accountant"),
        ("algorithm", "hparams", "accountant"),
    ]
    checkpoint["lit_asyncfl"]["fingerprint"] = _without(fingerprint, new_keys)  # KeyError: a key is not there
    checkpoint["lit_asyncfl"].pop("checksum", None)
    older = root / "older.ckpt"
    ckpt.save(checkpoint, older)
    return older, checkpoint, fingerprint


def test_a_checkpoint_from_before_the_new_keys_resumes_with_their_defaults(written, tmp_path):
    older, _, _ = written
    resumed = _fit(tmp_path / "b", 6, ckpt_path=str(older))
    assert resumed.summary["versions"] == 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"partition": Shards(2, distinct_classes=True)},
            r"data\.partitioner\.distinct_classes: checkpoint False vs trainer True",
        ),
        ({"accountant": "prv"}, r"algorithm\.server_callbacks\[\d\]\.accountant: checkpoint 'rdp' vs trainer 'prv'"),
    ],
    ids=["distinct_classes", "accountant"],
)
def test_a_checkpoint_from_before_a_key_is_refused_with_another_value_naming_it(written, tmp_path, change, message):
    older, _, _ = written
    with pytest.raises(ValueError, match=f"different configuration: .*{message}"):
        _fit(tmp_path / "c", 6, ckpt_path=str(older), **change)


@pytest.mark.parametrize(
    ("component", "other"),
    [
        (Shards(2), Shards(2, distinct_classes=True)),
        (Natural(), Natural("writer")),
        (GaussianAggregateNoise(1.0), GaussianAggregateNoise(1.0, accountant="prv")),
        (LocalGaussianNoise(1.0, 1.0), LocalGaussianNoise(1.0, 1.0, accountant="prv")),
        (LocalGaussianNoise(1.0, 1.0), LocalGaussianNoise(1.0, 1.0, max_epsilon=50.0)),
    ],
    ids=["shards", "natural", "central-noise", "local-noise-accountant", "local-noise-budget"],
)
def test_every_key_a_description_gained_reads_as_its_default(written, component, other):
    """Wherever the component sits (here in a list, as callbacks do), its description without the keys it gained
    equals today's default description, and differs from another value of them, which is named."""
    _, checkpoint, fingerprint = written
    cls = type(component).__qualname__
    new = ckpt.DESCRIPTION_BEFORE_ITS_KEY[cls]
    today = describe(component)
    assert {key: today[key] for key in new} == new  # the table holds today's defaults
    theirs = copy.deepcopy(checkpoint)
    theirs["lit_asyncfl"]["fingerprint"] = {**fingerprint, "parts": [_without(today, [(key,) for key in new])]}
    ckpt.run_entries(theirs, "older.ckpt", {**fingerprint, "parts": [today]})  # accepted
    changed = [key for key in new if describe(other)[key] != today[key]]
    with pytest.raises(ValueError, match=rf"parts\[0\]\.{changed[0]}: checkpoint .* vs trainer"):
        ckpt.run_entries(theirs, "older.ckpt", {**fingerprint, "parts": [describe(other)]})


def test_a_key_absent_from_the_resuming_fingerprint_is_not_added():
    """A data module that is not a FederatedDataModule has no ``shuffle``: nothing is filled in for it."""
    theirs = {"data": {"class": "Mine", "size": 3}}
    assert ckpt.fill_keys_before_them(theirs, {"data": {"class": "Mine", "size": 3}}) == theirs
    assert ckpt.fill_keys_before_them(theirs, {"data": {"class": "Mine", "size": 3, "shuffle": False}}) == {
        "data": {"class": "Mine", "size": 3, "shuffle": True}
    }
