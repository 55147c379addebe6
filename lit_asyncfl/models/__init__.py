"""Models ready for the federated trainer (each a ``LightningModule``)."""

from lit_asyncfl.models.alexnet import AlexNet
from lit_asyncfl.models.base import ClassificationModule
from lit_asyncfl.models.cnn import SimpleCNN
from lit_asyncfl.models.lenet import LeNet5
from lit_asyncfl.models.linear import LinearRegression, LinearSVM
from lit_asyncfl.models.mlp import MLP, LogisticRegression
from lit_asyncfl.models.resnet import ResNet20
from lit_asyncfl.models.textcnn import TextCNN
from lit_asyncfl.models.vgg import VGG11

__all__ = [
    "MLP",
    "VGG11",
    "AlexNet",
    "ClassificationModule",
    "LeNet5",
    "LinearRegression",
    "LinearSVM",
    "LogisticRegression",
    "ResNet20",
    "SimpleCNN",
    "TextCNN",
]
