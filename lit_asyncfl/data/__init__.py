"""Data modules, partitioners and client shards."""

from lit_asyncfl.data.base import FederatedDataModule, PartitionedDataModule, split_dataset
from lit_asyncfl.data.digits import DigitsDataModule
from lit_asyncfl.data.partition import IID, PARTITIONERS, Dirichlet, Partitioner, QuantitySkew, Shards
from lit_asyncfl.data.shards import ClientShards, DatasetShards

__all__ = [
    "IID",
    "PARTITIONERS",
    "ClientShards",
    "DatasetShards",
    "DigitsDataModule",
    "Dirichlet",
    "FederatedDataModule",
    "PartitionedDataModule",
    "Partitioner",
    "QuantitySkew",
    "Shards",
    "split_dataset",
]
