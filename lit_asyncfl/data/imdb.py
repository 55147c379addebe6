"""IMDb movie reviews (binary sentiment) from the standard ``aclImdb`` folders, with a built-in tokenizer."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch import Tensor

from lit_asyncfl.checks import check_bool, check_int, check_path
from lit_asyncfl.data.base import (
    EVAL_BATCH_SIZE,
    PARTITION,
    SPLIT_SEED,
    VAL_FRACTION,
    FederatedDataModule,
    require_files,
)
from lit_asyncfl.data.partition import PartitionArg

PAD, UNKNOWN = 0, 1
_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens; HTML line breaks (``<br />``, frequent in IMDb) are dropped.

    Example:
        >>> tokenize("Great film!<br /><br />Didn't like the END, though.")
        ['great', 'film', "didn't", 'like', 'the', 'end', 'though']
    """
    return _TOKEN.findall(text.replace("<br />", " ").lower())


def build_vocabulary(texts: Iterable[list[str]], size: int) -> list[str]:
    """The ``size - 2`` most frequent tokens (ties by token), after the padding and unknown entries.

    Example:
        >>> build_vocabulary([["b", "a", "b"], ["c", "a"]], size=4)
        ['<pad>', '<unk>', 'a', 'b']
    """
    if size < 3:
        raise ValueError(f"vocabulary size must be >= 3 (padding, unknown and one word), got {size}")
    counts = Counter(token for tokens in texts for token in tokens)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: size - 2]
    return ["<pad>", "<unk>", *(token for token, _ in ranked)]


def encode(tokens: list[str], index: dict[str, int], max_length: int) -> list[int]:
    """Token ids, truncated to ``max_length`` and right-padded with 0.

    Example:
        >>> encode(["a", "zzz"], {"a": 2}, max_length=4)
        [2, 1, 0, 0]
    """
    ids = [index.get(t, UNKNOWN) for t in tokens[:max_length]]
    return ids + [PAD] * (max_length - len(ids))


class IMDbDataModule(FederatedDataModule):
    """IMDb (25,000 training + 25,000 test reviews, positive = 1 / negative = 0) from ``<root>/aclImdb/``.

    Reads ``{train,test}/{pos,neg}/*.txt`` (files in sorted order), tokenises with :func:`tokenize`, builds the
    vocabulary from the training reviews only (the ``vocab_size - 2`` most frequent words; 0 = padding,
    1 = unknown) and encodes every review as ``max_length`` token ids — inputs for
    :class:`~lit_asyncfl.models.TextCNN`. ``download=True`` fetches the archive from ai.stanford.edu.

    Args:
        root: Directory holding ``aclImdb/``.
        download: Download and extract the archive when missing (needs a network).
        vocab_size: Vocabulary size including the padding and unknown entries.
        max_length: Tokens kept per review (truncated / padded).
        partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed: The federated split's
            (:class:`~lit_asyncfl.data.FederatedDataModule`'s arguments, see there).

    Example:
        >>> IMDbDataModule(root="/data").expected_files()[0].as_posix()
        '/data/aclImdb/train/pos'
    """

    num_classes = 2
    folder = "aclImdb"
    url = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"

    def __init__(
        self,
        root: str = "data",
        download: bool = False,
        vocab_size: int = 20_000,
        max_length: int = 256,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        batch_size: int = 32,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        val_fraction: float = VAL_FRACTION,
        split_seed: int = SPLIT_SEED,
    ) -> None:
        super().__init__(partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed)
        check_path("root", root)
        check_bool("download", download)
        check_int("vocab_size", vocab_size, 3)  # padding, unknown and one word
        check_int("max_length", max_length, 1)
        self.root = root
        self.download = download
        self.vocab_size = vocab_size
        self.max_length = max_length
        #: The vocabulary (token of each id) after :meth:`setup`.
        self.vocabulary: list[str] = []

    def check_model(self, model: L.LightningModule) -> None:
        """A text model's embedding must cover the vocabulary (else an IndexError deep in ``nn.Embedding``)."""
        model_vocab = model.hparams.get("vocab_size")
        if isinstance(model_vocab, int) and model_vocab < self.vocab_size:
            raise ValueError(
                f"the model's vocab_size={model_vocab} is smaller than the data's vocab_size={self.vocab_size}: "
                "set both to the same value (--model.init_args.vocab_size and --data.init_args.vocab_size)"
            )

    def expected_files(self) -> list[Path]:
        base = Path(self.root) / self.folder
        return [base / split / label for split in ("train", "test") for label in ("pos", "neg")]

    def prepare_data(self) -> None:
        if self.download and any(not p.exists() for p in self.expected_files()):
            from torchvision.datasets.utils import download_and_extract_archive

            download_and_extract_archive(self.url, download_root=self.root)

    def _read_split(self, split: str) -> tuple[list[list[str]], np.ndarray]:
        texts: list[list[str]] = []
        labels: list[int] = []
        for label, name in ((1, "pos"), (0, "neg")):
            files = sorted((Path(self.root) / self.folder / split / name).glob("*.txt"))
            texts += [tokenize(f.read_text(encoding="utf-8", errors="replace")) for f in files]
            labels += [label] * len(files)
        if not texts:
            raise FileNotFoundError(f"no reviews (*.txt) under {Path(self.root) / self.folder / split}")
        return texts, np.array(labels, dtype=np.int64)

    def _encode_all(self, texts: list[list[str]], index: dict[str, int]) -> Tensor:
        return torch.tensor([encode(t, index, self.max_length) for t in texts], dtype=torch.long)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        require_files(self, self.root, self.expected_files())
        train_texts, y_train = self._read_split("train")
        test_texts, y_test = self._read_split("test")
        self.vocabulary = build_vocabulary(train_texts, self.vocab_size)
        index = {token: i for i, token in enumerate(self.vocabulary)}
        self.assign_splits(
            self._encode_all(train_texts, index),
            torch.from_numpy(y_train),
            self._encode_all(test_texts, index),
            torch.from_numpy(y_test),
        )
