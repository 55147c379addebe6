"""A ``FederatedTrainer``'s run to and from a checkpoint: what a resumable ``last.ckpt`` holds besides the global
model (the simulation, the history, the run callbacks' states), and restoring it (the format is
:mod:`lit_asyncfl.checkpoint`)."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

from lit_asyncfl import checkpoint as ckpt
from lit_asyncfl.checks import check
from lit_asyncfl.core.client_state import relative_manifest, resolved_manifest

if TYPE_CHECKING:
    from lit_asyncfl.trainer import FederatedTrainer


def resumable_history_and_callbacks(trainer: FederatedTrainer) -> dict[str, Any]:
    """The history and callback states to checkpoint (copied: callbacks may keep mutating theirs); at the end of
    a run, those kept before its final off-schedule evaluation."""
    if trainer._final_state is not None:
        return trainer._final_state
    states = {cb.state_key: copy.deepcopy(cb.state_dict()) for cb in trainer.callbacks}
    return {"history": [dict(row) for row in trainer.history], "callbacks": states}


def save_run_checkpoint(trainer: FederatedTrainer, path: str | os.PathLike, weights_only: bool) -> None:
    """Write ``trainer``'s checkpoint (see :meth:`~lit_asyncfl.trainer.FederatedTrainer.save_checkpoint`)."""
    sim, model, flat = trainer.simulator, trainer.global_model, trainer._flat
    if sim is None or model is None or flat is None:
        raise RuntimeError("nothing to checkpoint: call fit() first")
    if not weights_only and sim.in_event:
        raise RuntimeError(
            "a resumable checkpoint can only be written between events (on_event_end, on_fit_end); pass "
            "weights_only=True to save the global model alone"
        )
    flat.load(sim.server.weights)
    run: dict[str, Any] = {"version": sim.server.version, "virtual_time": sim.now}
    if not weights_only:
        simulation = sim.state_dict()
        if "client_state" in simulation:  # its files named relative to the checkpoint: the run dir may move
            base = os.path.dirname(os.path.abspath(path))
            simulation["client_state"] = relative_manifest(simulation["client_state"], base)
        run.update(
            fingerprint=trainer._fingerprint,
            monitor=trainer.evaluation.monitor_name,
            simulation=simulation,
            **resumable_history_and_callbacks(trainer),
            wall_seconds=trainer._wall_seconds(),
        )
    checkpoint = ckpt.model_checkpoint(model, trainer._user_datamodule, sim.server.version, run)
    trainer._hooks.call("on_save_checkpoint", checkpoint)  # as Lightning: the callbacks', then the module's
    model.on_save_checkpoint(checkpoint)
    ckpt.save(checkpoint, path)


def restore_run(trainer: FederatedTrainer, checkpoint: dict[str, Any], path: str) -> None:
    """Put ``trainer``'s freshly wired run in the state ``checkpoint`` (read from ``path``) was written in."""
    assert trainer.simulator is not None and trainer.global_model is not None and trainer._flat is not None
    run = ckpt.run_entries(checkpoint, path, trainer._fingerprint, trainer._flat.flat)
    dropped = int(run["simulation"].get("dropped", {}).get("client_error", 0))
    check(
        trainer.on_client_error == "drop" or dropped == 0,
        f"checkpoint {path} was written with on_client_error='drop' after {dropped} failing job(s) were dropped: "
        "a run with on_client_error='raise' would have stopped at the first; resume with on_client_error='drop'",
    )
    simulation = run["simulation"]
    if "client_state" in simulation:
        base = os.path.dirname(os.path.abspath(path))
        simulation = {**simulation, "client_state": resolved_manifest(simulation["client_state"], base)}
    trainer.simulator.load_state_dict(simulation)
    ckpt.restore_lightning_state(trainer.global_model, trainer._user_datamodule, checkpoint)
    trainer.evaluation.restore(run["history"], run["monitor"])
    trainer._wall_offset = float(run["wall_seconds"])
    states = run["callbacks"]
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    trainer._hooks.call("on_load_checkpoint", checkpoint)
