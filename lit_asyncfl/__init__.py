"""lit_asyncfl: asynchronous federated learning for PyTorch Lightning."""

import logging
import sys

from lit_asyncfl.loops import validation_loop
from lit_asyncfl.trainer import FederatedTrainer

__version__ = "0.1.0"

# As Lightning does for its own messages: INFO lines (e.g. which metric is monitored) are shown unless the
# application configured logging itself.
_logger = logging.getLogger(__name__)
if not _logger.handlers and not logging.getLogger().handlers:
    _logger.setLevel(logging.INFO)
    _logger.addHandler(logging.StreamHandler())
    _logger.propagate = False

# the module moved to lit_asyncfl.loops; its old path is the same module
sys.modules[f"{__name__}.validation_loop"] = validation_loop

__all__ = ["FederatedTrainer", "__version__"]
