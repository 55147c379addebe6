"""``PerClientEvaluation``: the global model (and optionally each client's fine-tuned copy) evaluated on every
client's own held-out samples, with the statistics over clients in the history, the summary, the loggers and a
plot."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lit_asyncfl.callbacks.base import Callback
from lit_asyncfl.callbacks.logger_connector import LoggerConnector
from lit_asyncfl.checks import check, check_int, check_number
from lit_asyncfl.client_callbacks.base import ClientCallback
from lit_asyncfl.engines import LightningLocalTrainer, LocalTrainer
from lit_asyncfl.engines.base import choose_onednn
from lit_asyncfl.namespaces import is_overridden
from lit_asyncfl.per_client import SUMMARY_STATISTICS, ClientEvaluator, client_statistics, hold_out, with_indices
from lit_asyncfl.reporting import plot_clients, write_clients_csv

if TYPE_CHECKING:
    from lit_asyncfl.data.shards import ClientShards, DatasetShards
    from lit_asyncfl.trainer import FederatedTrainer

log = logging.getLogger("lit_asyncfl")

#: Samples per batch of the per-client evaluation when the data module names no ``eval_batch_size``.
DEFAULT_BATCH_SIZE = 1024


class PerClientEvaluation(Callback):
    r"""Evaluates the global model on every client's own held-out samples, every ``every`` evaluations and at the
    end of the run; with ``personalize_steps=k``, also each client's model after ``k`` local fine-tuning steps from
    the global model (personalized accuracy).

    **Held-out data.** At fit start each client's shard is split (:func:`~lit_asyncfl.per_client.hold_out`): a
    fraction ``holdout`` of its samples (at least one, at most all but one), drawn with the run seed, is removed from
    its training data for the whole run and used only to evaluate it. Every client is evaluated, those that never
    trained included (``max_clients`` evaluates a fixed random subset instead). The split is part of the run's
    configuration: a checkpoint resumes only with the same ``holdout``.

    **What is recorded** (the monitored metric :math:`a_i` of client :math:`i`, e.g. ``val_acc``; formulas in
    :func:`~lit_asyncfl.per_client.client_statistics`): in each evaluated history row (and so in ``history.csv``
    and the loggers) ``client_acc_mean``, ``client_acc_weighted``, ``client_acc_std``, ``client_acc_worst10``,
    ``client_acc_best10``, the percentiles ``client_acc_p10``/``p25``/``p50``/``p75``/``p90``,
    ``client_reaching_target`` (clients at or past ``target_accuracy``), ``clients_evaluated`` and
    ``client_loss_mean`` (when the module logs a loss); with personalization the same under ``personalized_``; with
    an algorithm whose client callbacks keep a personal model per client
    (:meth:`~lit_asyncfl.client_callbacks.ClientCallback.personal_weights`, e.g. Ditto's), each client's personal
    model (the global model for a client that has not trained) under ``personal_``. The
    summary holds the last evaluation's mean, weighted mean, standard deviation, worst and best 10% and clients
    reaching the target; ``clients.png`` in the log dir plots the distribution over clients against virtual time
    (percentile bands, mean, worst 10%, the global metric), ``clients.csv`` every client's last values.

    **What it needs.** The module's ``validation_step`` (the metrics it logs are the ones evaluated per client), a
    validation loader (the global evaluation resolves the monitored metric) and a monitored metric (one logged
    ending in ``acc``/``accuracy``/``r2``, or ``FederatedTrainer(monitor=...)``); a run without any of them is
    refused at fit start.

    **Cost.** When the module's validation metrics decompose per sample (a ``per_sample_metrics`` method, which
    every :class:`~lit_asyncfl.models.ClassificationModule` has), all clients' held-out
    samples are evaluated together in batches of ``batch_size`` (a few forward passes over ``holdout`` of the
    training set, whatever the number of clients); otherwise (checked once, on one client, against
    ``validation_step``) each client runs its own evaluation loop, which a message says. Personalization trains
    ``k`` steps per evaluated client per evaluation: bound it with ``max_clients``.

    Args:
        every: Evaluate per client every this many global evaluations (the first row, version 0, included), and
            always at the end of the run.
        holdout: Fraction :math:`f \in (0, 1)` of each client's samples held out of its training.
        personalize_steps: ``k > 0``: also evaluate each client after ``k`` fine-tuning steps of the module's own
            ``training_step`` and optimizer on its training batches (drawn as a job draws them, from a seed of the
            run seed, the version and the client; the algorithm's client callbacks do not apply); ``0``: off.
        max_clients: Evaluate a fixed random subset of this many clients (drawn once from the run seed) instead of
            all; ``None``: all.
        batch_size: Samples per evaluation batch; ``None``: the data module's ``eval_batch_size`` (else 1024).

    Example:
        >>> from lit_asyncfl import FederatedTrainer
        >>> from lit_asyncfl.data import DigitsDataModule
        >>> from lit_asyncfl.models import LogisticRegression
        >>> import tempfile
        >>> trainer = FederatedTrainer("fedasync", num_clients=10, max_versions=4, eval_every=2, logger=False,
        ...                            callbacks=[PerClientEvaluation(holdout=0.2)], print_summary=False,
        ...                            default_root_dir=tempfile.mkdtemp(), enable_progress_bar=False)
        >>> trainer.fit(LogisticRegression(input_dim=64), datamodule=DigitsDataModule())
        >>> trainer.summary["clients_evaluated"], 0 <= trainer.summary["client_acc_worst10"] <= 1
        (10, True)
    """

    def __init__(
        self,
        every: int = 1,
        holdout: float = 0.2,
        personalize_steps: int = 0,
        max_clients: int | None = None,
        batch_size: int | None = None,
    ) -> None:
        check_int("every", every, 1)
        check_number("holdout", holdout, 0, 1, open_min=True, open_max=True)
        check_int("personalize_steps", personalize_steps, 0)
        check_int("max_clients", max_clients, 1, optional=True)
        check_int("batch_size", batch_size, 1, optional=True)
        self.every = every
        self.holdout = holdout
        self.personalize_steps = personalize_steps
        self.max_clients = max_clients
        self.batch_size = batch_size
        self.clients: np.ndarray = np.zeros(0, dtype=np.int64)
        self.held_out: list[np.ndarray] = []
        self._evaluator: ClientEvaluator | None = None
        self._engine: Any = None
        self._shards: Any = None
        self._checked = False
        self._last: dict[str, np.ndarray] = {}
        self._personal: list[ClientCallback] = []

    @property
    def state_key(self) -> str:
        return self._generate_state_key(holdout=self.holdout)

    # -- the data -----------------------------------------------------------------------------------------------
    def setup_client_data(
        self, trainer: FederatedTrainer, shards: ClientShards | DatasetShards
    ) -> ClientShards | DatasetShards:
        """Hold each client's evaluation samples out of its training shard (see the class)."""
        check(
            sum(isinstance(cb, PerClientEvaluation) for cb in trainer.callbacks) == 1,
            "a trainer takes one PerClientEvaluation: each holds samples out of the clients' training data",
        )
        train, self.held_out = hold_out(shards.indices_numpy(), self.holdout, trainer.seed)
        num_clients = shards.num_clients
        check(
            self.max_clients is None or self.max_clients <= num_clients,
            f"max_clients={self.max_clients} is more than the run's {num_clients} clients; use None to evaluate all",
        )
        if self.max_clients is None:
            self.clients = np.arange(num_clients)
        else:
            rng = np.random.default_rng([trainer.seed, 0xC11E5])
            self.clients = np.sort(rng.choice(num_clients, self.max_clients, replace=False))
        self._shards = with_indices(shards, train)
        self._evaluator, self._engine, self._checked, self._last = None, None, False, {}
        return self._shards

    def data_fingerprint(self) -> dict[str, Any]:
        """The split is part of the data the run trains on: a checkpoint resumes only with the same ``holdout``,
        and never without it (``data.client_holdout`` in the resume fingerprint; the data module is not
        touched)."""
        return {"client_holdout": self.holdout}

    def on_fit_start(self, trainer: FederatedTrainer) -> None:
        dm = trainer.datamodule
        check(
            self._shards is not None,
            "PerClientEvaluation was not given the clients' data at fit start (the trainer calls "
            "setup_client_data before any client trains)",
        )
        assert trainer.global_model is not None
        module = type(trainer.global_model).__name__
        check(
            is_overridden("validation_step", trainer.global_model),
            f"PerClientEvaluation scores each client with the module's validation_step, but {module} has none: "
            f"define {module}.validation_step logging an accuracy-like metric (e.g. self.log('val_acc', ...)), or "
            "drop PerClientEvaluation",
        )
        check(
            bool(trainer.evaluation.batches),
            "PerClientEvaluation reports the metric the global evaluation monitors, but the run has no validation "
            "loader (the global model is never evaluated): pass val_dataloaders (or a data module with a "
            "val_dataloader), or drop PerClientEvaluation",
        )
        batch_size = self.batch_size or getattr(dm, "eval_batch_size", None) or DEFAULT_BATCH_SIZE
        prepare = getattr(dm, "prepare_inputs", lambda inputs: inputs)
        self._personal = [
            cb
            for cb in trainer.algorithm.client_callbacks
            if type(cb).personal_weights is not ClientCallback.personal_weights
        ]
        self._evaluator = ClientEvaluator(
            trainer.global_model, self._shards, self.held_out, prepare, batch_size, trainer.device
        )
        if self.personalize_steps:
            engine = LightningLocalTrainer if trainer.engine == "lightning" else LocalTrainer
            batch_size = trainer.datamodule.batch_size
            probe = next(iter(self._shards.batches(int(self.clients[0]), batch_size, torch.Generator())))
            onednn = choose_onednn(trainer.onednn, trainer.global_model, probe, trainer.device)  # the run's choice
            self._engine = engine(trainer.global_model, self._shards, batch_size, (), trainer.device, onednn=onednn)

    # -- evaluation ---------------------------------------------------------------------------------------------
    def on_evaluation_end(self, trainer: FederatedTrainer, metrics: dict[str, Any]) -> None:
        if trainer.final_evaluation or (len(trainer.history) - 1) % self.every == 0:
            metrics.update(self._evaluate(trainer))

    def _evaluate(self, trainer: FederatedTrainer) -> dict[str, Any]:
        sim, evaluator = trainer.simulator, self._evaluator
        assert sim is not None and evaluator is not None
        monitor = trainer.evaluation.monitor_name
        check(  # the first evaluation (version 0, at fit start) resolves the monitor
            monitor is not None,
            "PerClientEvaluation needs a monitored metric, but the module's validation_step logs none ending in acc, "
            "accuracy or r2: log an accuracy-like metric (e.g. self.log('val_acc', ...)) or name one with "
            "FederatedTrainer(monitor=..., mode=...)",
        )
        assert monitor is not None
        weights = sim.server.weights
        if not self._checked:
            self._checked = True
            evaluator.workspace.flat.load(weights)
            if not evaluator.check_decomposes(int(self.clients[0]), monitor):
                log.info(
                    "lit_asyncfl: per-client evaluation runs one evaluation loop per client: the module's validation "
                    "metrics do not decompose per sample (give it a per_sample_metrics(batch, prefix) method to "
                    "evaluate all clients in large batches)"
                )
        values = evaluator.evaluate(weights, self.clients)
        row = self._statistics(trainer, values, monitor, "client")
        self._last = {f"client_{k}": v for k, v in values.items()}
        if self._personal:
            personal = evaluator.evaluate_each(lambda client: self._personal_weights(client, weights), self.clients)
            row.update(self._statistics(trainer, personal, monitor, "personal"))
            self._last.update({f"personal_{k}": v for k, v in personal.items()})
        if self.personalize_steps:
            tuned = evaluator.personalized(
                self._engine, weights, self.clients, self.personalize_steps, trainer.seed, sim.server.version, sim.now
            )
            row.update(self._statistics(trainer, tuned, monitor, "personalized"))
            self._last.update({f"personalized_{k}": v for k, v in tuned.items()})
        return row

    def _personal_weights(self, client: int, global_weights: torch.Tensor) -> torch.Tensor:
        """The client's personal model (the first client callback that has one), else the global model."""
        for cb in self._personal:
            own = cb.personal_weights(client)
            if own is not None:
                return own.to(global_weights.device)
        return global_weights

    def _statistics(
        self, trainer: FederatedTrainer, values: dict[str, np.ndarray], monitor: str, prefix: str
    ) -> dict[str, Any]:
        if monitor not in values:
            warnings.warn(
                f"per-client evaluation: the monitored metric {monitor!r} is not among the per-client metrics "
                f"{sorted(values)}",
                UserWarning,
                stacklevel=3,
            )
            return {}
        assert self._evaluator is not None
        sizes = self._evaluator.sizes[self.clients]
        row: dict[str, Any] = client_statistics(
            values[monitor], sizes, trainer.target_accuracy, trainer.evaluation.mode, prefix
        )
        loss = next((k for k in values if k.endswith("loss")), None)
        if loss is not None:
            row[f"{prefix}_loss_mean"] = float(np.mean(values[loss]))
        return row

    # -- the end ------------------------------------------------------------------------------------------------
    def on_fit_end(self, trainer: FederatedTrainer) -> None:
        self._finish(trainer)

    def on_exception(self, trainer: FederatedTrainer, exception: BaseException) -> None:
        if trainer.summary and trainer.history and self._evaluator is not None:
            try:
                self._finish(trainer, evaluate=False)
            except Exception as error:  # never hide the exception that ended the run
                log.warning("lit_asyncfl: could not write the per-client outputs of the failed run: %r", error)

    def _finish(self, trainer: FederatedTrainer, evaluate: bool = True) -> None:
        history = trainer.history
        if not history:
            return
        last = history[-1]
        if evaluate and "clients_evaluated" not in last and self._evaluator is not None:
            extra = self._evaluate(trainer)  # the final model, when its evaluation was not a per-client one
            last.update(extra)
            point = {"version": last["version"], "virtual_time": last["virtual_time"], **extra}
            for cb in trainer.callbacks:  # the loggers get the added values at that row's step
                if isinstance(cb, LoggerConnector) and extra:
                    cb.on_evaluation_end(trainer, point)
        evaluated = [r for r in history if "clients_evaluated" in r]
        if not evaluated:
            return
        final = evaluated[-1]
        for prefix in ("client", "personal", "personalized"):
            keys = [f"{prefix}_acc_{s}" for s in SUMMARY_STATISTICS] + [f"{prefix}_reaching_target"]
            trainer.summary.update({k: final[k] for k in keys if k in final})
        trainer.summary["clients_evaluated"] = final["clients_evaluated"]
        out = Path(trainer.log_dir)
        out.mkdir(parents=True, exist_ok=True)
        metric = trainer.summary.get("monitor") or "accuracy"
        plot_clients(history, out / "clients.png", trainer.algorithm.name, trainer.target_accuracy, metric)
        if self._last and self._evaluator is not None:
            write_clients_csv(self.clients, self._evaluator.sizes[self.clients], self._last, out / "clients.csv")

    def state_dict(self) -> dict[str, Any]:
        return {"holdout": self.holdout}
