"""The run's loggers and its log dir (where outputs and checkpoints go)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger


def resolve_loggers(logger: Logger | Iterable[Logger] | bool | None, root: str, name: str) -> list[Logger]:
    """The loggers of ``FederatedTrainer(logger=...)``: ``True`` is a ``CSVLogger(root, name=name)``, ``False`` or
    ``None`` none, a logger or an iterable of loggers themselves.

    Example:
        >>> [type(lg).__name__ for lg in resolve_loggers(True, "runs", "FedAsync")], resolve_loggers(False, "runs", "x")
        (['CSVLogger'], [])
    """
    if logger is True:
        return [CSVLogger(root, name=name)]
    if logger is False or logger is None:
        return []
    if isinstance(logger, Logger):
        return [logger]
    return list(logger)


def log_dir_of(loggers: list[Logger], root: str, name: str) -> str:
    """The first logger's ``log_dir`` (CSV, TensorBoard), else the next free ``root/<name>/version_N`` (loggers
    without a local log dir, such as W&B, or no logger).

    Example:
        >>> import tempfile
        >>> log_dir_of([], tempfile.mkdtemp(), "FedAsync").endswith("FedAsync/version_0")
        True
    """
    for lg in loggers:
        path = getattr(lg, "log_dir", None)
        if path:
            return str(path)
    base = Path(root) / name
    existing = [int(p.name.split("_")[1]) for p in base.glob("version_*") if p.name.split("_")[1].isdigit()]
    return str(base / f"version_{max(existing, default=-1) + 1}")
