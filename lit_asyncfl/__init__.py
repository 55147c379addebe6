"""lit_asyncfl: asynchronous federated learning for PyTorch Lightning."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from types import ModuleType
from typing import Any

#: Modules merged into another one of the same concept -> that module. The old path imports the module it was
#: merged into (the same module object, not a copy: a name imported from either path is the same object).
MERGED_MODULES = {
    "lit_asyncfl.core.arrivals": "lit_asyncfl.core.jobs",
    "lit_asyncfl.core.clock": "lit_asyncfl.core.simulator",
    "lit_asyncfl.core.seeding": "lit_asyncfl.core.update",
    "lit_asyncfl.engines.kernels": "lit_asyncfl.engines.base",
    "lit_asyncfl.loops.job_trainer": "lit_asyncfl.loops.stand_in",
    "lit_asyncfl.loops.log": "lit_asyncfl.loops.stand_in",
    "lit_asyncfl.server.weights": "lit_asyncfl.server.aggregators",
}


class _MergedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports each old path of :data:`MERGED_MODULES` as the module it was merged into (installed before anything
    of the package is imported, so that any code, this package's own included, may still use an old path)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MERGED_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MERGED_MODULES[spec.name])
        spec.loader_state = module.__spec__  # the import system replaces the module's __spec__ by the old path's
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run (the module was imported by :meth:`create_module`); only its own ``__spec__`` is put back."""
        module.__spec__ = module.__spec__.loader_state


if not any(isinstance(finder, _MergedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MergedModules())

from lit_asyncfl.loops import validation_loop  # noqa: E402
from lit_asyncfl.trainer import FederatedTrainer  # noqa: E402

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
