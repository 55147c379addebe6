"""lit_asyncfl: asynchronous federated learning for PyTorch Lightning."""

from lit_asyncfl.trainer import FederatedTrainer

__version__ = "0.1.0"

__all__ = ["FederatedTrainer", "__version__"]
