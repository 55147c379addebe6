"""scikit-learn's bundled handwritten digits: a real dataset that needs no download."""

from __future__ import annotations

import torch

from lit_asyncfl.data.tabular import TabularDataModule, held_out_split


class DigitsDataModule(TabularDataModule):
    """The 1,797 8x8 handwritten digits of scikit-learn (UCI optdigits test set), as standardised ``(1, 8, 8)`` images.

    A stratified held-out test split (``test_fraction``) is drawn with a fixed ``split_seed``, so every run and
    every algorithm is evaluated on the same images; the training rest is split into clients.

    Args:
        partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed: The federated split's
            (:class:`~lit_asyncfl.data.FederatedDataModule`'s arguments, see there;
            ``split_seed`` draws the test split too).
        test_fraction: Fraction of the data held out for testing.

    Example:
        >>> dm = DigitsDataModule(partition="dirichlet", alpha=0.5)
        >>> dm.setup("fit")
        >>> len(dm.train_set), len(dm.test_set), tuple(dm.train_set[0][0].shape)
        (1437, 360, (1, 8, 8))
    """

    num_classes = 10
    input_shape = (1, 8, 8)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        train_idx, test_idx = held_out_split(len(y), self.test_fraction, self.split_seed, y.numpy())
        # Standardise with the training split's statistics (the held-out images stay unseen).
        mean, std = x[train_idx].mean(), x[train_idx].std()
        x = (x - mean) / std
        self.assign_splits(x[train_idx], y[train_idx], x[test_idx], y[test_idx])
