"""The public API from the outside: what each package's ``__all__`` promises exists and star-imports, every package
with public classes is reached by the API reference, and the exceptions to the layout rule (tests/test_layout.py:
every public class exported by its package and documented once) still name something."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest
from builders import ROOT
from test_layout import UNDOCUMENTED, UNEXPORTED_PACKAGES

import lit_asyncfl


def _packages() -> dict[str, object]:
    names = ["lit_asyncfl"] + [i.name for i in pkgutil.walk_packages(lit_asyncfl.__path__, "lit_asyncfl.") if i.ispkg]
    return {name: importlib.import_module(name) for name in names}


def _reference() -> list[str]:
    """The modules and classes docs/api.md documents (``automodule`` and ``autoclass`` targets)."""
    return re.findall(r"^\.\. auto(?:module|class):: (\S+)", (ROOT / "docs" / "api.md").read_text(), re.M)


def _export_problems(packages: dict[str, object]) -> list[str]:
    problems = []
    for name, package in packages.items():
        exported = getattr(package, "__all__", None)
        if exported is None:
            if name not in UNEXPORTED_PACKAGES:
                problems.append(f"{name} has no __all__")
            continue
        problems += [
            f"{name}.__all__ names {n!r}, which {name} does not define" for n in exported if n not in vars(package)
        ]
        problems += [f"{name}.__all__ names {n!r} twice" for n in sorted(set(exported)) if exported.count(n) > 1]
    return problems


def test_every_name_a_package_exports_exists_once_and_star_imports():
    packages = _packages()
    assert not _export_problems(packages)
    for name in packages:
        if hasattr(packages[name], "__all__"):
            namespace: dict = {}
            exec(f"from {name} import *", namespace)  # what a user's star import gets
            assert set(packages[name].__all__) <= namespace.keys(), name


def test_the_export_check_sees_a_stale_name(monkeypatch):
    packages = _packages()
    monkeypatch.setattr(packages["lit_asyncfl.server"], "__all__", [*packages["lit_asyncfl.server"].__all__, "Gone"])
    assert _export_problems(packages) == [
        "lit_asyncfl.server.__all__ names 'Gone', which lit_asyncfl.server does not define"
    ]


def _unreached(reference: set[str]) -> list[str]:
    """Exported classes of packages that ``reference`` reaches neither directly (an ``automodule`` of their own)
    nor through a documented package that re-exports them (as ``lit_asyncfl.executors`` does
    ``lit_asyncfl.executors.ray``'s); test_layout.py checks the classes one by one."""
    packages = _packages()
    documented = {id(getattr(packages[r], n)) for r in reference if r in packages for n in packages[r].__all__}
    unreached = []
    for name, package in packages.items():
        if name in reference or name in UNEXPORTED_PACKAGES or name == "lit_asyncfl":
            continue
        classes = [getattr(package, n) for n in package.__all__ if inspect.isclass(getattr(package, n))]
        unreached += [f"{name}.{cls.__name__}" for cls in classes if id(cls) not in documented]
    return unreached


def test_every_package_with_public_classes_is_reached_by_the_api_reference():
    unreached = _unreached(set(_reference()))
    assert not unreached, f"exported by a package the API reference does not document: {unreached}"


def test_the_reach_check_sees_a_package_left_out():
    assert "lit_asyncfl.executors.ray.RayExecutor" in _unreached(set(_reference()) - {"lit_asyncfl.executors"})


@pytest.mark.parametrize("path", sorted(UNDOCUMENTED))
def test_each_class_left_out_of_the_reference_still_exists_and_is_still_left_out(path):
    module, _, attr = path.rpartition(".")
    assert inspect.isclass(getattr(importlib.import_module(module), attr, None)), f"{path} is gone: drop its exception"
    assert path not in _reference(), f"{path} is documented now: drop its exception"


@pytest.mark.parametrize("name", sorted(UNEXPORTED_PACKAGES))
def test_each_package_left_out_of_the_rule_still_exists(name):
    assert name in _packages(), f"{name} is gone: drop its exception"
