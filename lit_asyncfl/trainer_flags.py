"""``lightning.Trainer`` flags given to ``FederatedTrainer``, and ``seed_everything`` before it: each refused at
construction with the route that does what the user meant (never an ``unexpected keyword argument`` alone, never
silently ignored)."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import lightning as L

#: Flag -> what does what the user meant in a federated run.
ROUTES: dict[str, str] = {
    "max_epochs": "each client job's local epochs are FederatedTrainer(local_epochs=E); the run's length is "
    "max_versions and/or max_virtual_time",
    "min_epochs": "each client job trains FederatedTrainer(local_epochs=E) epochs; the run's length is max_versions "
    "and/or max_virtual_time",
    "max_steps": "each client job trains FederatedTrainer(local_epochs=E) epochs; the run's length is max_versions "
    "(aggregations) and/or max_virtual_time",
    "min_steps": "the run's length is max_versions and/or max_virtual_time",
    "max_time": "the run's length is max_virtual_time (virtual seconds) and/or max_versions",
    "gradient_clip_val": "add lit_asyncfl.client_callbacks.GradientClipping(gradient_clip_val, "
    "gradient_clip_algorithm) to the algorithm's client_callbacks (every client job clips as lightning.Trainer "
    "does; engines 'fast' and 'lightning')",
    "gradient_clip_algorithm": "add lit_asyncfl.client_callbacks.GradientClipping(gradient_clip_val, "
    "gradient_clip_algorithm) to the algorithm's client_callbacks",
    "accumulate_grad_batches": "each client job takes one optimizer step per batch: use a larger batch_size (the "
    "DataLoader's or the data module's), or engine='lightning' with manual optimization stepping every k batches",
    "precision": "client jobs and the global evaluation run in the dtype of the module's parameters (float32 is "
    "what is tested; no mixed precision)",
    "check_val_every_n_epoch": "the global model is evaluated every eval_every versions",
    "val_check_interval": "the global model is evaluated every eval_every versions",
    "num_sanity_val_steps": "the global model is evaluated at version 0, before any client job",
    "limit_val_batches": "pass a smaller validation loader",
    "limit_train_batches": "pass a smaller training set",
    "devices": "accelerator= chooses the device; executor=RayExecutor(...) spreads client jobs over workers",
    "strategy": "executor=RayExecutor(...) spreads client jobs over workers",
    "num_nodes": "executor=RayExecutor(address=...) joins a Ray cluster",
    "enable_checkpointing": "checkpoints/last.ckpt is always written; add lit_asyncfl.callbacks.ModelCheckpoint for "
    "more",
    "deterministic": "runs are deterministic given seed=",
}


def check_trainer_flags(flags: dict[str, Any]) -> None:
    """Refuse ``lightning.Trainer`` flags passed to ``FederatedTrainer``, naming the route for each; any other
    unknown keyword is Python's ``TypeError``.

    Example:
        >>> check_trainer_flags({"max_epochs": 3})
        Traceback (most recent call last):
        ...
        ValueError: FederatedTrainer(max_epochs=3): a lightning.Trainer flag FederatedTrainer does not take; each ...
    """
    lightning_flags = set(inspect.signature(L.Trainer.__init__).parameters) - {"self"}
    for name, value in flags.items():
        if name not in lightning_flags:
            raise TypeError(f"FederatedTrainer.__init__() got an unexpected keyword argument {name!r}")
        route = ROUTES.get(name, "see docs/lightning.md for the Trainer flags a federated run has a route for")
        raise ValueError(
            f"FederatedTrainer({name}={value!r}): a lightning.Trainer flag FederatedTrainer does not take; {route}"
        )


#: ``PL_GLOBAL_SEED`` as the last FederatedTrainer construction left it (``seed_everything`` sets it).
_seed_set_here: list[str | None] = [None]


def check_seed_everything(seed: int, seed_given: bool) -> None:
    """Refuse a default ``seed`` after the user called ``seed_everything(s)`` with another ``s``: the trainer seeds
    everything itself from ``seed`` at construction (partition, devices, initial weights, every job), which would
    silently replace the user's seed; ``FederatedTrainer(seed=s)`` is what ``seed_everything(s)`` means here.

    The call is seen only through the ``PL_GLOBAL_SEED`` it writes, which the trainer's own seeding writes too: a
    value equal to what the last trainer left there passes, so ``seed_everything(s)`` repeated with the ``s`` of an
    earlier ``FederatedTrainer(seed=s)`` is not seen (a limitation, in ``docs/lightning.md``; no write of the same
    value can be told from another).

    Example:
        >>> check_seed_everything(0, seed_given=True)
    """
    user = os.environ.get("PL_GLOBAL_SEED")
    if seed_given or user is None or user == _seed_set_here[0] or user == str(seed):
        return
    raise ValueError(
        f"seed_everything({user}) was called, but FederatedTrainer seeds everything itself from seed={seed} (the "
        f"default) at construction, which would replace it: pass FederatedTrainer(seed={user})"
    )


def lightning_flags_refused(init: Callable[..., None]) -> Callable[..., None]:
    """Wrap ``FederatedTrainer.__init__``: :func:`check_trainer_flags` on the keywords it does not take and
    :func:`check_seed_everything` before it runs (its signature is kept, for the CLI and ``help``)."""
    parameters = inspect.signature(init).parameters
    names = list(parameters)[1:]  # without self
    seed_index, default_seed = names.index("seed"), parameters["seed"].default

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        check_trainer_flags({k: v for k, v in kwargs.items() if k not in parameters})
        if "seed" in kwargs:
            check_seed_everything(kwargs["seed"], seed_given=True)
        else:
            check_seed_everything(default_seed, seed_given=len(args) > seed_index)
        init(self, *args, **kwargs)
        _seed_set_here[0] = os.environ.get("PL_GLOBAL_SEED")

    return wrapper
