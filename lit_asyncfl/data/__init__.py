"""Data modules, partitioners and client shards."""

from lit_asyncfl.data.base import ClientTransform, FederatedDataModule, PartitionedDataModule, split_dataset
from lit_asyncfl.data.digits import DigitsDataModule
from lit_asyncfl.data.flower import FlowerPartitioner
from lit_asyncfl.data.huggingface import HuggingFaceDataModule, HuggingFaceSamples
from lit_asyncfl.data.imdb import IMDbDataModule
from lit_asyncfl.data.loaders import LoaderDataModule
from lit_asyncfl.data.partition import (
    IID,
    PARTITIONERS,
    Dirichlet,
    FlowerPartitionerLike,
    Natural,
    Partitioner,
    QuantitySkew,
    RareClassOnSlowClients,
    Shards,
    SpeedMatched,
    partition_counts,
)
from lit_asyncfl.data.shards import ClientShards, DatasetShards
from lit_asyncfl.data.synthetic import SyntheticClient, SyntheticDataModule, generate_synthetic
from lit_asyncfl.data.tabular import BreastCancerDataModule, DiabetesDataModule, TabularDataModule
from lit_asyncfl.data.vision import (
    CIFAR10DataModule,
    CIFAR100DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    TinyImageNetDataModule,
    VisionDataModule,
)

__all__ = [
    "IID",
    "PARTITIONERS",
    "BreastCancerDataModule",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "ClientShards",
    "ClientTransform",
    "DatasetShards",
    "DiabetesDataModule",
    "DigitsDataModule",
    "Dirichlet",
    "FashionMNISTDataModule",
    "FederatedDataModule",
    "FlowerPartitioner",
    "FlowerPartitionerLike",
    "HuggingFaceDataModule",
    "HuggingFaceSamples",
    "IMDbDataModule",
    "LoaderDataModule",
    "MNISTDataModule",
    "Natural",
    "PartitionedDataModule",
    "Partitioner",
    "QuantitySkew",
    "RareClassOnSlowClients",
    "Shards",
    "SpeedMatched",
    "SyntheticClient",
    "SyntheticDataModule",
    "TabularDataModule",
    "TinyImageNetDataModule",
    "VisionDataModule",
    "generate_synthetic",
    "partition_counts",
    "split_dataset",
]
