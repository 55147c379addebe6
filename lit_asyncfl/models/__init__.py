"""Models ready for the federated trainer (each a ``LightningModule``)."""

from lit_asyncfl.models.base import ClassificationModule
from lit_asyncfl.models.cnn import SimpleCNN
from lit_asyncfl.models.lenet import LeNet5
from lit_asyncfl.models.mlp import MLP, LogisticRegression

__all__ = ["MLP", "ClassificationModule", "LeNet5", "LogisticRegression", "SimpleCNN"]
