"""What client jobs honour of a module's Lightning features: checked once at fit start, refused with the
alternative or announced, never silently changed."""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
import torch.utils._pytree as pytree
from torch.optim.lr_scheduler import ReduceLROnPlateau

from lit_asyncfl.checks import check_hooks_run
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.workspace import _no_log, unseen
from lit_asyncfl.engines.base import parse_optimizers
from lit_asyncfl.loops.stand_in import JobTrainer
from lit_asyncfl.namespaces import is_overridden

_log = logging.getLogger("lit_asyncfl")

#: Hooks of Lightning's training loop that only ``engine="lightning"`` (a real Trainer per job) runs.
TRAINING_HOOKS = (
    "setup", "configure_model", "on_fit_start", "on_fit_end", "on_train_start", "on_train_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start", "on_train_batch_end",
    "on_before_zero_grad", "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step",
    "on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer",
)  # fmt: skip
#: Batch hooks of a data module, which Lightning calls instead of the module's when the data module defines them.
DATAMODULE_BATCH_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def check_lightning_contract(
    module: L.LightningModule, engine: str, datamodule: L.LightningDataModule | None = None
) -> None:
    """Refuse at fit start the Lightning features a client job cannot honour; announce the per-job ones.

    - ``configure_callbacks`` returning callbacks: refused (they would run once per client job); the global loop's
      callbacks are :mod:`lit_asyncfl.callbacks`, client-side hooks are client callbacks.
    - Manual optimization (``automatic_optimization = False``) and several optimizers: refused outside
      ``engine="lightning"``, naming it (a module with several optimizers needs manual optimization, as in
      Lightning).
    - ``ReduceLROnPlateau``: refused (it needs a metric per local epoch that no client job computes).
    - Other LR schedulers: announced. Every client job builds a fresh optimizer and schedulers from
      ``configure_optimizers``, so a schedule restarts with each job (it does not decay across the run).
    - ``configure_optimizers`` reading what :class:`~lit_asyncfl.loops.JobTrainer` does not offer,
      and overridden hooks of Lightning's training loop (:data:`TRAINING_HOOKS`): refused outside
      ``engine="lightning"``.
    - A data module's batch-transfer hooks: refused (client jobs and the global evaluation call the module's).

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> check_lightning_contract(LogisticRegression(input_dim=4), "fast")
    """
    name = type(module).__name__
    if engine != "lightning" and not module.automatic_optimization:
        raise ValueError(
            f"{name} uses manual optimization (automatic_optimization = False), which engine={engine!r} does not run "
            "(it calls the optimizer itself after training_step returns the loss); use engine='lightning' (a real "
            "lightning.Trainer per client job runs manual_backward, self.optimizers() and toggle_optimizer)"
        )
    if engine != "lightning":
        check_hooks_run(name, [h for h in TRAINING_HOOKS if is_overridden(h, module)], engine)
    if datamodule is not None:
        hooks = [h for h in DATAMODULE_BATCH_HOOKS if is_overridden(h, datamodule)]
        if hooks:
            raise ValueError(
                f"{type(datamodule).__name__} overrides {hooks}: client jobs and the global evaluation call the "
                f"module's batch hooks, not the data module's; define them on {name} instead"
            )
    callbacks = module.configure_callbacks()
    if callbacks:
        listed = [type(cb).__name__ for cb in (callbacks if isinstance(callbacks, (list, tuple)) else [callbacks])]
        raise ValueError(
            f"{name}.configure_callbacks() returned {listed}: Lightning callbacks would run once per client job. "
            "Pass run callbacks for the global model to FederatedTrainer(callbacks=[...]) (lit_asyncfl.callbacks: "
            "ModelCheckpoint, EarlyStopping, ...) instead"
        )
    if engine == "lightning":
        try:
            config = module.configure_optimizers()
        except RuntimeError as exc:
            if "not attached to a `Trainer`" not in str(exc):
                raise
            return  # each job's Trainer provides it (its schedulers are not checked here)
    else:
        module._trainer = JobTrainer(engine, 1, 1)  # what a job offers: an unavailable attribute is refused here
        try:
            config = module.configure_optimizers()
        except AttributeError as exc:
            if "is not available under engine=" not in str(exc):
                raise
            raise ValueError(f"{name}.configure_optimizers(): {exc}") from exc
        finally:
            module._trainer = None
    if engine == "lightning" and not module.automatic_optimization:
        return  # the job's Trainer reads any configuration a manually optimized module returns
    try:
        _, schedulers = parse_optimizers(config)
    except ValueError as exc:
        raise ValueError(
            f"{name}.configure_optimizers(): {exc}; several optimizers need manual optimization "
            "(automatic_optimization = False, as in Lightning) and engine='lightning'"
        ) from None
    except TypeError:
        if engine == "lightning":
            return  # the job's Trainer reads it as Lightning does (e.g. None: no optimizer, with its warning)
        raise
    for scheduler, _ in schedulers:
        if isinstance(scheduler, ReduceLROnPlateau):
            raise ValueError(
                f"{name}.configure_optimizers() returns ReduceLROnPlateau, which needs a monitored metric per local "
                "epoch that client jobs do not compute; use a step or epoch scheduler (it restarts with every "
                "client job)"
            )
    if schedulers:
        kinds = sorted({type(s).__name__ for s, _ in schedulers})
        _log.info(
            f"lit_asyncfl: {name}'s LR schedulers {kinds} restart with every client job (each job builds its "
            "optimizer from configure_optimizers): they decay within a job's local epochs, not across the run; for "
            "a decay across the run by global version add lit_asyncfl.client_callbacks.LearningRateDecay(decay) to the "
            "algorithm's client_callbacks"
        )


#: Client-callback hooks that act on the loss, the gradients, the optimizer or the step count of a job: under
#: manual optimization the module steps its own optimizers, so none of them has a meaning there.
TRAINING_CALLBACK_HOOKS = ("on_train_start", "loss_term", "on_after_backward", "request_step", "on_fresh_model")


def check_manual_optimization(module: L.LightningModule, callbacks: Sequence[ClientCallback]) -> None:
    """Refuse at fit start the client callbacks that change a job's training (its loss, gradients, learning rate or
    model mid-job) for a module with manual optimization: the module calls ``manual_backward`` and steps its own
    optimizers, so a proximal term, a learning-rate decay or a merge would act on what it did not ask for.

    Example:
        >>> from lit_asyncfl.client_callbacks import ProximalTerm
        >>> from lit_asyncfl.models import LogisticRegression
        >>> module = LogisticRegression(input_dim=4)
        >>> check_manual_optimization(module, [ProximalTerm(0.1)])  # automatic optimization: nothing to refuse
        >>> module.automatic_optimization = False
        >>> check_manual_optimization(module, [ProximalTerm(0.1)])
        Traceback (most recent call last):
        ...
        ValueError: LogisticRegression uses manual optimization, but the algorithm's client callback ProximalTerm ...
    """
    if module.automatic_optimization:
        return
    for cb in callbacks:
        hooks = [h for h in TRAINING_CALLBACK_HOOKS if getattr(type(cb), h) is not getattr(ClientCallback, h)]
        if hooks:
            raise ValueError(
                f"{type(module).__name__} uses manual optimization, but the algorithm's client callback "
                f"{type(cb).__name__} changes each job's training ({', '.join(hooks)}), which a module that steps "
                "its own optimizers does not receive; use an algorithm without client-side training changes "
                "(e.g. FedAvg, FedAsync, FedBuff) or automatic optimization"
            )


def check_model_fits_data(module: L.LightningModule, batch: Any, data_name: str) -> None:
    """Run ``training_step`` once on a real client batch (on a copy, without gradients, after the module's batch
    hooks; see :func:`~lit_asyncfl.core.workspace.unseen`) and refuse at fit start a model that does not fit the
    data — wrong input size, fewer classes than labels — with a message naming the module, the data, the batch's
    shapes and the module's own error, instead of an error from deep inside torch at the first job (every engine:
    under ``engine="lightning"`` a ``training_step`` that needs what only a real Trainer offers is not probed).

    Example:
        >>> from lit_asyncfl.models import LogisticRegression
        >>> check_model_fits_data(LogisticRegression(input_dim=64), [torch.zeros(4, 64), torch.zeros(4).long()], "x")
        >>> check_model_fits_data(LogisticRegression(input_dim=10), [torch.zeros(4, 64), torch.zeros(4).long()], "x")
        Traceback (most recent call last):
        ...
        ValueError: LogisticRegression does not fit the data of x: training_step on a client batch of ...
    """
    probe = copy.deepcopy(module)
    probe.log = probe.log_dict = _no_log  # type: ignore[method-assign,assignment]
    probe._trainer = JobTrainer("fast", 1, 1)
    try:
        with torch.no_grad(), unseen():  # the probe's draws (dropout) and prints leave no trace
            batch = probe.on_before_batch_transfer(batch, 0)  # the module's batch hooks, as a job's Trainer runs
            batch = probe.on_after_batch_transfer(probe.transfer_batch_to_device(batch, probe.device, 0), 0)  # them
            probe.training_step(batch, 0)
    except (RuntimeError, IndexError, ValueError, TypeError) as error:
        shapes = pytree.tree_map(lambda leaf: tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else leaf, batch)
        raise ValueError(
            f"{type(module).__name__} does not fit the data of {data_name}: training_step on a client batch of "
            f"shapes {shapes} raised {type(error).__name__}: {error}. Check the model's input size and number of "
            "classes against the data"
        ) from None
    except AttributeError:  # what the stand-in Trainer lacks: the contract check names it
        return


def evaluation_loaders(
    module: L.LightningModule,
    loaders: Callable[[], Any],
    monitor: str | None,
    scheduler: Any,
    callbacks: Sequence[Any],
) -> Any:
    """What evaluates the global model (``loaders()``, the data's validation loaders), or ``None``: a module without
    ``validation_step`` is not evaluated, as ``lightning.Trainer.fit`` skips its validation loop then (nothing else
    calls the model on data: no logits are scored as a classifier's). Said once, at fit start; what needs an
    evaluation is refused there, naming it: a named ``monitor``, a scheduler that reads the accuracy
    (``needs_accuracy``), run callbacks that monitor a metric (``EarlyStopping``, ``ModelCheckpoint(monitor=...)``).
    The same refusals apply when the data has no validation loader.

    Example:
        >>> import warnings
        >>> from lit_asyncfl.models import LogisticRegression
        >>> evaluation_loaders(LogisticRegression(input_dim=4), lambda: ["loader"], None, None, [])
        ['loader']
        >>> class Autoencoder(L.LightningModule):
        ...     def training_step(self, batch, batch_idx): ...
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     evaluation_loaders(Autoencoder(), lambda: ["loader"], None, None, [])
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        Autoencoder has no validation_step: the global model is not evaluated (as lightning.Trainer.fit ...
        >>> evaluation_loaders(Autoencoder(), lambda: ["loader"], "val_loss", None, [])
        Traceback (most recent call last):
        ...
        ValueError: monitor='val_loss' needs an evaluation of the global model, but Autoencoder has no ...
    """
    name = type(module).__name__
    has_step = is_overridden("validation_step", module)
    found = loaders() if has_step else None
    if found is not None:
        return found
    why = f"{name} has no validation_step" if not has_step else "the data has no validation loader"
    fix = f"define {name}.validation_step and log it there" if not has_step else "pass val_dataloaders"
    if monitor is not None:
        raise ValueError(
            f"monitor={monitor!r} needs an evaluation of the global model, but {why}; {fix}, or leave monitor=None "
            "(a run callback reads training_step's metrics per client update, in update.metrics)"
        )
    if getattr(scheduler, "needs_accuracy", False):
        raise ValueError(
            f"{type(scheduler).__name__} reads the global model's accuracy, but {why}; {fix} (logging an "
            "accuracy), or use a scheduler that does not read it (e.g. FedAsync's or FedBuff's)"
        )
    monitoring = [f"{type(cb).__name__}(monitor={cb.monitor!r})" for cb in callbacks if getattr(cb, "monitor", None)]
    if monitoring:
        raise ValueError(
            f"{', '.join(monitoring)} needs an evaluation of the global model, but {why}; {fix}, or drop it (the "
            "run's checkpoints/last.ckpt is written in any case)"
        )
    if not has_step:
        warnings.warn(
            f"{name} has no validation_step: the global model is not evaluated (as lightning.Trainer.fit skips its "
            "validation loop); accuracy, best_accuracy and time_to_target are not available (the summary says "
            "'not evaluated')",
            UserWarning,
            stacklevel=4,  # the user's fit call
        )
    return None
