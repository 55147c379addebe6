"""Client callbacks that keep per-client state in the run's
:class:`~lit_asyncfl.core.client_state.ClientStateStore`: MOON's model-contrastive term and FedDyn's dynamic
regulariser.

Both keep ``runs_on_workers = False`` and declare :attr:`~lit_asyncfl.client_callbacks.ClientCallback.carries_state`:
the store lives in the simulation's process, and under a :class:`~lit_asyncfl.executors.RayExecutor` a job carries
its client's entry to the worker and brings the new one back, put into the store when the job's update is consumed
(the weights are the same as sequentially).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch import Tensor

from lit_asyncfl.checks import check_number
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.core.client_state import ClientStateStore
from lit_asyncfl.core.workspace import ModelWorkspace, _no_log
from lit_asyncfl.functional.contrastive import model_contrastive_loss
from lit_asyncfl.functional.feddyn import ALPHA, feddyn_client_state
from lit_asyncfl.loops.stand_in import JobTrainer

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.fast import FastEngine

# ModelContrastive's defaults (the MOON authors' code), which MOON's preset repeats by name.
MU = 1.0
TAU = 0.5


class _StatefulClientCallback(ClientCallback):
    """A client callback with tensors per client in :attr:`client_state` (an in-memory store when used without a
    trainer)."""

    uses_client_state = True
    runs_on_workers = False  # the store is in the simulation's process: a job carries its client's entry
    carries_state = True
    #: Name of the callback's entry in the client state store.
    STATE_NAME: str
    _loaded: Tensor | None = None

    @property
    def store(self) -> ClientStateStore:
        if self.client_state is None:
            self.client_state = ClientStateStore()
        return self.client_state

    def job_state(self, job: ClientJob) -> Tensor | None:
        """The client's entry (``None`` before its first job), read from the store when the job is shipped."""
        return self.store.get(job.client, self.STATE_NAME)

    def load_job_state(self, job: ClientJob, state: Tensor | None) -> None:
        self.client_state = ClientStateStore()  # a worker's copy holds the job's client's entry only
        if state is not None:
            self.store.put(job.client, self.STATE_NAME, state)
        self._loaded = self.store.get(job.client, self.STATE_NAME)

    def job_result(self, job: ClientJob) -> Tensor | None:
        """The entry the job put, or ``None`` if it put none (a diverged job keeps the previous one)."""
        value = self.store.get(job.client, self.STATE_NAME)
        return None if value is self._loaded else value

    def commit_job_result(self, job: ClientJob, result: Tensor | None) -> None:
        if result is not None:
            self.store.put(job.client, self.STATE_NAME, result)


def _workspace(module: L.LightningModule) -> ModelWorkspace:
    """A private copy of the engine's module (detached from the job's stand-in trainer while copied)."""
    saved = module.__dict__.get("_trainer")
    module._trainer = None
    try:
        return ModelWorkspace(module, next(module.parameters()).device)
    finally:
        module._trainer = saved


class ModelContrastive(_StatefulClientCallback):
    r"""MOON's model-contrastive term (Li, He & Song, CVPR 2021) added to every local step's loss.

    .. math:: \ell = \ell_{task} + \mu\, \ell_{con}(z, z_{glob}, z_{prev})

    (:func:`~lit_asyncfl.functional.contrastive.model_contrastive_loss`). :math:`z` is the representation of the
    batch by the module being trained, from the same forward pass as the task loss; :math:`z_{glob}` by the global
    model the job started from and :math:`z_{prev}` by the client's previous local model (its weights at the end
    of its last job, kept in the run's client state store), both in eval mode and without gradient, as the authors'
    code does.

    **The module's representation**: the module defines ``representation(x)`` and its ``forward`` computes through
    it (``forward(x) = head(self.representation(x))``); the models of :mod:`lit_asyncfl.models` do (the input of
    their classifier layer). During a job the callback records the input and output of the module's
    ``representation`` call inside ``training_step``; a module without the method is refused at fit start, and a
    ``training_step`` that never calls it, or a representation without trainable parameters (a linear model), is
    refused at the first step.

    Resolutions:

    * **A client's first job** has no previous local model: the term is zero, as in the authors' code, whose first
      round has an empty model pool (only the positive logit: a cross-entropy of 0).
    * **Representation**: the authors' models end in a two-layer projection head whose output is :math:`z` and feeds
      the classifier; the bundled models are not changed, and :math:`z` is the input of their classifier layer.
    * **Loss statistics**: the job's ``train_loss`` is the total loss (task + term), as the authors log it.
    * **A diverged job** (non-finite weights, which the server rejects) leaves the client's previous model as it
      was (``update.info["client_state"]`` says so): stored, a NaN model would make every later job of the client
      NaN (:math:`z_{prev}`), so one divergence would exclude the client for the rest of the run.

    Memory: one model copy per client that has trained (in the store: in memory up to its budget, on disk beyond),
    and two module copies for the global and previous models.

    Args:
        mu: Weight :math:`\mu \ge 0` of the term.
        tau: Temperature :math:`\tau > 0`.

    Example:
        >>> cb = ModelContrastive(mu=1.0, tau=0.5)
        >>> cb.mu, cb.tau, cb.uses_client_state, cb.carries_state
        (1.0, 0.5, True, True)
    """

    #: Name of the previous local model in the client state store.
    STATE_NAME = "moon_previous"

    def __init__(self, mu: float = MU, tau: float = TAU) -> None:
        check_number("MOON mu", mu, 0)
        check_number("MOON tau", tau, 0, open_min=True)
        self.mu, self.tau = mu, tau
        self._copies: tuple[ModelWorkspace, ModelWorkspace] | None = None
        self._has_previous = False
        self._recorded: tuple[Tensor, Tensor] | None = None

    def check_module(self, module: L.LightningModule) -> None:
        if not callable(getattr(module, "representation", None)):
            raise ValueError(
                f"MOON needs the module's representation z: {type(module).__name__} has no representation(x) "
                "method. Add `def representation(self, x)` returning the features the classifier reads, and compute "
                "forward through it (`return self.head(self.representation(x))`); see lit_asyncfl.models"
            )

    def check_batch(self, module: L.LightningModule, batch: Any) -> None:
        """At fit start, on a real client batch (a copy of the module; no trace left): refuse a ``training_step``
        that never calls ``representation`` or a representation that depends on no trainable parameter (e.g.
        ``LogisticRegression``), instead of failing at the first job and blaming its client."""
        probe = copy.deepcopy(module)
        probe.log = probe.log_dict = _no_log  # type: ignore[method-assign,assignment]
        probe._trainer = JobTrainer("fast", 1, 1)
        original, recorded = probe.representation, []

        def recorder(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            z = original(x, *args, **kwargs)
            recorded.append(z)
            return z

        probe.representation = recorder  # type: ignore[method-assign]
        try:
            with torch.enable_grad(), torch.random.fork_rng(devices=[]):
                probe.train()
                probe.training_step(batch, 0)
        except Exception:  # the model-fits-data check and the first job report the module's own errors
            return
        name = type(module).__name__
        if not recorded:
            raise ValueError(
                f"MOON: {name}.training_step did not call self.representation(x); compute forward through "
                "representation(x) so that one forward pass gives both the loss and z"
            )
        if not recorded[0].requires_grad:
            raise ValueError(
                f"MOON: the representation of {name} depends on no trainable parameter (a linear model such as "
                "LogisticRegression): the contrastive term would change nothing; use a model with hidden layers "
                "(e.g. LeNet5, MLP)"
            )

    def on_fit_start(self, num_clients: int) -> None:
        self._copies = None
        self._recorded = None

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        module = trainer.module
        if not module.automatic_optimization:
            raise ValueError("MOON adds a term to the loss training_step returns: use automatic optimization")
        module.__dict__.pop("representation", None)  # a job that raised may have left the recorder
        if self._copies is None:
            self._copies = (_workspace(module), _workspace(module))
        glob, prev = self._copies
        glob.flat.load(start_weights)
        glob.module.eval()
        previous = self.store.get(job.client, self.STATE_NAME)
        self._has_previous = previous is not None
        if previous is not None:
            prev.flat.load(previous.to(prev.flat.flat.device))
            prev.module.eval()
        original = module.representation

        def recorder(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
            z = original(x, *args, **kwargs)
            self._recorded = (x, z)
            return z

        module.representation = recorder  # type: ignore[method-assign]

    def loss_term(self, trainer: FastEngine, job: ClientJob, batch: Any) -> Tensor | None:
        recorded, self._recorded = self._recorded, None
        if recorded is None:
            raise ValueError(
                f"MOON: {type(trainer.module).__name__}.training_step did not call self.representation(x); compute "
                "forward through representation(x) so that one forward pass gives both the loss and z"
            )
        x, z = recorded
        if not z.requires_grad:
            raise ValueError(
                f"MOON: the representation of {type(trainer.module).__name__} depends on no trainable parameter (a "
                "linear model): the contrastive term would change nothing; use a model with hidden layers"
            )
        if not self._has_previous or self.mu == 0:
            return None
        assert self._copies is not None
        glob, prev = self._copies
        with torch.no_grad():
            z_glob = glob.module.representation(x)
            z_prev = prev.module.representation(x)
        return self.mu * model_contrastive_loss(z, z_glob, z_prev, self.tau)

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        trainer.module.__dict__.pop("representation", None)
        self._recorded = None
        if bool(torch.isfinite(update.weights).all()):
            self.store.put(job.client, self.STATE_NAME, update.weights)
        else:  # a diverged job (the server rejects its upload) keeps the client's previous model, see Resolutions
            update.info["client_state"] = "not learned: non-finite weights"

    def on_job_dropped(self, job: ClientJob, reason: str) -> None:
        self._recorded = None


class DynamicRegularizer(_StatefulClientCallback):
    r"""FedDyn's client objective (Acar et al., ICLR 2021) on the gradient, and its per-client state.

    .. math::
        \theta_k^t = \arg\min_\theta\; L_k(\theta) - \langle g_k, \theta \rangle
        + \frac{\alpha}{2} \lVert \theta - \theta^{t-1} \rVert^2,
        \qquad g_k \leftarrow g_k - \alpha (\theta_k^t - \theta^{t-1})

    Every local step adds :math:`-g_k + \alpha(\theta - \theta^{t-1})` to the task gradient
    (:func:`~lit_asyncfl.functional.feddyn.feddyn_gradient`, as ``ProximalTerm`` adds its term); :math:`\theta^{t-1}`
    is the job's start model and :math:`g_k` (zero before the client's first job) lives in the run's client state
    store. After the job, :math:`g_k` is updated (:func:`~lit_asyncfl.functional.feddyn.feddyn_client_state`),
    unless the job diverged (non-finite weights, which the server rejects without changing :math:`h`): :math:`g_k`
    then stays as it was (``update.info["client_state"]`` says so), which keeps :math:`h = \frac{1}{m} \sum_k g_k`
    and spares the client a NaN correction in every later job.

    With ``max_grad_norm`` :math:`C` the step's gradient is clipped as the authors' code does, after the linear
    terms and before :math:`\alpha \theta` (see :func:`~lit_asyncfl.functional.feddyn.feddyn_gradient`).

    Memory: one model-sized vector per client that has trained (in the store).

    Args:
        alpha: :math:`\alpha > 0`.
        max_grad_norm: :math:`C > 0`, or ``None`` for no clipping.

    Example:
        >>> DynamicRegularizer(alpha=0.01).alpha
        0.01
    """

    #: Name of :math:`g_k` in the client state store.
    STATE_NAME = "feddyn_gradient"

    def __init__(self, alpha: float = ALPHA, max_grad_norm: float | None = None) -> None:
        check_number("FedDyn alpha", alpha, 0, open_min=True)
        check_number("max_grad_norm", max_grad_norm, 0, open_min=True, optional=True)
        self.alpha = alpha
        self.max_grad_norm = max_grad_norm
        self._anchors: list[Tensor] = []
        self._state: list[Tensor] | None = None

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        self._anchors = trainer.flat.param_views(start_weights)
        g_k = self.store.get(job.client, self.STATE_NAME)  # over the parameters (not the floating buffers)
        self._state = None if g_k is None else trainer.flat.param_views(g_k.to(start_weights.device))

    def on_after_backward(self, trainer: FastEngine, job: ClientJob) -> None:
        triples = [
            (p, a, None if self._state is None else g)
            for p, a, g in zip(trainer.flat.params, self._anchors, self._state or self._anchors)
            if p.grad is not None
        ]
        if not triples:
            return
        params, anchors, states = zip(*triples)
        grads = [p.grad for p in params]
        if self.max_grad_norm is not None:  # the authors' order: linear terms, clip, then alpha * theta
            torch._foreach_add_(grads, list(anchors), alpha=-self.alpha)
            if self._state is not None:
                torch._foreach_sub_(grads, list(states))
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
            torch._foreach_add_(grads, list(params), alpha=self.alpha)
            return
        torch._foreach_add_(grads, torch._foreach_sub(params, anchors), alpha=self.alpha)
        if self._state is not None:
            torch._foreach_sub_(grads, list(states))

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        g_k = self.store.get(job.client, self.STATE_NAME)
        n = trainer.flat.param_numel  # the parameters (floating buffers are averaged, as the authors' code)
        theta_k, theta_server = update.weights[:n], update.base_weights[:n]
        new = feddyn_client_state(None if g_k is None else g_k.to(theta_k.device), theta_k, theta_server, self.alpha)
        if bool(torch.isfinite(new).all()):
            self.store.put(job.client, self.STATE_NAME, new)
        else:  # a diverged job (the server rejects its upload, h stays) keeps g_k, see the class docstring
            update.info["client_state"] = "not learned: non-finite weights"
        self._state = None
