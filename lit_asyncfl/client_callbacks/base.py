"""Client callbacks: hooks into local training (FedProx's proximal term, FedASMU's fresh-model merge, ...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lit_asyncfl.checks import check_fraction, check_number

if TYPE_CHECKING:
    from lit_asyncfl.core.client_state import ClientStateStore
    from lit_asyncfl.core.update import ClientJob, ClientUpdate
    from lit_asyncfl.engines.fast import FastEngine

#: :class:`ProximalTerm`'s :math:`\mu` by default (FedProx's; ASO-Fed's :math:`\lambda` too).
MU = 0.01
#: :class:`LearningRateDecay`'s :math:`\gamma` by default (FedADT's).
LR_DECAY = 0.9999


class ClientCallback:
    """Base class of client callbacks; every hook does nothing by default.

    One instance serves every client (the local trainer is shared): keep per-client state in containers indexed
    by ``job.client`` and return it from :meth:`state_dict` so checkpoints carry it.
    """

    #: ``True`` when what the callback does to a job depends only on the job and its start weights and it keeps no
    #: state across jobs: a :class:`~lit_asyncfl.executors.RayExecutor` may then train jobs on other
    #: processes, ahead of their events, each with a copy of the callback. ``False`` (the safe default): unless the
    #: callback :attr:`carries_state`, a Ray run trains its jobs in the simulation's process, at their events, as the
    #: sequential executor does (a warning names the callback).
    runs_on_workers: bool = False
    #: ``True`` when the callback keeps per-client tensors in the run's
    #: :class:`~lit_asyncfl.core.client_state.ClientStateStore` (``FederatedTrainer(client_state_budget=...)``): the
    #: trainer sets :attr:`client_state` before the run and checkpoints the store with the simulation. Such a
    #: callback must keep ``runs_on_workers = False``: the store lives in the simulation's process (it
    #: :attr:`carries_state` instead: a job's entries travel with it).
    uses_client_state: bool = False
    #: The run's per-client state store (set by the trainer when :attr:`uses_client_state`).
    client_state: ClientStateStore | None = None
    #: ``True`` when the callback keeps state across jobs and declares what a job reads and writes of it with
    #: :meth:`job_state`, :meth:`load_job_state`, :meth:`job_result` and :meth:`commit_job_result`: a
    #: :class:`~lit_asyncfl.executors.RayExecutor` then trains its jobs on workers, each job carrying its part of the
    #: state there and its changes back, committed here when the job's update is consumed (where the sequential
    #: executor runs ``on_train_end``). The defaults carry :attr:`client_state_attributes`.
    carries_state: bool = False
    #: Names of this callback's attributes that are dicts keyed by client id, of which a job of client ``c`` reads and
    #: writes entry ``c`` only: what the default :meth:`job_state` and :meth:`job_result` carry.
    client_state_attributes: tuple[str, ...] = ()
    #: ``False`` when :meth:`commit_job_result` learns nothing that a later event reads, because what a job teaches
    #: is learned at its merge (:meth:`commit_merge_result`; FedASMU's
    #: :class:`~lit_asyncfl.client_callbacks.FreshModelMerge`). The sequential executor trains a job with a request
    #: whole at its request event, so its ``on_train_end`` learns there; a Ray run lets the rest of such a job train
    #: on its worker until its arrival only when every carried callback declares ``False`` here; otherwise (the
    #: default) it collects the whole job at its request event and commits its result there, as sequentially.
    learns_from_job_result: bool = True
    #: Whether :meth:`request_step` may ask the server mid-training (FedASMU's fresh-model request): a Ray run then
    #: prepares to merge such jobs' answers (and warns when its engine trains them whole at their request).
    #: ``None`` (the default): whether the class overrides :meth:`request_step`; a callback that overrides it only
    #: to see each dispatch and never asks (FedSA's ``ParticipationLearningRate``) declares ``False``.
    asks_server: bool | None = None
    #: ``True`` when :meth:`on_fresh_model` reads nothing but the module's floating-point weights and buffers and its
    #: BatchNorm counts, ``batch``, the random generators and the step counters (``trainer.trainer``), and changes
    #: nothing but those weights, buffers and counts, the random generators, ``trainer.job_info`` and what
    #: :meth:`merge_result` hands back: a Ray run may then compute a job's merge in the simulation's process, from
    #: the job's state at its request, and send what the merge changed to the worker where the rest of the job
    #: trains (when that worker is busy with another job). ``False`` (the default): a job's merge is computed where
    #: the job is parked. A callback that does not override :meth:`on_fresh_model` needs nothing.
    merges_from_request_state: bool = False
    #: ``True`` when the callback may retire clients for good (e.g. local DP's budget spent): it then keeps
    #: :attr:`retired` (a bool per client, from ``on_fit_start``), the simulator treats a retired client as offline
    #: for good (never dispatched again), and the run ends, with ``stop_reason`` :attr:`retire_reason`, once every
    #: client is retired and no job is left.
    retires_clients: bool = False
    #: Which clients are retired (when :attr:`retires_clients`).
    retired: Any = None
    #: The run's ``stop_reason`` when every client is retired.
    retire_reason: str = "clients_retired"

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint."""
        return type(self).__qualname__

    def check_module(self, module: Any) -> None:
        """Called at fit start with the user's module: raise a ``ValueError`` saying what it must add for this
        callback (e.g. MOON's ``representation(x)``)."""

    def on_fit_start(self, num_clients: int) -> None:
        """Called when a run starts: reset per-run state."""

    def request_step(self, job: ClientJob) -> int | None:
        """At dispatch: after how many local steps (1..``job.num_steps``) the device asks the server for the
        global model current at that virtual moment; ``None`` for no request. Every callback is asked; a job makes
        one request, at the earliest step asked for, and every callback's ``on_fresh_model`` sees it."""
        return None

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        """Called after the start model is loaded, before the first local step."""

    def on_fresh_model(
        self, trainer: FastEngine, job: ClientJob, fresh_weights: Tensor, fresh_version: int, batch: Any
    ) -> None:
        """Called at the requested step when the server had a newer model (version ``fresh_version`` >
        ``job.base_version``); ``batch`` is the mini-batch of the last local step. The module's weights
        (``trainer.flat.flat``) may be modified in place; training then continues from them. What the merge
        teaches state shared across jobs is learned at the job's request event (:meth:`merge_result`,
        :meth:`commit_merge_result`; FedASMU's :class:`~lit_asyncfl.client_callbacks.FreshModelMerge`). A callback
        whose merge reads and changes only the job's state at its request declares
        :attr:`merges_from_request_state` (the Ray executor may then compute it away from the job's worker)."""

    def loss_term(self, trainer: FastEngine, job: ClientJob, batch: Any) -> Tensor | None:
        """Called after ``training_step`` returned the loss of ``batch`` and before ``backward``: a tensor returned
        is added to the loss (e.g. MOON's contrastive term); ``None`` adds nothing. Run by the ``fast`` and
        ``lightning`` engines (the cohort engine refuses callbacks it does not know)."""
        return None

    def on_after_backward(self, trainer: FastEngine, job: ClientJob) -> None:
        """Called after ``loss.backward()`` and before ``optimizer.step()``: gradients can be modified."""

    def on_train_end(self, trainer: FastEngine, job: ClientJob, update: ClientUpdate) -> None:
        """Called with the finished update before it is uploaded. State shared across jobs should learn from a job
        here (not mid-job): a job that raises never gets here, so it leaves no trace."""

    def on_job_dropped(self, job: ClientJob, reason: str) -> None:
        """Called when a job ends without an update (e.g. it raised): forget what was kept for it."""

    def job_state(self, job: ClientJob) -> Any:
        """In the simulation's process, when a job leaves for a worker (:attr:`carries_state`): the part of this
        callback's state the job's training reads (default: each :attr:`client_state_attributes` dict's entry of
        ``job.client``, if any). No later job of the client is shipped before this one is consumed."""
        return {name: _entry(getattr(self, name), job.client) for name in self.client_state_attributes}

    def load_job_state(self, job: ClientJob, state: Any) -> None:
        """On a worker (a copy of this callback), before the job trains: hold exactly ``state``, the value of
        :meth:`job_state` (the copy keeps no other client's state)."""
        for name, entry in state.items():
            setattr(self, name, dict(entry))

    def job_result(self, job: ClientJob) -> Any:
        """On a worker, after the job trained (``on_train_end`` ran): what the job changed, for
        :meth:`commit_job_result` (default: the client's entries, as :meth:`job_state`)."""
        return self.job_state(job)

    def commit_job_result(self, job: ClientJob, result: Any) -> None:
        """In the simulation's process, when the job's update is consumed: apply :meth:`job_result`'s value, as
        ``on_train_end`` would have here (a job that raised or was cancelled commits nothing)."""
        for name, entry in result.items():
            values = getattr(self, name)
            values.pop(job.client, None)
            values.update(entry)

    def merge_result(self, job: ClientJob) -> Any:
        """Right after every callback's ``on_fresh_model`` returned (or at the job's request when the server had
        nothing newer), on a worker's copy or, under the sequential executor, here: what the merge taught the state
        shared across jobs, for :meth:`commit_merge_result` at the job's request event (the rest of the job trains
        meanwhile; default: nothing). ``on_fresh_model`` keeps it and learns nothing itself, so that a job whose
        merge a later callback fails teaches nothing under every executor."""
        return None

    def commit_merge_result(self, job: ClientJob, result: Any) -> None:
        """In the simulation's process, at the job's request event (every executor): apply :meth:`merge_result`'s
        value. It stays even when the rest of the job raises (the job then fails at
        its arrival event)."""

    def personal_weights(self, client: int) -> Tensor | None:
        """The flat weights of ``client``'s own (personal) model, when the callback keeps one (Ditto's
        :math:`v_k`, :class:`~lit_asyncfl.client_callbacks.PersonalModel`); ``None`` otherwise, or for a client
        that has not trained yet. :class:`~lit_asyncfl.callbacks.PerClientEvaluation` evaluates each client with
        these weights (the global model where ``None``) under the ``personal_`` keys."""
        return None

    def metrics(self) -> dict[str, Any]:
        """Values this callback adds to every evaluation row (hence the loggers) and to the run summary, e.g. the
        privacy spent by local DP; keys must not clash with the row's own."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""


class ProximalTerm(ClientCallback):
    r"""FedProx's proximal term :math:`\frac{\mu}{2} \lVert w - w_g \rVert^2` added to the local objective.

    Implemented on the gradient (``grad += mu * (w - w_g)``), which is exactly the gradient of the term and costs
    one fused operation per step.

    Args:
        mu: Proximal coefficient :math:`\mu \ge 0`.

    Example:
        >>> ProximalTerm(mu=0.01).mu
        0.01
    """

    runs_on_workers = True  # the anchor is the job's own start model

    def __init__(self, mu: float = MU) -> None:
        check_number("FedProx mu", mu, 0)
        self.mu = mu
        self._anchors: list[Tensor] = []

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        self._anchors = trainer.flat.param_views(start_weights)

    def on_after_backward(self, trainer: FastEngine, job: ClientJob) -> None:
        if self.mu == 0:
            return
        pairs = [(p, a) for p, a in zip(trainer.flat.params, self._anchors) if p.grad is not None]
        if pairs:
            params, anchors = zip(*pairs)
            grads = [p.grad for p in params]
            torch._foreach_add_(grads, torch._foreach_sub(params, anchors), alpha=self.mu)


class LearningRateDecay(ClientCallback):
    r"""Decay the clients' learning rate with the global version the job starts from: :math:`\eta_t = \eta \gamma^t`.

    FedADT: :math:`\eta = 0.01`, :math:`\gamma = 0.9999` per global update. Multiplies every parameter group's
    ``lr`` of the optimizer that ``configure_optimizers`` returned for the job (and the recorded ``lr``).

    Args:
        decay: Factor :math:`\gamma \in (0, 1]` per global version.

    Example:
        >>> LearningRateDecay(0.9999).factor(10_000)  # doctest: +ELLIPSIS
        0.3678...
    """

    runs_on_workers = True  # the factor depends on the job's base version alone

    def __init__(self, decay: float = LR_DECAY) -> None:
        check_fraction("decay", decay, open_min=True)
        self.decay = decay

    def factor(self, version: int) -> float:
        """The multiplier at global version ``version``."""
        return self.decay**version

    def on_train_start(self, trainer: FastEngine, job: ClientJob, start_weights: Tensor) -> None:
        factor = self.factor(job.base_version)
        for group in trainer.optimizer.param_groups:
            group["lr"] *= factor
        trainer.job_info["lr"] = float(trainer.optimizer.param_groups[0]["lr"])


def _entry(values: dict[int, Any], client: int) -> dict[int, Any]:
    """``{client: values[client]}``, or ``{}`` when the client has no entry."""
    return {client: values[client]} if client in values else {}
