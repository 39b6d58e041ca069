"""The private names of Ray, MLflow and torch that the code still uses live in one shim per
library; each name is checked here against the installed version, so that an upgrade that moves
one fails this test by name. Everywhere else, only public APIs (checked from the source)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "iaa"
LIBRARIES = ("ray", "mlflow", "torch", "optuna")
SHIMS = {"ray": "iaa.platform.cluster.ray_internals", "mlflow": "iaa.platform.tracking.mlflow_internals",
         "torch": "iaa.jobs.training.torch_internals"}


@pytest.mark.parametrize("library", sorted(SHIMS))
def test_every_private_name_of_a_shim_exists_in_the_installed_library(library: str) -> None:
    pytest.importorskip(library)
    for module, attribute in importlib.import_module(SHIMS[library]).NAMES:
        assert hasattr(importlib.import_module(module), attribute), f"{module}.{attribute} is gone: update the shim"


def _private_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                   else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        for module in modules:
            parts = module.split(".")
            names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if parts[0] in LIBRARIES and any(p.startswith("_") for p in parts[1:] + names):
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {module}")
    return found


def test_no_private_import_of_the_libraries_outside_the_shims() -> None:
    shims = {f"{name.replace('.', '/')}.py" for name in SHIMS.values()}
    found = [hit for path in sorted(ROOT.rglob("*.py")) if str(path.relative_to(ROOT.parent)) not in shims
             for hit in _private_imports(path)]
    assert found == []
