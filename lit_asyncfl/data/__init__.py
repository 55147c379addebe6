"""Data modules, partitioners and client shards."""

from lit_asyncfl.data.base import FederatedDataModule, PartitionedDataModule, split_dataset
from lit_asyncfl.data.digits import DigitsDataModule
from lit_asyncfl.data.partition import (
    IID,
    PARTITIONERS,
    Dirichlet,
    Partitioner,
    QuantitySkew,
    RareClassOnSlowClients,
    Shards,
)
from lit_asyncfl.data.shards import ClientShards, DatasetShards
from lit_asyncfl.data.vision import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    VisionDataModule,
)

__all__ = [
    "IID",
    "PARTITIONERS",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "ClientShards",
    "DatasetShards",
    "DigitsDataModule",
    "Dirichlet",
    "FashionMNISTDataModule",
    "FederatedDataModule",
    "MNISTDataModule",
    "PartitionedDataModule",
    "Partitioner",
    "QuantitySkew",
    "RareClassOnSlowClients",
    "Shards",
    "VisionDataModule",
    "split_dataset",
]
