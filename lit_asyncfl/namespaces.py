"""Both Lightning namespaces: ``lightning.pytorch`` (``import lightning as L``) and the standalone
``pytorch_lightning`` package (``import pytorch_lightning as pl``).

The two packages hold distinct classes (a ``pytorch_lightning.LightningModule`` is not a
``lightning.pytorch.LightningModule``), so every check and every Lightning object this library builds for a user's
module goes through here: a module is run with the ``Trainer``, ``Callback`` and strategy classes of its own package.
``pytorch_lightning`` is never imported here: a user object can only be one of its instances once the user has
imported it, so it is read from ``sys.modules``.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import Any

import lightning.pytorch as _lightning_pytorch
from lightning_utilities.core.overrides import is_overridden as _is_overridden


def packages() -> tuple[ModuleType, ...]:
    """The Lightning packages loaded in this process: ``lightning.pytorch``, and ``pytorch_lightning`` once imported.

    Example:
        >>> packages()[0].__name__
        'lightning.pytorch'
    """
    standalone = sys.modules.get("pytorch_lightning")
    return (_lightning_pytorch,) if standalone is None else (_lightning_pytorch, standalone)


def classes(name: str) -> tuple[type, ...]:
    """The class ``name`` (``"LightningModule"``, ``"LightningDataModule"``, ``"Callback"``, ``"Trainer"``) of every
    loaded Lightning package, for ``isinstance`` checks that accept both namespaces.

    Example:
        >>> import lightning as L
        >>> isinstance(L.LightningModule(), classes("LightningModule"))
        True
    """
    return tuple(getattr(package, name) for package in packages())


def logger_classes() -> tuple[type, ...]:
    """``Logger`` of every loaded Lightning package (``lightning.pytorch.loggers.Logger``, ...)."""
    return tuple(package.loggers.Logger for package in packages())


def package_of(obj: Any) -> ModuleType:
    """The Lightning package whose ``LightningModule``, ``LightningDataModule``, ``Callback`` or ``Logger`` ``obj`` is
    an instance of (``lightning.pytorch`` for anything else).

    Example:
        >>> import lightning as L
        >>> package_of(L.LightningModule()).__name__
        'lightning.pytorch'
    """
    for package in packages()[1:]:
        bases = (package.LightningModule, package.LightningDataModule, package.Callback, package.loggers.Logger)
        if isinstance(obj, bases):
            return package
    return _lightning_pytorch


def base_class(obj: Any) -> type:
    """``obj``'s Lightning base class in its own package: ``LightningModule``, ``LightningDataModule`` or ``Callback``.

    Example:
        >>> import lightning as L
        >>> base_class(L.LightningDataModule()).__name__
        'LightningDataModule'
    """
    package = package_of(obj)
    for name in ("LightningModule", "LightningDataModule", "Callback"):
        if isinstance(obj, getattr(package, name)):
            return getattr(package, name)
    raise TypeError(f"{type(obj).__name__} is not a LightningModule, LightningDataModule or Callback")


def is_overridden(method_name: str, obj: Any) -> bool:
    """Whether ``obj`` (a module, data module or callback of either namespace) overrides ``method_name`` of its
    Lightning base class.

    Example:
        >>> import lightning as L
        >>> class M(L.LightningModule):
        ...     def on_fit_start(self):
        ...         pass
        >>> is_overridden("on_fit_start", M()), is_overridden("setup", M())
        (True, False)
    """
    return _is_overridden(method_name, obj, base_class(obj))


def standalone() -> ModuleType | None:
    """The ``pytorch_lightning`` package, imported (with its ``cli``) where it is installed, else ``None``: for what
    must accept either namespace before any user code is imported (the CLI's ``--model``/``--data``)."""
    if importlib.util.find_spec("pytorch_lightning") is None:
        return None
    import pytorch_lightning
    import pytorch_lightning.cli  # its _InstantiatorFn

    return pytorch_lightning


def installed_classes(name: str) -> tuple[type, ...]:
    """The class ``name`` of ``lightning.pytorch`` and, where installed, ``pytorch_lightning`` (imported).

    Example:
        >>> installed_classes("LightningModule")[0].__module__
        'lightning.pytorch.core.module'
    """
    package = standalone()
    return (getattr(_lightning_pytorch, name),) + (() if package is None else (getattr(package, name),))
