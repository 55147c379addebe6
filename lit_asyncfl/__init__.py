"""lit_asyncfl: asynchronous federated learning for PyTorch Lightning."""

import logging

from lit_asyncfl.trainer import FederatedTrainer

__version__ = "0.1.0"

# As Lightning does for its own messages: INFO lines (e.g. which metric is monitored) are shown unless the
# application configured logging itself.
_logger = logging.getLogger(__name__)
if not _logger.handlers and not logging.getLogger().handlers:
    _logger.setLevel(logging.INFO)
    _logger.addHandler(logging.StreamHandler())
    _logger.propagate = False

__all__ = ["FederatedTrainer", "__version__"]
