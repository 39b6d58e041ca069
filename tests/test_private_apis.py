"""The private names of Ray, MLflow and torch that the code still uses live in shim modules (one
per library and layer); each name is checked here against the installed version, so that an
upgrade that moves one fails this test by name. Everywhere else, only public APIs, checked from
the source: imports, attribute access (``torch._foreach_norm``, a tensor's ``._version``) and
strings that name a private module (a logger such as ``"ray._private.services"``)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "iaa"
LIBRARIES = ("ray", "mlflow", "torch", "optuna")
SHIMS = {"ray": ("iaa.platform.cluster.ray_internals",), "mlflow": ("iaa.platform.tracking.mlflow_internals",),
         "torch": ("iaa.jobs.training.torch_internals", "iaa.model.kernels.kernel_internals")}
PRIVATE_MODULE = re.compile(rf"^(?:{'|'.join(LIBRARIES)})(?:\.\w+)*\._\w+")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


@pytest.mark.parametrize("shim", sorted(s for shims in SHIMS.values() for s in shims))
def test_every_private_name_of_a_shim_exists_in_the_installed_library(shim: str) -> None:
    library = next(lib for lib, shims in SHIMS.items() if shim in shims)
    pytest.importorskip(library)
    module = importlib.import_module(shim)
    for name, attributes in module.NAMES:
        found = importlib.import_module(name)
        for attribute in attributes.split("."):
            assert hasattr(found, attribute), f"{name}.{attributes} is gone: update {shim}"
            found = getattr(found, attribute)
    for name in getattr(module, "MODULES", ()):
        assert importlib.util.find_spec(name) is not None, f"{name} is gone: update {shim}"


def _library_aliases(tree: ast.AST) -> set[str]:
    """The names a module binds to the libraries or their parts (``torch``, ``nn``, ``F``)."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] in LIBRARIES}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LIBRARIES:
            aliases |= {a.asname or a.name for a in node.names}
    return aliases


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def private_uses(source: str, where: str = "<source>") -> list[str]:
    """Each use of a private name of the libraries in ``source``, as "where:line name"."""
    import torch

    tensor_private = {n for n in dir(torch.Tensor) if _private(n)}
    tree = ast.parse(source)
    aliases, docstrings, found = _library_aliases(tree), _docstrings(tree), []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import)
                       else [node.module] if node.module else [])
            imported = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
            names = [m for m in modules if m.split(".")[0] in LIBRARIES
                     and any(_private(p) for p in m.split(".")[1:] + imported)]
        elif isinstance(node, ast.Attribute):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            rooted = isinstance(base, ast.Name) and base.id in aliases
            if rooted and _private(node.attr):                           # torch._foreach_norm, nn.GRU._x
                names = [ast.unparse(node)]
            elif node.attr in tensor_private and not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                names = [f"._{node.attr.lstrip('_')}"]                   # a tensor's ._version
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names = [node.value] if PRIVATE_MODULE.match(node.value) else []  # "ray._private.services"
        found += [(node.lineno, f"{where}:{node.lineno} {name}") for name in names]
    return [hit for _, hit in sorted(found, key=lambda pair: pair[0])]


def test_the_scan_sees_imports_attributes_and_private_module_names() -> None:
    source = '''
import logging
import torch
from torch import nn
from ray._private import services
"""``torch._foreach_norm`` in a docstring is no use of it."""
norms = torch._foreach_norm(grads)
version = weight._version
cell = nn.GRUCell._flat_weights
log = logging.getLogger("ray.serve._private")
own = self._version
public = torch.__version__
'''
    assert [hit.split(" ", 1)[1] for hit in private_uses(source)] == [
        "ray._private", "torch._foreach_norm", "._version", "nn.GRUCell._flat_weights", "ray.serve._private"]


def test_no_private_name_of_the_libraries_outside_the_shims() -> None:
    shims = {f"{name.replace('.', '/')}.py" for names in SHIMS.values() for name in names}
    found = [hit for path in sorted(ROOT.rglob("*.py")) if str(path.relative_to(ROOT.parent)) not in shims
             for hit in private_uses(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT.parent)))]
    assert found == []


STDLIB_PRIVATE = {"_exit"}          # os._exit: documented, public despite its name


def _own_names(trees: list[ast.AST]) -> set[str]:
    """Every name the package defines: functions, classes, arguments, imports, and attributes it assigns."""
    own: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
            elif isinstance(node, ast.alias):
                own.add(node.asname or node.name.split(".")[-1])
    return own


def foreign_private_attributes(sources: dict[str, str]) -> list[str]:
    """Each ``obj._x`` (``self._x`` included) in ``sources`` whose ``_x`` the sources never define:
    a private attribute of some library's object, such as Optuna's ``trial._trial_id`` or, in a
    subclass of a library class, the base's ``self._ot_study``."""
    trees = {where: ast.parse(source) for where, source in sources.items()}
    own = _own_names(list(trees.values())) | STDLIB_PRIVATE
    return [f"{where}:{node.lineno} {ast.unparse(node)}" for where, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own]


def test_the_scan_sees_private_attributes_of_objects_the_code_did_not_make() -> None:
    source = '''
class Search(OptunaSearch):
    def __init__(self):
        self._mine = 1
    def suggest(self):
        return self._mine, self._ot_study, trial._trial_id, self._helper(), os._exit
    def _helper(self):
        return None
'''
    assert [hit.split(" ", 1)[1] for hit in foreign_private_attributes({"m.py": source})] == [
        "self._ot_study", "trial._trial_id"]


def test_no_private_attribute_of_a_library_object_outside_the_shims() -> None:
    shims = {f"{name.replace('.', '/')}.py" for names in SHIMS.values() for name in names}
    sources = {str(path.relative_to(ROOT.parent)): path.read_text(encoding="utf-8") for path in sorted(ROOT.rglob("*.py"))}
    found = [hit for hit in foreign_private_attributes(sources) if hit.split(":")[0] not in shims]
    assert found == []
