"""What every local-training engine shares: the module copy, job seeding, the update and the fresh-model
hand-over (the guarantee that every engine gives the same results rests on these, so they live once), and the CPU
kernel choice around a job (oneDNN on or off for small convolutions)."""

from __future__ import annotations

import contextlib
import copy
import random
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn
from torch.optim import Optimizer
from torchmetrics import Metric

from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.flat import FlatParameters
from lit_asyncfl.core.update import ClientJob, ClientUpdate
from lit_asyncfl.core.workspace import ModelWorkspace, _no_log, unseen
from lit_asyncfl.data.shards import ClientShards, DatasetShards
from lit_asyncfl.loops.stand_in import JobTrainer


def parse_optimizers(config: Any) -> tuple[Optimizer, list[tuple[Any, str]]]:
    """Read what ``configure_optimizers`` returned: one optimizer and its schedulers with their interval.

    Accepts an optimizer, a one-element list/tuple, ``([optimizer], [schedulers])`` and the dict form
    ``{"optimizer": ..., "lr_scheduler": ...}``.
    """
    schedulers: list[Any] = []
    if isinstance(config, dict):
        optimizers, schedulers = [config["optimizer"]], config.get("lr_scheduler", [])
        schedulers = schedulers if isinstance(schedulers, (list, tuple)) else [schedulers]
    elif isinstance(config, Optimizer):
        optimizers = [config]
    elif isinstance(config, (list, tuple)) and len(config) == 2 and isinstance(config[0], (list, tuple)):
        optimizers, schedulers = list(config[0]), list(config[1])
    elif isinstance(config, (list, tuple)):
        optimizers = list(config)
    else:
        raise TypeError(f"configure_optimizers returned {type(config).__name__}; expected an optimizer")
    if len(optimizers) != 1 or not isinstance(optimizers[0], Optimizer):
        raise ValueError(f"the fast local trainer supports exactly one optimizer, got {len(optimizers)}")
    parsed = []
    for sched in schedulers:
        if isinstance(sched, dict):
            parsed.append((sched["scheduler"], sched.get("interval", "epoch")))
        else:
            parsed.append((sched, "epoch"))
    return optimizers[0], parsed


@contextlib.contextmanager
def generators_kept(device: torch.device) -> Iterator[None]:
    """Leave this process's global random generators as they were around local training: torch's (and, on CUDA,
    the device's), Python's and NumPy's.

    A job seeds them with its own seed (:meth:`LocalEngine.seed_job`). Every executor trains jobs inside this, so
    user code of the simulation's process that draws from them (a run callback, an aggregator) sees the same
    numbers whether the jobs train in this process or on Ray workers, and whenever they train.

    Example:
        >>> state = torch.random.get_rng_state()
        >>> with generators_kept(torch.device("cpu")):
        ...     _ = torch.manual_seed(1), random.seed(1), np.random.seed(1)
        >>> torch.equal(torch.random.get_rng_state(), state)
        True
    """
    state = generator_state(device)
    try:
        yield
    finally:
        restore_generators(device, state)


def generator_state(device: torch.device) -> tuple[Any, ...]:
    """The state of this process's global random generators a job draws from: torch's (and, on CUDA, the
    device's), Python's and NumPy's; :func:`restore_generators` puts it back (e.g. to resume a parked job).

    Example:
        >>> state = generator_state(torch.device("cpu"))
        >>> a = torch.rand(1); restore_generators(torch.device("cpu"), state)
        >>> torch.equal(torch.rand(1), a)
        True
    """
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    kind, key, *rest = np.random.get_state()
    # The key as a list of ints: NumPy's set_state copies it element by element, 1 us from a list, 25 from an array.
    return torch.random.get_rng_state(), cuda, random.getstate(), (kind, key.tolist(), *rest)


def restore_generators(device: torch.device, state: tuple[Any, ...]) -> None:
    """Set this process's global random generators to ``state``, a value of :func:`generator_state`."""
    torch.random.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
    random.setstate(state[2])
    np.random.set_state(state[3])


def in_training_mode(module: nn.Module) -> bool:
    """Whether ``module.train()`` would change nothing: every submodule it reaches is in training mode and none
    overrides ``train`` (an override may do more than set the flags, so it is always called).

    Example:
        >>> net = nn.Sequential(nn.Linear(2, 2), nn.Dropout())
        >>> in_training_mode(net), in_training_mode(net[1].eval()), in_training_mode(net.train())
        (True, False, True)
    """
    if not module.training or type(module).train is not nn.Module.train:
        return False
    for child in module._modules.values():
        if child is not None and not in_training_mode(child):
            return False
    return True


class LocalEngine:
    """State every local-training engine holds: a private copy of the user's module bound to one flat weight vector,
    the clients' data, the batch size, the client callbacks, the device and the kernel choice.

    Args:
        module: The user's module; a private deep copy is trained.
        shards: The clients' data.
        batch_size: Local mini-batch size.
        callbacks: Client callbacks.
        device: Training device.
        onednn: ``torch.backends.mkldnn.enabled`` while a job trains (restored afterwards); ``None``: leave it.

    An engine takes these arguments (a subclass adds its own after them) and says in :meth:`check_module` what
    module it refuses.
    """

    #: Make the copy's ``self.log`` a no-op (engines without a ``lightning.Trainer``).
    silence_log: bool = True

    def check_module(self, module: L.LightningModule) -> None:
        """Refuse a module this engine cannot train, before anything is copied (default: none)."""

    def __init__(
        self,
        module: L.LightningModule,
        shards: ClientShards | DatasetShards,
        batch_size: int,
        callbacks: Sequence[ClientCallback] = (),
        device: torch.device | str = "cpu",
        onednn: bool | None = None,
    ) -> None:
        self.check_module(module)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        if self.silence_log:
            workspace = ModelWorkspace(module, self.device)
            self.module, self.flat = workspace.module, workspace.flat
        else:
            self.module = copy.deepcopy(module).to(self.device)
            self.flat = FlatParameters(self.module)
        self.shards = shards
        self.batch_size = batch_size
        self.callbacks = list(callbacks)
        self.onednn = onednn
        #: Extras of the job in progress, copied into ``update.info`` (callbacks add to it).
        self.job_info: dict[str, Any] = {}
        #: What the job in progress logs in ``training_step`` (an engine that collects it sets one per job).
        self.job_log: Any = None
        #: The module's torchmetrics objects, reset at the start of every job (as each Lightning fit starts anew).
        self.metrics = [m for m in self.module.modules() if isinstance(m, Metric)]

    def reset_metrics(self) -> None:
        """Reset the module's metric objects: a job never sees (or keeps in memory) another job's updates."""
        for metric in self.metrics:
            metric.reset()

    def seed_job(self, job: ClientJob) -> torch.Generator:
        """Seed every generator user code may draw from with the job's own seed, and return the generator of the
        job's batch order. Every engine seeds a job this way: that is what makes their results identical and
        independent of which job ran before."""
        # torch.manual_seed would also walk every lazy accelerator backend: milliseconds per call, more than a
        # small local training.
        torch.default_generator.manual_seed(job.seed)
        if self.device.type == "cuda":
            torch.cuda.manual_seed(job.seed)
        random.seed(job.seed)
        np.random.seed(job.seed % 2**32)
        return self.job_generator(job)

    @staticmethod
    def job_generator(job: ClientJob) -> torch.Generator:
        """The generator of a job's batch order (and of its data module's random augmentations)."""
        return torch.Generator().manual_seed(job.seed)

    def start_job(self, job: ClientJob, start_weights: Tensor) -> torch.Generator:
        """Load the start weights, reset the metric objects, switch to training mode and seed the job."""
        self.flat.load(start_weights)
        self.reset_metrics()
        if not in_training_mode(self.module):  # module.train() walks and sets every submodule: 20 us a job
            self.module.train()
        return self.seed_job(job)

    def make_update(
        self, job: ClientJob, weights: Tensor, start_weights: Tensor, steps: int, loss_sum: Any, info: dict[str, Any]
    ) -> ClientUpdate:
        """The :class:`~lit_asyncfl.core.update.ClientUpdate` of a job that took ``steps`` steps (mean loss from
        ``loss_sum``; NaN without steps)."""
        return ClientUpdate(
            job=job,
            weights=weights,
            base_weights=start_weights,
            num_samples=self.shards.num_samples(job.client),
            num_steps=steps,
            train_loss=float(loss_sum) / steps if steps and loss_sum is not None else float("nan"),
            info=info,
        )

    def finish_job(self, job: ClientJob, start_weights: Tensor, steps: int, loss_sum: Any) -> ClientUpdate:
        """The update of the job just trained on :attr:`module`, after the client callbacks' ``on_train_end``."""
        update = self.make_update(job, self.flat.read(), start_weights, steps, loss_sum, self.job_info)
        update.batches_tracked = self.flat.tracked()
        if self.job_log is not None:
            update.metrics = self.job_log.results()[0]
            self.job_log = None
        for cb in self.callbacks:
            cb.on_train_end(self, job, update)  # type: ignore[arg-type]
        return update

    def fresh_model(self, job: ClientJob, fresh: tuple[Tensor, int] | None, batch: Any) -> None:
        """Hand the server's answer to the job's request to the client callbacks' ``on_fresh_model``."""
        assert fresh is not None
        module, own = self.module, self.module.__dict__
        saved = {name: own[name] for name in ("log", "log_dict") if name in own}
        # The callbacks' extra forward passes (e.g. FedASMU's losses before and after the merge) are not training
        # steps: what training_step logs there is not the job's, and after a Trainer's fit self.log would raise.
        module.log = module.log_dict = _no_log  # type: ignore[method-assign,assignment]
        try:
            for cb in self.callbacks:
                cb.on_fresh_model(self, job, fresh[0], fresh[1], batch)  # type: ignore[arg-type]
        finally:
            del module.log, module.log_dict
            for name, value in saved.items():
                setattr(module, name, value)


#: oneDNN is switched off (``onednn=None``, automatic) when the largest convolution input of a training batch has
#: at most this many elements and the batch at most :data:`ONEDNN_AUTO_MAX_BATCH` samples. Measured on a 2-core
#: CPU, one thread, SGD steps of LeNet-5, speed-up of oneDNN off: 8x8 digits 1.51x (batch 5), 1.28x (10), 1.13x
#: (16), 1.10x (20), 0.98x (32), 0.92x (50); 28x28 inputs 1.36x (batch 5), 1.12x (10; 11,760 elements), 0.97x (16;
#: 18,816), 0.82x (20); 3x32x32 inputs at batch 10 (30,720 elements) 0.66x; ResNet-20 on 32x32 at batch 10 0.58x.
#: The rule picks the faster setting at every one of these points.
ONEDNN_AUTO_MAX_ELEMENTS = 12_000
#: See :data:`ONEDNN_AUTO_MAX_ELEMENTS`.
ONEDNN_AUTO_MAX_BATCH = 20


def largest_conv_input(module: nn.Module, batch: Any, trainer: Any = None) -> torch.Size | None:
    """Shape of the largest convolution input when the module's ``training_step`` runs on ``batch``.

    The step runs on a copy of the module on the batch's device (its state, e.g. a step counter, untouched), in
    evaluation mode without gradients, ``self.log`` silenced and ``self.trainer`` the stand-in ``trainer``, with
    the CPU random state restored afterwards (:func:`~lit_asyncfl.core.workspace.unseen`), so neither the weights,
    the buffers nor the random stream change.

    Args:
        module: A ``LightningModule`` (its ``training_step`` is run) or a plain module (called on ``batch[0]``).
        batch: One training batch.
        trainer: What ``self.trainer`` reads in the step (default: a ``fast`` job's
            :class:`~lit_asyncfl.loops.JobTrainer` of one epoch of one batch).

    Returns:
        The shape (batch dimension first) of the input with the most elements, or ``None`` when the module has
        no convolution or the step raises (what it raises is left to the first job).

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Conv2d(4, 2, 3))
        >>> largest_conv_input(net, [torch.zeros(10, 1, 8, 8)])  # the second conv sees 10 x 4 x 6 x 6
        torch.Size([10, 4, 6, 6])
        >>> largest_conv_input(nn.Linear(3, 1), [torch.zeros(2, 3)]) is None
        True
    """
    if not any(isinstance(m, nn.modules.conv._ConvNd) for m in module.modules()):
        return None
    leaves = [leaf for leaf in pytree.tree_leaves(batch) if isinstance(leaf, torch.Tensor)]
    probe = copy.deepcopy(module).to(leaves[0].device if leaves else "cpu").eval()  # where the batch is
    shapes: list[torch.Size] = []
    for m in probe.modules():
        if isinstance(m, nn.modules.conv._ConvNd):
            m.register_forward_pre_hook(lambda mod, args: shapes.append(args[0].shape))
    step = getattr(probe, "training_step", None)
    if isinstance(probe, L.LightningModule):
        probe.log = probe.log_dict = _no_log  # type: ignore[method-assign,assignment]
        probe._trainer = JobTrainer("fast", 1, 1) if trainer is None else trainer
    try:
        with unseen(), torch.no_grad():
            step(batch, 0) if step is not None else probe(batch[0])
    except Exception:  # not this probe's business: the first job raises it
        return None
    return max(shapes, key=lambda shape: shape.numel(), default=None)


def choose_onednn(
    onednn: bool | None, module: nn.Module, batch: Any, device: torch.device, trainer: Any = None
) -> bool | None:
    """The oneDNN setting for local training: the user's choice, else the automatic one.

    Automatic (``onednn=None``): off on the CPU when the module's largest convolution input on ``batch`` has at
    most :data:`ONEDNN_AUTO_MAX_ELEMENTS` elements and :data:`ONEDNN_AUTO_MAX_BATCH` samples; otherwise (or when
    ``training_step`` raises on the probe, see :func:`largest_conv_input`, run with ``self.trainer`` the stand-in
    ``trainer``) left as it is (``None``). The choice depends only on the model and the batch shape, never on
    timings, so it is the same in every run of a configuration.

    Example:
        >>> net = nn.Sequential(nn.Conv2d(1, 4, 3))
        >>> choose_onednn(None, net, [torch.zeros(10, 1, 8, 8)], torch.device("cpu"))
        False
        >>> choose_onednn(None, net, [torch.zeros(10, 1, 64, 64)], torch.device("cpu")) is None
        True
        >>> choose_onednn(None, net, [torch.zeros(32, 1, 8, 8)], torch.device("cpu")) is None
        True
        >>> choose_onednn(True, net, [torch.zeros(10, 1, 8, 8)], torch.device("cpu"))
        True
    """
    if onednn is not None or device.type != "cpu":
        return onednn
    largest = largest_conv_input(module, batch, trainer)
    if largest is not None and largest.numel() <= ONEDNN_AUTO_MAX_ELEMENTS and largest[0] <= ONEDNN_AUTO_MAX_BATCH:
        return False
    return None


class OneDNN:
    """Context manager setting ``torch.backends.mkldnn.enabled`` (``None``: leave it) and restoring it on exit.

    Example:
        >>> with OneDNN(False):
        ...     torch.backends.mkldnn.enabled
        False
    """

    def __init__(self, enabled: bool | None) -> None:
        self.enabled = enabled
        self._previous: bool | None = None

    def __enter__(self) -> None:
        if self.enabled is not None:
            self._previous = torch.backends.mkldnn.enabled
            torch.backends.mkldnn.enabled = self.enabled

    def __exit__(self, *exc: Any) -> None:
        if self.enabled is not None:
            torch.backends.mkldnn.enabled = self._previous
