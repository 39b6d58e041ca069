"""The layers' dependencies point one way (read from the source, every import, deferred ones too).

- ``ray``, ``mlflow`` and ``optuna`` are imported only in ``iaa/platform``, the adapters;
- ``iaa.jobs`` never imports ``iaa.platform`` (jobs are written against ``iaa.jobs.ports``);
- ``iaa.platform`` imports from ``iaa.jobs`` only the ports, configs and paths: the job code an
  adapter runs reaches it as a callable the job passes in;
- ``iaa.model`` imports no other ``iaa`` layer, ``iaa.data`` neither jobs nor platform;
- ``iaa.model.kernels`` (the fast paths) imports only torch, the standard library and its own
  modules, and the rest of ``iaa.model`` reaches the kernels only through the package
  (``iaa.model.kernels.select``), never a kernel module;
- no two modules of ``iaa`` import each other, directly or around a longer cycle.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "iaa"
INFRASTRUCTURE = ("ray", "mlflow", "optuna")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth of the file; ``from a import b`` counts as ``a.b`` when
    that is a module of ``iaa``, else as ``a``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if f"{node.module}.{alias.name}" in MODULES)
    return found


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}
GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_infrastructure_is_imported_only_by_the_platform() -> None:
    outside = {name: sorted(m for m in deps if m.split(".")[0] in INFRASTRUCTURE)
               for name, deps in GRAPH.items() if not name.startswith("iaa.platform")}
    assert {name: deps for name, deps in outside.items() if deps} == {}


@pytest.mark.parametrize("layer, forbidden", [
    ("iaa.jobs", ("iaa.platform", "iaa.cli")),
    ("iaa.data", ("iaa.jobs", "iaa.platform", "iaa.cli", "iaa.model")),
    ("iaa.model", ("iaa.data", "iaa.jobs", "iaa.platform", "iaa.cli")),
    ("iaa.platform", ("iaa.cli",)),
])
def test_layers_import_only_downward(layer: str, forbidden: tuple[str, ...]) -> None:
    upward = {name: sorted(m for m in deps if m.startswith(forbidden))
              for name, deps in GRAPH.items() if name.startswith(layer)}
    assert {name: deps for name, deps in upward.items() if deps} == {}


KERNELS = "iaa.model.kernels"


def test_kernels_import_only_torch_the_standard_library_and_each_other() -> None:
    outside = {name: sorted(m for m in deps if not (m.split(".")[0] in ("torch", "__future__")
                                                    or m.split(".")[0] in sys.stdlib_module_names
                                                    or m == KERNELS or m.startswith(KERNELS + ".")))
               for name, deps in GRAPH.items() if name == KERNELS or name.startswith(KERNELS + ".")}
    assert {name: deps for name, deps in outside.items() if deps} == {}


def test_the_model_reaches_the_kernels_only_through_select() -> None:
    """Outside ``kernels/``, the model imports the kernels package (its ``select`` and
    ``Kernels``), never one kernel's module: which fast path runs is chosen in one place."""
    reader_side = {name: sorted(m for m in deps if m.startswith(KERNELS + "."))
                   for name, deps in GRAPH.items()
                   if name.startswith("iaa.model") and not (name == KERNELS or name.startswith(KERNELS + "."))}
    assert {name: deps for name, deps in reader_side.items() if deps} == {}
    assert KERNELS in GRAPH["iaa.model.reader"]


# What an adapter may import from the jobs: the ports, the configs (and presets and search spaces,
# plain data) and the work folder's paths.
PLATFORM_MAY_IMPORT = {"iaa.jobs", "iaa.jobs.ports", "iaa.jobs.training.config", "iaa.jobs.training.presets",
                       "iaa.jobs.workdir", "iaa.jobs.workdir.paths", "iaa.jobs.search", "iaa.jobs.search.search_space",
                       "iaa.jobs.training",
                       "iaa.jobs.search.exploration"}   # pure: what a sweep's trials cannot tell (the study's notes)


def test_the_platform_imports_from_the_jobs_only_ports_and_configs() -> None:
    workflows = {name: sorted(m for m in deps if m.startswith("iaa.jobs") and m not in PLATFORM_MAY_IMPORT)
                 for name, deps in GRAPH.items() if name.startswith("iaa.platform")}
    assert {name: deps for name, deps in workflows.items() if deps} == {}


def test_no_import_cycle() -> None:
    internal = {name: {m for m in deps if m in MODULES and m != name} for name, deps in GRAPH.items()}
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(internal[name]):
            if dep.startswith(name + ".") or name.startswith(dep + "."):
                continue                # a package and its own modules
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in sorted(internal):
        if name not in state:
            visit(name, [name])
    assert cycles == []
