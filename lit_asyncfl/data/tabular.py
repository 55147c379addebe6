"""scikit-learn's bundled tabular datasets (no download): diabetes (regression) and breast cancer (binary)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lit_asyncfl.checks import check_fraction
from lit_asyncfl.data.base import EVAL_BATCH_SIZE, PARTITION, SPLIT_SEED, VAL_FRACTION, FederatedDataModule
from lit_asyncfl.data.partition import PartitionArg


def held_out_split(
    num_samples: int, test_fraction: float, seed: int, labels: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Train and test indices of a fixed held-out split (stratified by ``labels`` when given).

    Example:
        >>> train, test = held_out_split(10, 0.2, seed=0)
        >>> len(train), len(test), sorted([*train, *test]) == list(range(10))
        (8, 2, True)
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    from sklearn.model_selection import train_test_split

    train, test = train_test_split(np.arange(num_samples), test_size=test_fraction, stratify=labels, random_state=seed)
    return np.asarray(train), np.asarray(test)


class TabularDataModule(FederatedDataModule):
    """A scikit-learn bundled dataset, features standardised with the training split's statistics.

    Args:
        partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed: The federated split's
            (:class:`~lit_asyncfl.data.FederatedDataModule`'s arguments, see there;
            label partitions need a classification task).
        test_fraction: Fraction held out for testing (stratified for classification).
    """

    #: ``"classification"`` (long labels) or ``"regression"`` (float targets).
    task = "classification"

    def __init__(
        self,
        partition: PartitionArg = PARTITION,
        alpha: float | None = None,
        batch_size: int = 10,
        eval_batch_size: int = EVAL_BATCH_SIZE,
        test_fraction: float = 0.2,
        val_fraction: float = VAL_FRACTION,
        split_seed: int = SPLIT_SEED,
    ) -> None:
        super().__init__(partition, alpha, batch_size, eval_batch_size, val_fraction, split_seed)
        check_fraction("test_fraction", test_fraction, open_min=True, open_max=True)
        self.test_fraction = test_fraction

    def load(self) -> Any:
        """The scikit-learn ``Bunch`` (``data``, ``target``)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        bunch = self.load()
        x = np.asarray(bunch.data, dtype=np.float64)
        y = np.asarray(bunch.target)
        classify = self.task == "classification"
        train, test = held_out_split(len(y), self.test_fraction, self.split_seed, y if classify else None)
        mean, std = x[train].mean(axis=0), x[train].std(axis=0)
        x = (x - mean) / np.where(std > 0, std, 1.0)
        if classify:
            targets = torch.as_tensor(y, dtype=torch.long)
        else:
            self.target_mean, self.target_std = float(y[train].mean()), float(y[train].std())
            targets = torch.as_tensor((y - self.target_mean) / self.target_std, dtype=torch.float32)
        inputs = torch.as_tensor(x, dtype=torch.float32)
        train_t, test_t = torch.as_tensor(train), torch.as_tensor(test)
        self.assign_splits(inputs[train_t], targets[train_t], inputs[test_t], targets[test_t])


class DiabetesDataModule(TabularDataModule):
    """Diabetes progression (442 patients, 10 features, a real-valued target): the offline regression task.

    Targets are standardised with the training split's mean and standard deviation (``target_mean``,
    ``target_std``), so MSE is in units of the target's spread and R^2 is unchanged. It stands in for ASFL's
    Boston-housing regression (no longer shipped with scikit-learn). Use with
    :class:`~lit_asyncfl.models.LinearRegression`.

    Example:
        >>> dm = DiabetesDataModule()
        >>> dm.setup("fit")
        >>> len(dm.train_set), len(dm.test_set), dm.train_set.tensors[1].dtype
        (353, 89, torch.float32)
    """

    task = "regression"
    input_shape = (10,)

    def load(self) -> Any:
        from sklearn.datasets import load_diabetes

        return load_diabetes()


class BreastCancerDataModule(TabularDataModule):
    """Breast-cancer Wisconsin (569 samples, 30 features, malignant 0 / benign 1): the offline SVM task.

    It stands in for ASFL's KDD Cup'99 intrusion detection (a download). Use with
    :class:`~lit_asyncfl.models.LinearSVM`.

    Example:
        >>> dm = BreastCancerDataModule()
        >>> dm.setup("fit")
        >>> len(dm.train_set), len(dm.test_set), int(dm.train_set.tensors[1].max()) + 1
        (455, 114, 2)
    """

    num_classes = 2
    input_shape = (30,)

    def load(self) -> Any:
        from sklearn.datasets import load_breast_cancer

        return load_breast_cancer()
