"""Checkpoints: Lightning checkpoints of the global model, with the simulation to resume under a key of its own.

Every file this library writes is a valid Lightning checkpoint of the *global* model: ``state_dict`` (the global
weights, as ``module.state_dict()`` names them), ``hyper_parameters`` (from ``save_hyperparameters``),
``pytorch-lightning_version``, ``epoch`` and ``global_step`` (the global version), the data module's
hyper-parameters, and whatever the module adds in ``on_save_checkpoint``. So ``MyModule.load_from_checkpoint(path)``
and ``lightning.Trainer(...).test(model, ckpt_path=path)`` work on it.

What the federated run needs beyond the model lives under :data:`RUN_KEY` (``"lit_asyncfl"``): the format, the
global version and virtual time, and — in a *resumable* checkpoint, written at an event boundary — the simulation
state, the history, the run callbacks' states and the configuration fingerprint. All of it is plain values and
tensors, so every checkpoint loads with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch

#: Top-level key of the federated run's own entries in a checkpoint.
RUN_KEY = "lit_asyncfl"
#: Format of the entries under :data:`RUN_KEY`.
FORMAT = "lit_asyncfl.checkpoint.v3"
_OLD_FORMATS = ("lit_asyncfl.checkpoint.v1",)
#: Formats whose model is a Lightning checkpoint but whose simulation this version cannot resume (v2: server
#: optimizer states held BatchNorm statistics, per-client state was referenced by absolute paths).
_UNRESUMABLE_FORMATS = ("lit_asyncfl.checkpoint.v2",)


def model_checkpoint(
    model: L.LightningModule,
    datamodule: L.LightningDataModule | None,
    version: int,
    run: dict[str, Any],
) -> dict[str, Any]:
    """A Lightning checkpoint of ``model`` (holding the global weights) with the run's entries under ``RUN_KEY``.

    Args:
        model: The module, its weights set to the global model of ``version``.
        datamodule: The run's data module (its ``hparams`` and ``state_dict()`` are saved as Lightning saves them).
        version: The global version (saved as ``global_step``).
        run: The federated run's entries (``format`` is added).

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> ckpt = model_checkpoint(LogisticRegression(input_dim=4), None, 7, {})
        >>> ckpt["global_step"], ckpt["hyper_parameters"]["input_dim"], ckpt[RUN_KEY]["format"]
        (7, 4, 'lit_asyncfl.checkpoint.v3')
    """
    checkpoint: dict[str, Any] = {
        "epoch": 0,
        "global_step": int(version),
        "pytorch-lightning_version": L.__version__,
        "state_dict": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }
    for obj in (model, datamodule):
        if obj is not None and obj.hparams:
            if hasattr(obj, "_hparams_name"):
                checkpoint[obj.CHECKPOINT_HYPER_PARAMS_NAME] = obj._hparams_name
            checkpoint[obj.CHECKPOINT_HYPER_PARAMS_KEY] = dict(obj.hparams)
    if datamodule is not None:
        state = datamodule.state_dict()
        if state:
            checkpoint[type(datamodule).__qualname__] = state
    checkpoint[RUN_KEY] = {"format": FORMAT, **run}
    return checkpoint


def check_hparams_loadable(obj: L.LightningModule | L.LightningDataModule) -> None:
    """Refuse ``hparams`` that a checkpoint could save but not load back with ``weights_only=True`` (e.g. a
    ``pathlib.Path``): found at fit start, not when resuming after the run.

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> check_hparams_loadable(LogisticRegression(input_dim=4))
    """
    bad = []
    for key, value in dict(obj.hparams).items():
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
            buffer.seek(0)
            torch.load(buffer, weights_only=True)
        except Exception:
            bad.append(f"{key}={value!r} ({type(value).__name__})")
    if bad:
        raise ValueError(
            f"{type(obj).__name__}.hparams hold values a checkpoint cannot load back with weights_only=True: "
            f"{', '.join(bad)}; pass them as plain values (str, numbers, lists, dicts) or leave them out with "
            "save_hyperparameters(ignore=[...])"
        )


def content_digest(checkpoint: dict[str, Any]) -> str:
    """SHA-256 of a checkpoint's contents (every value and tensor, in a canonical order), its stored checksum left
    out: what :func:`save` stores and :func:`load` verifies.

    Example:
        >>> a = {"state_dict": {"w": torch.ones(2)}, RUN_KEY: {"version": 3}}
        >>> b = {"state_dict": {"w": torch.tensor([1.0, 1.0 + 1e-7])}, RUN_KEY: {"version": 3}}
        >>> content_digest(a) == content_digest(a), content_digest(a) == content_digest(b)
        (True, False)
    """
    run = checkpoint.get(RUN_KEY)
    stored = run.pop("checksum", None) if isinstance(run, dict) else None
    try:
        digest = hashlib.sha256()
        _hash_into(checkpoint, digest)
        return digest.hexdigest()
    finally:
        if stored is not None:
            run["checksum"] = stored  # type: ignore[index]


def _hash_into(value: Any, digest: Any) -> None:
    if isinstance(value, dict):
        digest.update(b"{")
        for key in sorted(value, key=repr):
            digest.update(repr(key).encode())
            _hash_into(value[key], digest)
        digest.update(b"}")
    elif isinstance(value, (list, tuple)):
        digest.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            _hash_into(item, digest)
        digest.update(b"]")
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"tensor{t.dtype}{tuple(t.shape)}".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, np.ndarray):
        digest.update(f"array{value.dtype}{value.shape}".encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    else:
        digest.update(repr(value).encode())


def save(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``checkpoint`` to ``path`` atomically (a reader never sees a half-written file), with the checksum of
    its contents in its run entry."""
    if isinstance(checkpoint.get(RUN_KEY), dict):
        checkpoint[RUN_KEY]["checksum"] = content_digest(checkpoint)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(checkpoint, tmp)
    os.replace(tmp, path)


def load(path: str | os.PathLike, map_location: Any = None) -> dict[str, Any]:
    """Load a checkpoint safely (``weights_only=True``); refuse files that are not Lightning checkpoints.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: Not a checkpoint, or one written by an earlier lit_asyncfl that this version cannot read.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # pickle errors, truncated files, foreign objects
        raise ValueError(f"{path} could not be loaded as a checkpoint with weights_only=True: {exc}") from exc
    if not isinstance(checkpoint, dict):
        raise ValueError(f"{path} is not a checkpoint: it holds a {type(checkpoint).__name__}, not a dict")
    if checkpoint.get("format") in _OLD_FORMATS:
        raise ValueError(
            f"{path} was written by an earlier lit_asyncfl ({checkpoint['format']}): its model is not a Lightning "
            f"checkpoint and its simulation cannot be resumed by this version ({FORMAT}); start the run again"
        )
    if "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a Lightning checkpoint: it has no 'state_dict' (keys: {sorted(checkpoint)})")
    run = checkpoint.get(RUN_KEY)
    if isinstance(run, dict) and run.get("format") == FORMAT and "checksum" not in run:
        raise ValueError(
            f"{path} has no checksum entry ({RUN_KEY}.checksum), which every checkpoint lit_asyncfl writes holds: "
            "the file was edited after it was written, so its contents cannot be verified; use an intact copy"
        )
    if isinstance(run, dict) and "checksum" in run and content_digest(checkpoint) != run["checksum"]:
        raise ValueError(
            f"{path} does not match the checksum stored in it: the file was modified or corrupted after it was "
            "written; use an intact copy (or another checkpoint of the run)"
        )
    bad = [k for k, v in checkpoint["state_dict"].items() if torch.is_tensor(v) and v.is_floating_point()
           and not bool(torch.isfinite(v).all())]  # fmt: skip
    if bad:
        raise ValueError(f"{path} holds non-finite global weights (NaN or inf in {', '.join(bad[:5])}): refused")
    return checkpoint


#: What a fingerprint written before one of its keys existed meant by its absence (today's default). A value that
#: is a dict without ``"class"`` holds keys of the description under that key (``"data"``: any data module's,
#: whatever its class) rather than a whole value; see :func:`fill_keys_before_them`.
FINGERPRINT_BEFORE_ITS_KEY: dict[str, Any] = {
    "availability": {"class": "AlwaysAvailable", "crash_probability": 0.0},
    "data": {"shuffle": True, "train_columns": None},
}

#: What the description of a component written before one of its keys existed meant by its absence (today's
#: default), by the component's class, wherever it sits in the fingerprint (a partitioner in the data module, a
#: callback in an algorithm's lists); values as in :data:`FINGERPRINT_BEFORE_ITS_KEY`.
DESCRIPTION_BEFORE_ITS_KEY: dict[str, dict[str, Any]] = {
    "Shards": {"distinct_classes": False},
    "Natural": {"column": None},
    "GaussianAggregateNoise": {"accountant": "rdp"},
    "LocalGaussianNoise": {"accountant": "rdp", "max_epsilon": None, "max_uploads": None},
    "DifferentiallyPrivate": {"hparams": {"accountant": "rdp"}},
}


def fill_keys_before_them(theirs: Any, ours: Any, defaults: dict[str, Any] = FINGERPRINT_BEFORE_ITS_KEY) -> Any:
    """A checkpoint's fingerprint ``theirs`` with the keys it was written without (before they existed) set to
    what their absence meant, where the resuming trainer's fingerprint ``ours`` has them: ``defaults`` at this
    level (:data:`FINGERPRINT_BEFORE_ITS_KEY` at the top), :data:`DESCRIPTION_BEFORE_ITS_KEY` in the description of
    a class. A checkpoint from before a key then resumes when today's value is its default, and is refused naming
    the key otherwise.

    Example:
        >>> theirs = {"data": {"class": "D", "partitioner": {"class": "Shards", "shards_per_client": 2}}}
        >>> ours = {"data": {"class": "D", "partitioner": {"class": "Shards", "shards_per_client": 2,
        ...                                                "distinct_classes": True}}}
        >>> fill_keys_before_them(theirs, ours)["data"]["partitioner"]
        {'class': 'Shards', 'shards_per_client': 2, 'distinct_classes': False}
    """
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        return [fill_keys_before_them(a, b, {}) for a, b in zip(theirs, ours)]
    if not isinstance(theirs, dict) or not isinstance(ours, dict) or theirs.get("class") != ours.get("class"):
        return theirs  # (another class: compared whole)
    if "class" in ours:
        defaults = {**defaults, **DESCRIPTION_BEFORE_ITS_KEY.get(ours["class"], {})}
    out = {}
    for key, value in theirs.items():
        nested = defaults.get(key)
        keys = nested if isinstance(nested, dict) and "class" not in nested else {}
        out[key] = fill_keys_before_them(value, ours[key], keys) if key in ours else value
    out.update({key: defaults[key] for key in ours if key not in theirs and key in defaults})
    return out


def fingerprint_differences(theirs: Any, ours: Any, prefix: str = "") -> list[str]:
    """The settings that differ between two fingerprints, each named by its dotted path with both values (only the
    differing leaves: one changed ``lr`` among a whole algorithm's description is one short line).

    Example:
        >>> fingerprint_differences({"a": {"lr": 0.1, "k": 2}, "seed": 0}, {"a": {"lr": 0.2, "k": 2}, "seed": 0})
        ['a.lr: checkpoint 0.1 vs trainer 0.2']
    """
    same_class = not isinstance(theirs, dict) or not isinstance(ours, dict) or theirs.get("class") == ours.get("class")
    if isinstance(theirs, dict) and isinstance(ours, dict) and same_class:  # (another class: both whole)
        out = []
        for key in [*ours, *(k for k in theirs if k not in ours)]:
            name = f"{prefix}.{key}" if prefix else str(key)
            if key not in theirs or key not in ours:
                a, b = theirs.get(key, "<absent>"), ours.get(key, "<absent>")
                out.append(f"{name}: checkpoint {a!r} vs trainer {b!r}")
            else:
                out += fingerprint_differences(theirs[key], ours[key], name)
        return out
    if isinstance(theirs, list) and isinstance(ours, list) and len(theirs) == len(ours):
        pairs = enumerate(zip(theirs, ours))
        return [d for i, (a, b) in pairs for d in fingerprint_differences(a, b, f"{prefix}[{i}]")]
    return [] if theirs == ours else [f"{prefix}: checkpoint {theirs!r} vs trainer {ours!r}"]


def check_simulation_weights(run: dict[str, Any], path: str | os.PathLike, weights: torch.Tensor) -> None:
    """Refuse a simulation whose global weights or in-flight start models are not finite or do not have the
    dtype and size of the run's model (``weights``: its flat weights)."""
    simulation = run["simulation"]
    tensors = {"global weights": simulation["server"]["weights"]}
    tensors.update({f"start model of version {v}": t for v, t in simulation.get("snapshots", {}).items()})
    for name, tensor in tensors.items():
        if not torch.is_tensor(tensor) or tensor.dtype != weights.dtype or tensor.shape != weights.shape:
            what = f"{tensor.dtype} {tuple(tensor.shape)}" if torch.is_tensor(tensor) else type(tensor).__name__
            raise ValueError(
                f"{path}: the simulation's {name} are {what}, but the model's weights are {weights.dtype} "
                f"{tuple(weights.shape)}: resume with the model (and dtype) the checkpoint was written with"
            )
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{path}: the simulation's {name} are not finite (NaN or inf): refused")


def run_entries(
    checkpoint: dict[str, Any],
    path: str | os.PathLike,
    fingerprint: dict[str, Any],
    weights: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The federated run's entries of a *resumable* checkpoint (one with a simulation state) written by the
    configuration whose fingerprint is ``fingerprint`` (see :func:`~lit_asyncfl.hparams.run_fingerprint`).

    Args:
        checkpoint: The loaded checkpoint.
        path: Its path (for messages).
        fingerprint: The resuming trainer's configuration.
        weights: The resuming model's flat weights: the simulation's must be finite and of their dtype and size.

    Raises:
        ValueError: The checkpoint holds a model only (a plain Lightning checkpoint, or a best-model file of
            :class:`~lit_asyncfl.callbacks.ModelCheckpoint`), was written by another configuration (each differing
            setting is named by its path), or holds simulation weights that are not finite or not of the model's
            dtype.
    """
    run = checkpoint.get(RUN_KEY)
    if isinstance(run, dict) and run.get("format") in _UNRESUMABLE_FORMATS:
        raise ValueError(
            f"{path} was written by an earlier lit_asyncfl ({run['format']}): its global model loads "
            f"(load_from_checkpoint, or --ckpt_path for validate/test), but its simulation cannot be resumed by this "
            f"version ({FORMAT}); start the run again"
        )
    if not isinstance(run, dict) or run.get("format") != FORMAT:
        raise ValueError(
            f"{path} is a Lightning checkpoint without a lit_asyncfl run in it: it can initialise a model "
            "(load_from_checkpoint) but not resume a federated run; resume from the run's checkpoints/last.ckpt"
        )
    if "simulation" not in run:
        raise ValueError(
            f"{path} holds the global model of version {run.get('version')} but no simulation state (a best-model "
            "checkpoint written mid-event): it cannot resume a run; resume from a last.ckpt instead"
        )
    theirs = fill_keys_before_them(run["fingerprint"], fingerprint)
    weights_now = run["simulation"]["server"]["weights"]
    if isinstance(theirs.get("model"), dict) and "dtype" not in theirs["model"] and torch.is_tensor(weights_now):
        # written before the dtype was recorded: the simulation's weights have it
        theirs["model"] = {**theirs["model"], "dtype": str(weights_now.dtype).removeprefix("torch.")}
    diff = fingerprint_differences({k: theirs.get(k) for k in fingerprint}, fingerprint)
    if diff:
        raise ValueError(f"checkpoint {path} was written by a different configuration: {'; '.join(diff)}")
    if weights is not None:
        check_simulation_weights(run, path, weights)
    return run


def restore_lightning_state(
    model: L.LightningModule, datamodule: L.LightningDataModule | None, checkpoint: dict[str, Any]
) -> None:
    """What Lightning restores of a module and data module besides the weights: the module's
    ``on_load_checkpoint`` and the data module's ``load_state_dict`` (when it saved a state)."""
    model.on_load_checkpoint(checkpoint)
    if datamodule is not None and type(datamodule).__qualname__ in checkpoint:
        datamodule.load_state_dict(checkpoint[type(datamodule).__qualname__])


def load_model_weights(model: L.LightningModule, checkpoint: dict[str, Any]) -> None:
    """Put a checkpoint's weights into ``model`` as Lightning does (``on_load_checkpoint``, then a strict load)."""
    model.on_load_checkpoint(checkpoint)
    model.load_state_dict(checkpoint["state_dict"], strict=True)
