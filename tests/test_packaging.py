"""What the package declares about itself: its licence, one version, ``python -m iaa``, its type
hints (``py.typed``), and every third-party package it imports.

Imports are read from the source (every ``import``, deferred ones too) and mapped to the
distributions that provide them (``importlib.metadata.packages_distributions``): each must be a
dependency of ``pyproject.toml``, or of one of its extras for an import made inside a function
(spaCy, for make-cloze). A planted import shows that the check can fail. Ruff passes with the
rules of ``[tool.ruff]``, and every ``# noqa`` code names one of them.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from importlib.metadata import packages_distributions, version
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:             # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "iaa"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _normal(name: str) -> str:
    """A distribution's name as PEP 503 compares it: ``PyYAML`` -> ``pyyaml``, ``a_b.c`` -> ``a-b-c``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_normal(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r.strip()).group()) for r in requirements}


CORE = _names(PYPROJECT["project"]["dependencies"])
EXTRAS = set().union(*(_names(r) for r in PYPROJECT["project"]["optional-dependencies"].values()))


# --- licence, version, entry points, type hints -----------------------------------------------------

def test_the_licence_is_apache_2_0_in_full_and_declared_by_its_spdx_name() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "9. Accepting Warranty or Additional Liability." in text and "END OF TERMS AND CONDITIONS" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert "setuptools>=77" in PYPROJECT["build-system"]["requires"]        # PEP 639 licence metadata


def test_the_version_is_written_once_in_pyproject() -> None:
    import iaa

    written = PYPROJECT["project"]["version"]
    assert iaa.__version__ == version("iaa") == written       # a stale install: pip install -e . again
    literal = re.compile(rf"""["']{re.escape(written)}["']""")
    assert [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if literal.search(p.read_text(encoding="utf-8"))] == []


@pytest.mark.parametrize("module", ["iaa", "iaa.cli"])
def test_python_m_runs_the_cli(module: str) -> None:
    helped = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "Usage:" in helped.stdout and "tune" in helped.stdout
    versioned = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=120)
    assert versioned.returncode == 0 and versioned.stdout.strip() == f"iaa-cli, version {version('iaa')}"


def test_the_package_ships_its_type_hints() -> None:
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["iaa"]


# --- every import declared -----------------------------------------------------------------------

def third_party_imports(source: str) -> dict[str, bool]:
    """The top-level name of each module ``source`` imports outside the standard library and
    ``iaa``, and whether every import of it is deferred (inside a function)."""
    found: dict[str, bool] = {}

    def visit(node: ast.AST, deferred: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("iaa", "__future__"):
                found[top] = found.get(top, True) and deferred
        inside = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(ast.parse(source), False)
    return found


def lazily_imported(sources: dict[str, str]) -> set[str]:
    """The files (of ``sources``, by path) of the ``iaa`` modules that some module imports and
    every one imports inside a function."""
    imports: dict[str, bool] = {}                        # iaa module -> every import of it deferred

    def visit(node: ast.AST, deferred: bool) -> None:
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if name.split(".")[0] == "iaa":
                imports[name] = imports.get(name, True) and deferred
        inside = deferred or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    for source in sources.values():
        visit(ast.parse(source), False)
    return {where for where in sources
            if imports.get(where.removesuffix(".py").removesuffix("/__init__").replace("/", ".")) is True}


def undeclared(sources: dict[str, str], core: set[str], extras: set[str]) -> dict[str, str]:
    """Each imported module that no declared distribution provides (an import at module level
    needs a core dependency; a deferred one may come from an extra), with the file that imports it."""
    provided = packages_distributions()
    missing: dict[str, str] = {}
    for where, source in sorted(sources.items()):
        for module, deferred in third_party_imports(source).items():
            # not installed here (an extra's): only its own name can tell its distribution
            distributions = {_normal(d) for d in provided.get(module, [])} or {_normal(module)}
            if not distributions & (core | extras if deferred else core):
                missing.setdefault(module, where)
    return missing


# An extra's own module: it imports the extra at module level, and is imported only inside the
# functions that run it.
EXTRA_MODULES = {"iaa/model/kernels/triton_recurrence.py": "triton"}


def test_every_third_party_import_is_a_declared_dependency() -> None:
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py")}
    assert undeclared({k: v for k, v in sources.items() if k not in EXTRA_MODULES}, CORE, EXTRAS) == {}
    assert set(EXTRA_MODULES) <= lazily_imported(sources)
    for where, extra in EXTRA_MODULES.items():
        own = _names(PYPROJECT["project"]["optional-dependencies"][extra])
        assert undeclared({where: sources[where]}, CORE | own, set()) == {}, where


def test_the_import_check_fails_on_a_planted_import() -> None:
    planted = ("import psutil\nfrom yaml import safe_load\nimport os, iaa.errors\n\n"
               "def tag():\n    import spacy\n    import cmaes.x\n")
    assert third_party_imports(planted) == {"psutil": False, "yaml": False, "spacy": True, "cmaes": True}
    assert undeclared({"planted.py": planted}, CORE, EXTRAS) == {}
    assert undeclared({"planted.py": planted}, CORE - {"psutil"}, EXTRAS) == {"psutil": "planted.py"}
    # yaml is PyYAML's; spacy (not installed) counts as an extra's only when deferred
    assert undeclared({"planted.py": planted}, CORE - {"pyyaml"}, EXTRAS) == {"yaml": "planted.py"}
    assert undeclared({"planted.py": "import spacy\n"}, CORE, EXTRAS) == {"spacy": "planted.py"}
    assert undeclared({"planted.py": "import not_a_dependency_at_all\n"}, CORE, EXTRAS) == {
        "not_a_dependency_at_all": "planted.py"}
    # a module that every importer imports inside a function (an extra's own module may be one)
    lazy = {"iaa/k.py": "import spacy\n", "iaa/a.py": "def f():\n    from iaa import k\n"}
    assert lazily_imported(lazy) == {"iaa/k.py"}
    assert lazily_imported({**lazy, "iaa/b.py": "import iaa.k\n"}) == set()
    assert lazily_imported({"iaa/k.py": "import spacy\n"}) == set()             # imported by none


# --- lint ------------------------------------------------------------------------------------------

LINTED = [p for folder in ("iaa", "tests", "benchmarks", "deploy") for p in (ROOT / folder).rglob("*.py")]


def test_every_noqa_code_names_a_selected_rule() -> None:
    selected = tuple(PYPROJECT["tool"]["ruff"]["lint"]["select"])
    codes = {(str(p.relative_to(ROOT)), code) for p in LINTED
             for codes in re.findall(r"#\s*noqa:\s*([A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)", p.read_text(encoding="utf-8"))
             for code in re.split(r"\s*,\s*", codes)}
    assert codes and {(where, code) for where, code in codes if not code.startswith(selected)} == set()


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff comes with the dev extra")
def test_ruff_passes() -> None:
    assert "ruff" in _names(PYPROJECT["project"]["optional-dependencies"]["dev"])
    linted = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_readme_shows_how_to_open_a_sweep_in_optuna_dashboard() -> None:
    """Where the README shows how to look at a sweep, it names the ``dashboard`` extra (which
    installs optuna-dashboard) and opens the work folder's study store with it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("Compare the trials in MLflow")[1].split("\n## ")[0]
    assert 'pip install -e ".[dashboard]"' in section
    assert "optuna-dashboard sqlite:///iaa-work/optuna.db" in section
    assert "optuna-dashboard" in _names(PYPROJECT["project"]["optional-dependencies"]["dashboard"])
