"""FedProx's Synthetic(alpha, beta): naturally non-IID data generated per client (numpy only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lit_asyncfl.checks import check, check_bool, check_fraction, check_int, check_number
from lit_asyncfl.data.base import FederatedDataModule
from lit_asyncfl.data.partition import Natural, PartitionArg


@dataclass
class SyntheticClient:
    """The generating parameters and samples of one client (kept for inspection and tests).

    Attributes:
        u: Mean of the entries of ``W`` and ``b`` (:math:`u_k \\sim N(0, \\alpha)`).
        big_b: Mean of the entries of ``v`` (:math:`B_k \\sim N(0, \\beta)`).
        v: Mean of the inputs (:math:`v_k`, entries :math:`\\sim N(B_k, 1)`).
        w: Weights ``(num_classes, dimension)``.
        b: Biases ``(num_classes,)``.
        x: Inputs ``(n_k, dimension)``.
        y: Labels :math:`\\arg\\max \\mathrm{softmax}(W x + b)`.
    """

    u: float
    big_b: float
    v: np.ndarray
    w: np.ndarray
    b: np.ndarray
    x: np.ndarray
    y: np.ndarray


def generate_synthetic(
    alpha: float,
    beta: float,
    num_clients: int,
    dimension: int = 60,
    num_classes: int = 10,
    iid: bool = False,
    seed: int = 0,
) -> list[SyntheticClient]:
    r"""Generate Synthetic(alpha, beta) of Li et al. (FedProx, 2020), following their generator.

    For client :math:`k`: :math:`u_k \sim N(0, \alpha)`, :math:`B_k \sim N(0, \beta)`; the entries of
    :math:`W_k \in \mathbb{R}^{C \times d}` and :math:`b_k` are :math:`\sim N(u_k, 1)`, those of :math:`v_k \sim
    N(B_k, 1)`; :math:`x \sim N(v_k, \Sigma)` with diagonal :math:`\Sigma_{jj} = j^{-1.2}`; the label is
    :math:`\arg\max \mathrm{softmax}(W_k x + b_k)`. Client sizes are :math:`\lfloor \mathrm{LogNormal}(4, 2)
    \rfloor + 50`. With ``iid=True`` all clients share one :math:`W, b` and :math:`v_k = B_k \mathbf{1}`
    (the paper's "Synthetic-IID" uses :math:`W, b \sim N(0, 1)` and :math:`v = 0`; here ``alpha = beta = 0``
    gives exactly that). :math:`N(m, s)` takes the standard deviation ``s``, as the reference code does.

    Example:
        >>> clients = generate_synthetic(1.0, 1.0, num_clients=3, seed=0)
        >>> [c.x.shape[1] for c in clients], all(len(c.x) >= 50 for c in clients)
        ([60, 60, 60], True)
    """
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    if num_clients < 1 or dimension < 1 or num_classes < 2:
        raise ValueError(
            f"need num_clients >= 1, dimension >= 1, num_classes >= 2; got {num_clients}, {dimension}, {num_classes}"
        )
    rng = np.random.default_rng([seed, 0x5717])
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + 50
    u = rng.normal(0, alpha, num_clients)
    big_b = rng.normal(0, beta, num_clients)
    std = np.power(np.arange(1, dimension + 1, dtype=np.float64), -1.2) ** 0.5
    shared_w = rng.normal(0, 1, (num_classes, dimension))
    shared_b = rng.normal(0, 1, num_classes)
    clients = []
    for k in range(num_clients):
        v = np.full(dimension, big_b[k]) if iid else rng.normal(big_b[k], 1, dimension)
        w = shared_w if iid else rng.normal(u[k], 1, (num_classes, dimension))
        b = shared_b if iid else rng.normal(u[k], 1, num_classes)
        x = v + rng.standard_normal((sizes[k], dimension)) * std
        y = np.argmax(x @ w.T + b, axis=1)  # argmax of softmax = argmax of the logits
        clients.append(SyntheticClient(float(u[k]), float(big_b[k]), v, w, b, x, y))
    return clients


class SyntheticDataModule(FederatedDataModule):
    r"""Synthetic(alpha, beta) with its own clients (``partition="natural"``): larger alpha, beta = more non-IID.

    Each client's samples are split ``train_fraction`` / rest into its training data and its part of the global
    test set (as in FedProx). The trainer's ``num_clients`` must equal ``num_clients`` here with the natural
    partition; another partitioner re-splits the pooled training data instead.

    Args:
        alpha: Spread of the clients' models (:math:`u_k \sim N(0, \alpha)`).
        beta: Spread of the clients' input means (:math:`B_k \sim N(0, \beta)`).
        num_clients: Number of generated clients (FedProx: 30).
        dimension: Input features ``d`` (60).
        num_classes: Classes ``C`` (10).
        iid: Generate Synthetic-IID (one shared model).
        train_fraction: Share of each client's samples used for training.
        data_seed: Seed of the generator (independent of the run seed: the dataset is fixed).
        partition: ``"natural"`` (default) or any other partition of the pooled training data.
        alpha_partition: Dirichlet concentration if ``partition="dirichlet"``.
        batch_size: Local mini-batch size.
        eval_batch_size: Batch size of global evaluation.

    Example:
        >>> dm = SyntheticDataModule(alpha=0.5, beta=0.5, num_clients=4)
        >>> dm.setup("fit")
        >>> dm.client_shards(num_clients=4, seed=0).num_clients
        4
    """

    def __init__(
        self,
        alpha: float = 1.0,
        beta: float = 1.0,
        num_clients: int = 30,
        dimension: int = 60,
        num_classes: int = 10,
        iid: bool = False,
        train_fraction: float = 0.9,
        data_seed: int = 0,
        partition: PartitionArg = "natural",
        alpha_partition: float | None = None,
        batch_size: int = 10,
        eval_batch_size: int = 1024,
    ) -> None:
        check_number("alpha", alpha, 0)
        check_number("beta", beta, 0)
        check_int("num_clients", num_clients, 1)
        check_int("dimension", dimension, 1)
        check_int("num_classes", num_classes, 2)
        check_bool("iid", iid)
        check_fraction("train_fraction", train_fraction, open_min=True, open_max=True)
        check_int("data_seed", data_seed, 0, maximum=2**32 - 1)
        check_number("alpha_partition", alpha_partition, 0, open_min=True, optional=True)
        check(
            alpha_partition is None or partition == "dirichlet",
            f"alpha_partition={alpha_partition!r} only applies to partition='dirichlet', not {partition!r}",
        )
        super().__init__(partition, alpha_partition, batch_size, eval_batch_size)
        self.alpha = alpha
        self.beta = beta
        self.num_clients = num_clients
        self.dimension = dimension
        self.num_classes = num_classes
        self.iid = iid
        self.train_fraction = train_fraction
        self.data_seed = data_seed
        self.input_shape = (dimension,)
        #: The generated clients after :meth:`setup`.
        self.clients: list[SyntheticClient] = []

    def client_shards(self, num_clients: int, seed: int, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.partitioner, Natural) and num_clients != self.num_clients:
            raise ValueError(
                f"SyntheticDataModule generated {self.num_clients} clients but the trainer has num_clients="
                f"{num_clients}: set both to the same value (or use another partition of the pooled data)"
            )
        return super().client_shards(num_clients, seed, *args, **kwargs)

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        self.clients = generate_synthetic(
            self.alpha, self.beta, self.num_clients, self.dimension, self.num_classes, self.iid, self.data_seed
        )
        train_x, train_y, groups, test_x, test_y = [], [], [], [], []
        for k, client in enumerate(self.clients):
            n_train = int(self.train_fraction * len(client.y))
            train_x.append(client.x[:n_train])
            train_y.append(client.y[:n_train])
            groups.append(np.full(n_train, k))
            test_x.append(client.x[n_train:])
            test_y.append(client.y[n_train:])

        def tensor(parts: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
            return torch.as_tensor(np.concatenate(parts), dtype=dtype)

        self.assign_splits(
            tensor(train_x, torch.float32),
            tensor(train_y, torch.long),
            tensor(test_x, torch.float32),
            tensor(test_y, torch.long),
            groups=np.concatenate(groups),
        )
