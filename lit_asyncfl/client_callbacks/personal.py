"""A personal model per client, trained next to the global model's update and never uploaded (Ditto)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from lit_asyncfl.checks import check_int, check_number
from lit_asyncfl.client_callbacks.base import ProximalTerm
from lit_asyncfl.client_callbacks.client_state import _StatefulClientCallback
from lit_asyncfl.data.shards import steps_per_epoch
from lit_asyncfl.engines.base import generators_kept

if TYPE_CHECKING:
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.base import LocalEngine

#: :math:`\lambda` by default (the Ditto authors' run scripts), which Ditto's preset repeats by name.
LAM = 1.0


class _ProximalToAnchor(ProximalTerm):
    r"""FedProx's term :math:`\frac{\lambda}{2} \lVert v - w \rVert^2` towards a given anchor :math:`w` (set in
    :attr:`anchor` before each job) instead of the job's start model."""

    def __init__(self, lam: float) -> None:
        super().__init__(mu=lam)
        self.anchor: Tensor | None = None

    def on_train_start(self, trainer: LocalEngine, job: ClientJob, start_weights: Tensor) -> None:  # type: ignore[override]
        assert self.anchor is not None
        self._anchors = trainer.flat.param_views(self.anchor)


class PersonalModel(_StatefulClientCallback):
    r"""Ditto's personal model (Li, Hu, Beirami & Smith, ICML 2021, Algorithm 1): each client :math:`k` keeps its
    own model :math:`v_k` and, in every job, after the job's update of the global model, takes :math:`s` local
    steps on its personal objective

    .. math:: h_k(v_k; w^t) = F_k(v_k) + \frac{\lambda}{2} \lVert v_k - w^t \rVert^2

    from its stored :math:`v_k` (the global model the job starts from, :math:`w^t`, at the client's first job).
    The update sent to the server is the job's ordinary local training of :math:`w^t`, unchanged: the personal
    model is never uploaded and the global model is exactly the one of the same algorithm without this callback.

    The steps are a job of the run's engine (``fast`` or ``lightning``) on a private copy of the module: the
    module's own ``training_step`` and ``configure_optimizers`` (a fresh optimizer per job, as every job's), the
    gradient of the term added after ``backward`` (:class:`~lit_asyncfl.client_callbacks.ProximalTerm`'s
    :math:`\lambda (v - w^t)`, anchored at :math:`w^t`), on the same batches as the job's global update (the job's
    seed: the authors' code takes each personal and global step on the same mini-batch). Generators are restored
    afterwards, so the run's other draws do not move. :math:`v_k` lives in the run's
    :class:`~lit_asyncfl.core.client_state.ClientStateStore` (spilled to disk beyond ``client_state_budget``,
    checkpointed with the run); :meth:`personal_weights` gives it to
    :class:`~lit_asyncfl.callbacks.PerClientEvaluation`.

    Resolutions:

    * **Steps** :math:`s`: ``steps=None`` takes as many as the job's global update (its local epochs, or its own
      ``local_steps``), as the authors' code (``local_iters`` for both); an integer takes that many, epochs begun as
      they need.
    * **A diverged personal model** (non-finite weights) is not stored: the client keeps its previous
      :math:`v_k` (``update.info["personal_model"]`` says so).
    * **Virtual time**: the job's simulated compute time is the global update's; the personal steps add none
      (the device model times one local training per job).

    Args:
        lam: :math:`\lambda \ge 0` (0: :math:`v_k` is plain local training of the client's own model).
        steps: :math:`s \ge 1` personal steps per job, or ``None`` for the job's own number.

    Example:
        >>> cb = PersonalModel(lam=0.5, steps=4)
        >>> cb.lam, cb.steps, cb.uses_client_state, cb.runs_on_workers, cb.personal_weights(0)
        (0.5, 4, True, False, None)
    """

    #: Name of :math:`v_k` in the client state store.
    STATE_NAME = "ditto_personal"

    def __init__(self, lam: float = LAM, steps: int | None = None) -> None:
        check_number("Ditto lam", lam, 0)
        check_int("Ditto steps", steps, 1, optional=True)
        self.lam = lam
        self.steps = steps
        self._term = _ProximalToAnchor(lam)
        self._engine: LocalEngine | None = None

    def on_fit_start(self, num_clients: int) -> None:
        self._engine = None

    def personal_weights(self, client: int) -> Tensor | None:
        return self.store.get(client, self.STATE_NAME)

    def _personal_engine(self, trainer: LocalEngine) -> LocalEngine:
        """An engine of the job's kind on a private copy of its module, with the term as its only callback."""
        if self._engine is None or type(self._engine) is not type(trainer):
            module = trainer.module
            saved = module.__dict__.get("_trainer")
            module._trainer = None  # the job's stand-in trainer is not copied
            try:
                self._engine = type(trainer)(
                    module, trainer.shards, trainer.batch_size, [self._term], trainer.device, onednn=trainer.onednn
                )
            finally:
                module._trainer = saved
        return self._engine

    def personal_job(self, job: ClientJob, num_samples: int, batch_size: int, drop_last: bool) -> ClientJob:
        """The job of the personal steps: ``job``'s client, seed (its batches) and steps (or :attr:`steps`)."""
        if self.steps is None:
            return dataclasses.replace(job, request_step=None, fresh_version=None)
        per_epoch = max(1, steps_per_epoch(num_samples, batch_size, drop_last))
        return dataclasses.replace(
            job,
            local_epochs=-(-self.steps // per_epoch),
            num_steps=self.steps,
            local_steps=self.steps,
            request_step=None,
            fresh_version=None,
        )

    def on_train_end(self, trainer: LocalEngine, job: ClientJob, update: ClientUpdate) -> None:  # type: ignore[override]
        engine = self._personal_engine(trainer)
        w_t = update.base_weights
        v_k = self.store.get(job.client, self.STATE_NAME)
        start = w_t if v_k is None else v_k.to(w_t.device)
        shards = trainer.shards
        personal = self.personal_job(job, shards.num_samples(job.client), trainer.batch_size, shards.drop_last)
        self._term.anchor = w_t
        try:
            with generators_kept(trainer.device):
                new = engine.train(personal, start).weights
        finally:
            self._term.anchor = None
        if bool(torch.isfinite(new).all()):
            self.store.put(job.client, self.STATE_NAME, new)
        else:  # a diverged personal model is not kept, see Resolutions
            update.info["personal_model"] = "not learned: non-finite weights"
