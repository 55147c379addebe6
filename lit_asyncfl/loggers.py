"""The run's loggers and its log dir (where outputs and checkpoints go)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger

from lit_asyncfl import namespaces


def resolve_loggers(logger: Logger | Iterable[Logger] | bool | None, root: str, name: str) -> list[Logger]:
    """The loggers of ``FederatedTrainer(logger=...)``: ``True`` is a ``CSVLogger(root, name=name)``, ``False`` or
    ``None`` none, a logger or an iterable of loggers themselves.

    Example:
        >>> [type(lg).__name__ for lg in resolve_loggers(True, "runs", "FedAsync")], resolve_loggers(False, "runs", "x")
        (['CSVLogger'], [])
    """
    forms = "a Lightning Logger (e.g. CSVLogger(save_dir)), a list of them, True (a CSVLogger) or False/None (none)"
    if logger is True:
        return [CSVLogger(root, name=name)]
    if logger is False or logger is None:
        return []
    if isinstance(logger, namespaces.logger_classes()):  # lightning.pytorch's or pytorch_lightning's
        return [logger]
    if isinstance(logger, (str, bytes)) or not isinstance(logger, Iterable):
        hint = " (on the command line: --trainer.logger=CSVLogger)" if isinstance(logger, str) else ""
        raise ValueError(f"logger must be {forms}, got {logger!r}{hint}")
    loggers = list(logger)
    bad = [lg for lg in loggers if not isinstance(lg, Logger)]
    if bad:
        raise ValueError(f"logger must be {forms}; the list holds {bad[0]!r}, which is not a Logger")
    return loggers


def claim_log_dir(loggers: list[Logger], root: str, name: str) -> str:
    """Create the run's log dir, exclusively, and check that it is writable; return its path.

    The first logger's ``log_dir`` (CSV, TensorBoard), else ``root/<name>/version_N`` (loggers without a local log
    dir, such as W&B, or no logger). A version not fixed by the user is claimed by creating its directory
    atomically (``mkdir`` fails if it exists), so runs started at the same time into the same root get distinct
    versions (a ``CSVLogger``/``TensorBoardLogger`` is given the claimed version). Raises a ``ValueError`` naming
    the path when it cannot be created or written, before anything runs.

    Example:
        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> [claim_log_dir([], root, "FedAsync").split("/")[-1] for _ in range(2)]
        ['version_0', 'version_1']
    """
    try:
        lazy = tuple(getattr(p.loggers, n) for p in namespaces.packages() for n in ("CSVLogger", "TensorBoardLogger"))
        for lg in loggers:
            if isinstance(lg, lazy) and lg._version is None:  # Lightning's lazy version
                lg._version = _claim_version(Path(lg.root_dir))
                os.makedirs(lg.log_dir, exist_ok=True)  # (a TensorBoardLogger's sub_dir is below the version)
                return _writable(str(lg.log_dir))
            path = getattr(lg, "log_dir", None)
            if path:
                os.makedirs(path, exist_ok=True)
                return _writable(str(path))
        base = Path(root) / name
        return _writable(str(base / f"version_{_claim_version(base)}"))
    except OSError as error:
        raise ValueError(
            f"cannot write the run's outputs under {root!r} ({error}); set default_root_dir (--trainer."
            "default_root_dir) or the logger's save_dir to a writable directory"
        ) from None


def _claim_version(base: Path) -> int:
    base.mkdir(parents=True, exist_ok=True)
    existing = [int(p.name.split("_")[1]) for p in base.glob("version_*") if p.name.split("_")[1].isdigit()]
    version = max(existing, default=-1) + 1
    while True:
        try:
            (base / f"version_{version}").mkdir()
            return version
        except FileExistsError:  # another run took it between the listing and the mkdir
            version += 1


def _writable(path: str) -> str:
    probe = os.path.join(path, f".write-test-{os.getpid()}")
    with open(probe, "w") as f:
        f.write("ok")
    os.remove(probe)
    return path
