"""Schedulers use the simulator only through :class:`~lit_asyncfl.schedulers.view.SchedulerView`: checked statically
over the scheduler sources and by running every preset's scheduler against a proxy that exposes only the view."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from conftest import run

import lit_asyncfl.schedulers as schedulers
from lit_asyncfl.algorithms import PRESETS
from lit_asyncfl.core.simulator import Simulator
from lit_asyncfl.mobility import MobileEdgeDevices
from lit_asyncfl.schedulers import SCHEDULER_VIEW, KeepConcurrency, SchedulerView

SOURCES = sorted(Path(schedulers.__file__).parent.glob("*.py"))
HOOKS = ("on_fit_start", "on_arrival", "on_update", "on_drop", "on_online", "on_event")


def _reaches(source: str) -> list[str]:
    """``name: what`` for each use of a ``sim`` parameter outside the view: a member not in it, or ``sim`` handed to
    anything but the scheduler's own methods (where it could be used unchecked)."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "sim" and isinstance(node.ctx, ast.Load)):
            continue
        parent = parents[node]
        if isinstance(parent, ast.Attribute):
            if parent.attr not in SCHEDULER_VIEW:
                bad.append(f"line {node.lineno}: sim.{parent.attr}")
        elif isinstance(parent, ast.Call) and node in parent.args:
            func = parent.func
            own = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
            if not own:
                bad.append(f"line {node.lineno}: sim passed to {ast.unparse(func)}")
        else:
            bad.append(f"line {node.lineno}: {ast.unparse(parent)}")
    return bad


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_a_scheduler_source_uses_only_the_view(path):
    assert _reaches(path.read_text()) == []


def test_the_static_check_sees_a_reach_outside_the_view():
    source = "def on_update(self, sim, job, aggregated):\n    sim.queue.push(0.0, 'x')\n    helper(sim)\n"
    assert sorted(_reaches(source)) == ["line 2: sim.queue", "line 3: sim passed to helper"]


def test_the_simulator_has_every_member_of_the_view():
    members = {name for name, _ in inspect.getmembers(Simulator)}
    init = "".join(inspect.getsource(cls.__init__) for cls in Simulator.__mro__[:-1] if "__init__" in vars(cls))
    missing = [name for name in SCHEDULER_VIEW if name not in members and not re.search(rf"self\.{name}\b[^=]*=", init)]
    assert missing == []


class _ViewOnly:
    """The simulator with only the view's members (read-only)."""

    def __init__(self, sim: Simulator) -> None:
        object.__setattr__(self, "_sim", sim)

    def __getattr__(self, name: str):
        if name not in SCHEDULER_VIEW:
            raise AttributeError(f"a scheduler reached Simulator.{name}, outside SchedulerView")
        return getattr(self._sim, name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a scheduler assigned Simulator.{name}")


def _view_only(scheduler) -> None:
    """Hand the scheduler's hooks a :class:`_ViewOnly` instead of the simulator."""
    for hook in HOOKS:
        method = getattr(scheduler, hook)

        def wrapped(sim, *args, _method=method, **kwargs):
            return _method(sim if isinstance(sim, _ViewOnly) else _ViewOnly(sim), *args, **kwargs)

        setattr(scheduler, hook, wrapped)


def _one_preset_per_scheduler() -> dict[str, str]:
    chosen: dict[type, str] = {}
    for name, cls in PRESETS.items():
        chosen.setdefault(type(cls().scheduler), name)
    return {scheduler.__name__: name for scheduler, name in chosen.items()}


@pytest.mark.parametrize("scheduler, preset", sorted(_one_preset_per_scheduler().items()))
def test_every_scheduler_runs_on_the_view_alone(tmp_path, scheduler, preset):
    algorithm = PRESETS[preset]()
    _view_only(algorithm.scheduler)
    kwargs = {"device_model": MobileEdgeDevices()} if scheduler == "SemiAsyncRounds" else {}
    trainer = run(tmp_path, algorithm, seed=3, max_versions=3, num_clients=60, **kwargs)
    assert trainer.simulator.server.version == 3
    assert isinstance(trainer.simulator, SchedulerView)


def test_the_proxy_refuses_a_member_outside_the_view(tmp_path):
    class Peeking(KeepConcurrency):
        def on_update(self, sim, job, aggregated):
            sim.queue  # noqa: B018  (the event queue is the simulator's own)

    algorithm = PRESETS["fedasync"]()
    algorithm.scheduler = Peeking(concurrency=2)
    _view_only(algorithm.scheduler)
    with pytest.raises(AttributeError, match=r"Simulator\.queue, outside SchedulerView"):
        run(tmp_path, algorithm, seed=3, max_versions=3)
