"""Loading a pickle of plain data without running code (FedScale's traces, CIFAR's batches)."""

from __future__ import annotations

import importlib
import pickle
from typing import Any

import numpy as np

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float", "str", "bytes", "bytearray", "bool")
#: Globals a trace pickle may name: ``(module, name) -> (module to import, attribute)``. Plain containers and
#: numbers, NumPy scalars, dtypes and arrays (for traces written from NumPy values), ``_codecs.encode`` (protocol 2
#: writes bytes with it) and Python 2's names of the builtins.
_SAFE_GLOBALS: dict[tuple[str, str], tuple[str, str]] = {
    **{("builtins", n): ("builtins", n) for n in _BUILTINS},
    **{("__builtin__", n): ("builtins", n) for n in _BUILTINS},
    ("__builtin__", "unicode"): ("builtins", "str"),
    ("__builtin__", "long"): ("builtins", "int"),
    ("collections", "OrderedDict"): ("collections", "OrderedDict"),
    ("_codecs", "encode"): ("_codecs", "encode"),
    ("numpy", "dtype"): ("numpy", "dtype"),
    ("numpy", "ndarray"): ("numpy", "ndarray"),
    **{
        (f"numpy.{core}.{module}", name): (f"numpy.{core}.{module}", name)
        for core in ("core", "_core")
        for module, name in (("multiarray", "scalar"), ("multiarray", "_reconstruct"), ("numeric", "_frombuffer"))
    },
}


class _RefusedGlobal(ValueError):
    pass


class _TraceUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`_SAFE_GLOBALS`, so that a pickle cannot run code on load."""

    def __init__(self, file: Any, path: Any, what: str = "a FedScale trace", **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self.path, self.what = path, what

    def find_class(self, module: str, name: str) -> Any:
        target = _SAFE_GLOBALS.get((module, name))
        if target is None:
            raise _RefusedGlobal(
                f"{self.path}: refused to load the global {module}.{name} from the pickle: {self.what} holds only "
                f"dicts, lists, numbers, strings and arrays (the file is not {self.what}, or is malicious)"
            )
        target_module, attribute = target
        if target_module.startswith(("numpy.core.", "numpy._core.")):  # written by NumPy 1 or 2: this NumPy's own
            core = "numpy._core." if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else "numpy.core."
            target_module = core + target_module.split(".", 2)[2]
        return getattr(importlib.import_module(target_module), attribute)


def safe_pickle_load(path: Any, what: str, encoding: str = "ASCII") -> Any:
    """Load a pickle of plain data (containers, numbers, strings, NumPy arrays) without running code: any other
    global it names is refused with a ``ValueError`` naming the file and the global (``what``: what the file
    should be, for the message).

    Example:
        >>> import os, pickle, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "batch")
        >>> _ = open(path, "wb").write(pickle.dumps({"data": [1, 2], "labels": [0, 1]}))
        >>> safe_pickle_load(path, "a CIFAR batch")
        {'data': [1, 2], 'labels': [0, 1]}
        >>> _ = open(path, "wb").write(pickle.dumps(os.getcwd))
        >>> safe_pickle_load(path, "a CIFAR batch")
        Traceback (most recent call last):
        ...
        ValueError: ...: refused to load the global posix.getcwd from the pickle: a CIFAR batch holds only ...
    """
    with open(path, "rb") as f:
        try:
            return _TraceUnpickler(f, path, what, encoding=encoding).load()
        except _RefusedGlobal as error:
            raise ValueError(str(error)) from None
        except Exception as error:
            raise ValueError(f"{path}: not a readable pickle of {what} ({type(error).__name__}: {error})") from error
