"""The layers' dependencies point one way (read from the source, every import, deferred ones too).

- ``ray``, ``mlflow`` and ``optuna`` are imported only in ``iaa/platform``, the adapters;
- ``iaa.jobs`` never imports ``iaa.platform`` (jobs are written against ``iaa.jobs.ports``);
- ``iaa.platform`` imports from ``iaa.jobs`` only the ports, configs and paths: the job code an
  adapter runs reaches it as a callable the job passes in, or through a composition root (the
  command line, or an entry module that an outside runner starts: ``ENTRY_MODULES``, which nothing imports);
- ``iaa.model`` imports no other ``iaa`` layer, ``iaa.data`` neither jobs nor platform;
- ``iaa.model.kernels`` (the fast paths) imports only torch, the standard library and its own
  modules, and the rest of ``iaa.model`` reaches the kernels only through the package
  (``iaa.model.kernels.select``), never a kernel module;
- no two modules of ``iaa`` import each other, directly or around a longer cycle: the largest
  strongly connected set of modules is one module;
- inside ``iaa.jobs``: every sub-package is either the base or a use case (``JOBS_BASE``,
  ``USE_CASES``); a use case never imports another use case, the base never imports a use case,
  and the sub-packages import each other without a cycle; each port module reaches the other
  ports only through their records. Planted imports show that each check can fail;
- no port callable takes more than five parameters, and a callable one layer hands another is a
  port: a module-level ``Callable`` alias of the jobs or the platform never hides its parameters
  (``Callable[..., X]``), and one outside ``iaa.jobs.ports`` never crosses its layer
  (``test_callables_across_the_seam_are_ports`` states the rule);
- no two modules share a file name (``__init__`` and ``__main__`` aside), so a name says which module;
- no module is over 600 lines and no function over 75 (``benchmarks/sizes.py`` lists those over
  the targets of 400 and 50: where to split next).
"""

from __future__ import annotations

import ast
import re
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


# Composition roots besides the command line's commands: modules that an outside runner starts,
# which wire the platform to the jobs. Each is placed here with why; nothing in ``iaa`` imports one.
ENTRY_MODULES = {
    "iaa.cli.logged_model": "MLflow runs it as a logged model's code (models-from-code): it hands the job's "
                            "loader to the platform's pyfunc model, and running it sets MLflow's model",
}


def importers(graph: dict[str, set[str]], module: str) -> list[str]:
    """The modules of ``graph`` that import ``module``."""
    return sorted(name for name, deps in graph.items() if module in deps and name != module)


def test_nothing_imports_an_entry_module() -> None:
    assert {module: importers(GRAPH, module) for module in ENTRY_MODULES} == {module: [] for module in ENTRY_MODULES}
    planted = _planted(GRAPH, "iaa.cli.inference", "iaa.cli.logged_model")
    assert importers(planted, "iaa.cli.logged_model") == ["iaa.cli.inference"]


def test_the_tracker_is_handed_the_logged_models_code_file() -> None:
    """The composition step names the model's code file by its path (importing it would run it)."""
    from iaa.cli.adapters import MODEL_FILE

    assert MODEL_FILE.resolve() == MODULES["iaa.cli.logged_model"]


KERNELS = "iaa.model.kernels"


# The one kernel on an optional package: Triton, imported where that kernel runs.
TRITON_KERNEL = {KERNELS + ".triton_gru", KERNELS + ".triton_recurrence"}


def _kernel_may_import(name: str, module: str) -> bool:
    root = module.split(".")[0]
    return (root in ("torch", "__future__") or root in sys.stdlib_module_names
            or module == KERNELS or module.startswith(KERNELS + ".") or (root == "triton" and name in TRITON_KERNEL))


def test_kernels_import_only_torch_the_standard_library_and_each_other() -> None:
    """And Triton, in its own kernel only."""
    outside = {name: sorted(m for m in deps if not _kernel_may_import(name, m))
               for name, deps in GRAPH.items() if name == KERNELS or name.startswith(KERNELS + ".")}
    assert {name: deps for name, deps in outside.items() if deps} == {}
    assert any(m.startswith("triton") for m in GRAPH[KERNELS + ".triton_recurrence"])   # the graph sees it


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
PLATFORM_MAY_IMPORT = {"iaa.jobs", "iaa.jobs.ports", "iaa.jobs.ports.records", "iaa.jobs.ports.tracking",
                       "iaa.jobs.ports.launching", "iaa.jobs.ports.serving", "iaa.jobs.ports.analysis",
                       "iaa.jobs.ports.mapping",
                       "iaa.jobs.config.job_config", "iaa.jobs.config.presets",
                       "iaa.jobs.workdir", "iaa.jobs.workdir.paths", "iaa.jobs.workdir.recorded", "iaa.jobs.config", "iaa.jobs.config.search_space",
                       "iaa.jobs.config.exploration"}   # pure: what a sweep's trials cannot tell (the study's notes)


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


# --- the walls inside iaa.jobs ---------------------------------------------------------------------
# The base is shared by every use case; a use case is one command group's workflow. A sub-package of
# iaa.jobs in neither list fails test_every_jobs_sub_package_is_placed: place it before it grows.
JOBS_BASE = ("config", "workdir", "ports", "modeling", "evaluation", "training", "sweeps", "datasets", "interrupt")
USE_CASES = ("train", "tune", "ensemble", "distill", "inference", "own_data", "reports")


def internal_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between modules of ``graph``, less a module's import of its own ancestor packages
    (importing ``a.b`` runs ``a`` first whatever ``a.b`` names, so that edge adds no order)."""
    return {name: {m for m in deps if m in graph and m != name and not name.startswith(m + ".")}
            for name, deps in graph.items()}


def jobs_part(module: str) -> str | None:
    """The sub-package (or top module, ``ports``) of ``iaa.jobs`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["iaa", "jobs"] else None


def jobs_parts_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The imports between the sub-packages of ``iaa.jobs``: one edge where any module of one imports
    any module of the other."""
    parts: dict[str, set[str]] = {}
    for name, deps in internal_graph(graph).items():
        if (part := jobs_part(name)) is not None:
            parts.setdefault(part, set()).update(p for d in deps if (p := jobs_part(d)) not in (None, part))
    return parts


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components of ``graph`` (every node in exactly one), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found, key=len, reverse=True)


def wall_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Every import across a wall: a use case importing another use case, the base importing a use
    case, and a sub-package placed in neither list."""
    breaches = []
    for name, deps in sorted(internal_graph(graph).items()):
        part = jobs_part(name)
        if part is None:
            continue
        if part not in JOBS_BASE and part not in USE_CASES:
            breaches.append(f"{name}: iaa.jobs.{part} is neither a use case nor the base")
            continue
        for dep in sorted(deps):
            other = jobs_part(dep)
            if other in USE_CASES and other != part:
                kind = "the use case" if part in USE_CASES else "the base"
                breaches.append(f"{name} ({kind} {part}) imports {dep} (the use case {other})")
    return breaches


def test_every_jobs_sub_package_is_placed() -> None:
    found = {jobs_part(name) for name in MODULES} - {None}
    assert found == set(JOBS_BASE) | set(USE_CASES)
    assert not set(JOBS_BASE) & set(USE_CASES)


def test_no_use_case_imports_another_and_the_base_imports_none() -> None:
    assert wall_breaches(GRAPH) == []


def test_the_jobs_sub_packages_import_each_other_without_a_cycle() -> None:
    tangled = [sorted(c) for c in strongly_connected(jobs_parts_graph(GRAPH)) if len(c) > 1]
    assert tangled == []


def test_the_largest_strongly_connected_set_of_modules_is_one() -> None:
    largest = strongly_connected(internal_graph(GRAPH))[0]
    print(f"largest strongly connected set of modules in iaa: {len(largest)} ({sorted(largest)[:5]})")
    assert len(largest) == 1, sorted(largest)


def test_each_port_depends_only_on_the_records() -> None:
    """``iaa.jobs.ports.*`` reach each other only through ``records``; the one exception is the
    launching port's :class:`TrialTracking`, which names the tracking port's ``Tracker`` (a type
    only, imported under ``TYPE_CHECKING``)."""
    allowed = {"iaa.jobs.ports.records", "iaa.jobs.ports.launching:iaa.jobs.ports.tracking"}
    crossings = {f"{name}:{dep}" for name, deps in GRAPH.items()
                 if name.startswith("iaa.jobs.ports.") for dep in deps
                 if dep.startswith("iaa.jobs.ports") and dep != "iaa.jobs.ports.records"}
    assert crossings <= allowed


def _planted(graph: dict[str, set[str]], module: str, imported: str) -> dict[str, set[str]]:
    """A copy of ``graph`` where ``module`` also imports ``imported`` (both made modules if new)."""
    copy = {name: set(deps) for name, deps in graph.items()}
    copy.setdefault(module, set()).add(imported)
    copy.setdefault(imported, set())
    return copy


def test_the_checker_fails_on_a_planted_import_across_the_walls() -> None:
    across = _planted(GRAPH, "iaa.jobs.tune.tune", "iaa.jobs.ensemble.members")
    assert wall_breaches(across) == ["iaa.jobs.tune.tune (the use case tune) imports iaa.jobs.ensemble.members "
                                     "(the use case ensemble)"]
    downward = _planted(GRAPH, "iaa.jobs.evaluation.explaining.explain", "iaa.jobs.reports.report")
    assert wall_breaches(downward) == ["iaa.jobs.evaluation.explaining.explain (the base evaluation) imports "
                                       "iaa.jobs.reports.report (the use case reports)"]
    unplaced = _planted(GRAPH, "iaa.jobs.newthing.job", "iaa.jobs.config.job_config")
    assert wall_breaches(unplaced) == ["iaa.jobs.newthing.job: iaa.jobs.newthing is neither a use case nor the base"]
    # the same import inside one use case, or from a use case down to the base, is no breach
    assert wall_breaches(_planted(GRAPH, "iaa.jobs.tune.tune", "iaa.jobs.tune.best")) == []
    assert wall_breaches(_planted(GRAPH, "iaa.jobs.tune.tune", "iaa.jobs.training.loop")) == []


def test_the_cycle_checks_fail_on_a_planted_cycle() -> None:
    looped = _planted(GRAPH, "iaa.jobs.config.job_config", "iaa.jobs.training.loop")   # training imports config
    assert {"config", "training"} <= strongly_connected(jobs_parts_graph(looped))[0]
    largest = strongly_connected(internal_graph(looped))[0]
    assert {"iaa.jobs.config.job_config", "iaa.jobs.training.loop"} <= largest
    assert len(strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})[0]) == 3


PORT_PARAMETERS = 5     # a port takes one typed request, or a few plain values, never ten arguments


def port_parameter_counts(source: str) -> dict[str, int]:
    """Each callable that ``source`` (a ports module) declares, with how many parameters it takes:
    the methods of its classes (less ``self``) and every ``Callable[[...], ...]`` it names."""
    counts: dict[str, int] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("__post"):
                    a = item.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    counts[f"{node.name}.{item.name}"] = len([n for n in names if n not in ("self", "cls")])
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Callable"
              and isinstance(node.slice, ast.Tuple) and isinstance(node.slice.elts[0], ast.List)):
            counts[f"Callable at line {node.lineno}"] = len(node.slice.elts[0].elts)
    return counts


def test_no_port_callable_takes_more_than_five_parameters() -> None:
    ports = [p for name, p in MODULES.items() if name == "iaa.jobs.ports" or name.startswith("iaa.jobs.ports.")]
    too_many = {f"{path.name}: {where}": n for path in ports
                for where, n in port_parameter_counts(path.read_text(encoding="utf-8")).items() if n > PORT_PARAMETERS}
    assert too_many == {}


# --- callables across the seam: a module-level ``Callable`` alias is where a port hides from the
# count above, so every one in the jobs and the platform is read (see test_callables_across_the_seam_are_ports)
SEAM = ("iaa.jobs", "iaa.platform")
PORTS = "iaa.jobs.ports"


def _is_callable(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "Callable")
            or (isinstance(node, ast.Attribute) and node.attr == "Callable"))


def _type_nodes(node: ast.AST) -> list[ast.AST]:
    """Every node of the type expression ``node``, the insides of quoted annotations too."""
    found = []
    for sub in ast.walk(node):
        found.append(sub)
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                found.extend(_type_nodes(ast.parse(sub.value, mode="eval").body))
            except SyntaxError:
                pass
    return found


def _hides_parameters(value: ast.AST) -> bool:
    """``value`` holds a ``Callable[..., X]``, or a bare ``Callable``: parameters nobody can count."""
    nodes = _type_nodes(value)
    subscripted = {id(n.value) for n in nodes if isinstance(n, ast.Subscript) and _is_callable(n.value)}
    return any((_is_callable(n) and id(n) not in subscripted)
               or (isinstance(n, ast.Subscript) and _is_callable(n.value) and isinstance(n.slice, ast.Tuple)
                   and isinstance(n.slice.elts[0], ast.Constant) and n.slice.elts[0].value is Ellipsis)
               for n in nodes)


def callable_aliases(source: str) -> dict[str, tuple[int, bool]]:
    """The module-level type aliases of ``source`` that hold a ``Callable`` (``X = Callable[...]``,
    ``X: TypeAlias = ...``, ``type X = ...``, a union or a container of one), each with its line and
    whether it hides its parameters (``Callable[..., X]`` or a bare ``Callable``)."""
    found: dict[str, tuple[int, bool]] = {}
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.Subscript, ast.BinOp, ast.Name, ast.Attribute))):
            name, value = node.targets[0].id, node.value
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None
              and ast.unparse(node.annotation).split(".")[-1] == "TypeAlias"):
            name, value = node.target.id, node.value
        elif type(node).__name__ == "TypeAlias":                      # ``type X = ...`` (Python 3.12)
            name, value = node.name.id, node.value
        else:
            continue
        if any(_is_callable(n) for n in _type_nodes(value)):
            found[name] = (node.lineno, _hides_parameters(value))
    return found


def public_signature_names(source: str) -> set[str]:
    """The names in the annotations of what another module calls in ``source``: its module-level
    functions and the methods of its classes, those whose names start with ``_`` aside (dunders
    such as ``__init__`` and ``__call__`` count)."""
    def public(name: str) -> bool:
        return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))

    tree = ast.parse(source)
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    functions += [m for c in tree.body if isinstance(c, ast.ClassDef) and public(c.name)
                  for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names: set[str] = set()
    for f in functions:
        if public(f.name):
            a = f.args
            annotations = [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                           if x is not None and x.annotation is not None] + [f.returns]
            names.update(n.id for ann in annotations if ann is not None
                         for n in _type_nodes(ann) if isinstance(n, ast.Name))
    return names


def names_in(source: str) -> set[str]:
    """Every name ``source`` uses, imports or reads as an attribute."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
    return found


def seam_breaches(sources: dict[str, str], graph: dict[str, set[str]]) -> list[str]:
    """Every module-level ``Callable`` alias of the jobs and the platform (``sources``: module ->
    its text) that hides its parameters, or that is declared outside ``iaa.jobs.ports`` and crosses
    its layer (``graph``: who imports whom)."""
    breaches = []
    for name, source in sorted(sources.items()):
        if not name.startswith(SEAM):
            continue
        layer = ".".join(name.split(".")[:2]) + "."
        outsiders = [m for m in importers(graph, name) if not m.startswith(layer)]
        public = public_signature_names(source)
        for alias, (line, hides) in sorted(callable_aliases(source).items()):
            where = f"{name}.{alias} (line {line})"
            if hides:
                breaches.append(f"{where}: Callable[..., X] hides its parameters")
            if name == PORTS or name.startswith(PORTS + "."):
                continue
            crossed = sorted(m for m in outsiders if alias in public or alias in names_in(sources.get(m, "")))
            if crossed:
                breaches.append(f"{where}: crosses the seam to {', '.join(crossed)}; make it a Protocol in {PORTS}")
    return breaches


def test_callables_across_the_seam_are_ports() -> None:
    """A callable one layer hands another is a port. Read over every module-level type alias that
    holds a ``Callable`` in ``iaa.jobs`` and ``iaa.platform``:

    - none takes ``...`` for its parameters (``Callable[..., X]``, or a bare ``Callable``), in
      ``iaa.jobs.ports`` or anywhere else: the port-size check could not count them;
    - one declared outside ``iaa.jobs.ports`` stays in its layer: it fails when a module of another
      layer (the command line; the platform for a job's alias, the jobs for the platform's) imports
      its module and either the alias is in the annotations of that module's public functions or
      methods (a job that receives the callable from the command line, an adapter handed the
      job's code), or the outsider names the alias. Such a callable is a Protocol in
      ``iaa.jobs.ports`` with a typed ``__call__``, and so falls under the port-size check.

    A plain callback that stays in one layer (a progress callback between job modules,
    ``iaa.platform.serve_proxy``'s ASGI ``Receive`` and ``Send``) may stay a typed alias."""
    sources = {name: path.read_text(encoding="utf-8") for name, path in MODULES.items()}
    assert seam_breaches(sources, GRAPH) == []


def test_the_parameter_count_sees_methods_and_callables() -> None:
    planted = ("class Fit(Protocol):\n"
               "    def __call__(self, cfg, link, *, threads, vocab_hash, prepared='', train=None, valid=None): ...\n"
               "Scorer = Callable[[int, int, int, int, int, int], None]\n")
    assert port_parameter_counts(planted) == {"Fit.__call__": 7, "Callable at line 3": 6}
    # a Callable alias that hides its parameters, anywhere, the ports too
    assert callable_aliases("A = Callable[[int], str]\nB: TypeAlias = 'Callable'\nC = dict[str, Callable[..., int]]\n"
                            "D = int\nE = f(Callable[[int], int])\n") == {"A": (1, False), "B": (2, True), "C": (3, True)}
    sources = {name: path.read_text(encoding="utf-8") for name, path in MODULES.items()}
    for module in ("iaa.jobs.training.loop", "iaa.jobs.ports.records"):
        hidden = dict(sources, **{module: "from typing import Callable\nFit = Callable[..., int] | None\n"})
        assert seam_breaches(hidden, GRAPH) == [f"{module}.Fit (line 2): Callable[..., X] hides its parameters"]
    # a job's alias in the signature of what the command line calls: make-cloze's ``run`` takes a ``TagMap``
    job = "iaa.jobs.own_data.make_cloze"
    received = dict(sources, **{job: sources[job] + "\nTagMap = Callable[[list, object], list[str]]\n"})
    assert seam_breaches(received, GRAPH) == [
        f"{job}.TagMap (line {len(received[job].splitlines())}): crosses the seam to iaa.cli.data; "
        f"make it a Protocol in {PORTS}"]
    # an adapter's alias for the job's code it is handed: teacher_ray's ``scorer`` takes a ``MemberScore``
    adapter = "iaa.platform.teacher_ray"
    handed = dict(sources, **{adapter: sources[adapter] + '\nMemberScore = Callable[[Path, "int | None"], Path]\n'})
    assert seam_breaches(handed, GRAPH) == [
        f"{adapter}.MemberScore (line {len(handed[adapter].splitlines())}): crosses the seam to iaa.cli.ensembles; "
        f"make it a Protocol in {PORTS}"]
    # an outsider that names the alias crosses too; inside one layer, or in a private signature, it does not
    planted = {"iaa.jobs.tune.hooks": "Progress = Callable[[int], None]\ndef _run(p: Progress) -> None: ...\n",
               "iaa.jobs.tune.tune": "from iaa.jobs.tune.hooks import Progress\ndef run(p: Progress) -> None: ...\n",
               "iaa.cli.tuning": "from iaa.jobs.tune import hooks\n"}
    graph = {"iaa.jobs.tune.tune": {"iaa.jobs.tune.hooks"}, "iaa.cli.tuning": {"iaa.jobs.tune.hooks"}}
    assert seam_breaches(planted, graph) == []
    named = dict(planted, **{"iaa.cli.tuning": "from iaa.jobs.tune.hooks import Progress\n"})
    assert seam_breaches(named, graph) == ["iaa.jobs.tune.hooks.Progress (line 1): crosses the seam to "
                                           f"iaa.cli.tuning; make it a Protocol in {PORTS}"]
    ported = {"iaa.jobs.ports.hooks" if k == "iaa.jobs.tune.hooks" else k: v for k, v in named.items()}
    assert seam_breaches(ported, {k: {"iaa.jobs.ports.hooks"} for k in graph}) == []


VOICED = ("iaa.jobs", "iaa.platform")     # they log (``iaa.logs``); the command line speaks


def prints(source: str) -> list[int]:
    """The lines of ``source`` that call the builtin ``print``, or write to ``sys.stdout`` or
    ``sys.stderr`` (``sys.stdout.write(...)``)."""
    def writes(func: ast.expr) -> bool:
        return (isinstance(func, ast.Attribute) and func.attr in ("write", "writelines")
                and isinstance(func.value, ast.Attribute) and func.value.attr in ("stdout", "stderr")
                and isinstance(func.value.value, ast.Name) and func.value.value.id == "sys")

    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and ((isinstance(node.func, ast.Name) and node.func.id == "print") or writes(node.func))]


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
NOT_FLAGS = {"iaa.jobs.evaluation.explaining.explain_html": {"--a"},       # a CSS custom property
             "iaa.platform.tracking.queries": {"--backend-store-uri"},   # mlflow ui's
             "iaa.platform.cluster.connect": {"--address"}}              # ray status's


def strings(source: str) -> list[str]:
    """The string constants of ``source``, docstrings aside (they document; they are not said)."""
    tree = ast.parse(source)
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def spelled_flags(source: str) -> list[str]:
    """The ``--flags`` that ``source`` spells in a string."""
    return [flag for text in strings(source) for flag in FLAG.findall(text)]


def test_the_jobs_and_the_platform_spell_no_flag() -> None:
    """A job or an adapter names an option by its Python name (`` `run_dir` ``), as a library
    caller passes it; the command line spells it."""
    found = {name: sorted(set(spelled_flags(path.read_text(encoding="utf-8"))) - NOT_FLAGS.get(name, set()))
             for name, path in MODULES.items() if name.startswith(("iaa.jobs", "iaa.platform"))}
    assert {name: flags for name, flags in found.items() if flags} == {}
    assert spelled_flags('"""--doc"""\ndef f(x):\n    return f"give --run-dir {x}"\n') == ["--run-dir"]


def test_the_options_that_the_jobs_and_the_platform_name_exist() -> None:
    """Every `` `name` `` in a job's or an adapter's strings is an option of some command, so the
    command line can spell it."""
    from iaa.cli.flags import MARKED, spellings
    from iaa.cli.group import cli

    known = {name for options in spellings(cli).values() for name in options}
    named = {name: {m.group(2) for text in strings(path.read_text(encoding="utf-8"))
                    for m in MARKED.finditer(text) if m.group(2)}
             for name, path in MODULES.items() if name.startswith(("iaa.jobs", "iaa.platform"))}
    unknown = {name: sorted(names - known) for name, names in named.items() if names - known}
    assert unknown == {}


def string_imports(source: str) -> list[int]:
    """The lines of ``source`` that import a module named by a string (``importlib.import_module``,
    ``__import__``): arrows that no import check sees."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
            and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                 or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__")))]


def test_nothing_is_imported_by_a_string() -> None:
    """Except ``iaa.model``'s lazy names (PEP 562), so that ``import iaa.model.config`` loads no torch."""
    found = {name: string_imports(path.read_text(encoding="utf-8")) for name, path in MODULES.items()
             if name != "iaa.model"}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert string_imports("import importlib\nm = importlib.import_module('iaa.jobs.x')\n") == [2]


def test_the_jobs_and_the_platform_never_print() -> None:
    found = {name: prints(path.read_text(encoding="utf-8")) for name, path in MODULES.items()
             if name.startswith(VOICED)}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert prints("import sys\ndef f():\n    print('x', file=sys.stderr)\n") == [3]
    assert prints("import sys\ndef f(rows):\n    sys.stdout.write(rows)\n    sys.stderr.flush()\n") == [3]


# --- sizes: benchmarks/sizes.py reports what is over the targets (where to split next); past the
# hard ceilings (half again the targets) this fails ---------------------------------------------
sys.path.insert(0, str(ROOT.parent / "benchmarks"))
import sizes  # noqa: E402


def shared_names(root: Path) -> dict[str, list[str]]:
    """File name -> the modules under ``root`` that share it (package markers aside)."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.stem not in ("__init__", "__main__"):
            found.setdefault(path.name, []).append(str(path.relative_to(root)))
    return {name: paths for name, paths in found.items() if len(paths) > 1}


def test_no_two_modules_share_a_name(tmp_path: Path) -> None:
    assert shared_names(ROOT) == {}
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "errors.py").write_text("")
    assert shared_names(tmp_path) == {"errors.py": ["a/errors.py", "b/errors.py"]}


def test_no_module_or_function_is_past_its_ceiling() -> None:
    modules, functions = sizes.sizes(ROOT, sizes.MODULE_CEILING, sizes.FUNCTION_CEILING)
    assert modules == {}, f"modules over {sizes.MODULE_CEILING} lines: split them"
    assert functions == {}, f"functions over {sizes.FUNCTION_CEILING} lines: split them"


def test_the_size_check_fails_on_a_planted_long_function(tmp_path: Path) -> None:
    planted = "@decorated\ndef f():\n" + "    x = 1\n" * sizes.FUNCTION_CEILING + "def g():\n    pass\n"
    assert sizes.long_functions(planted, sizes.FUNCTION_CEILING) == {"f (line 2)": sizes.FUNCTION_CEILING + 2}
    (tmp_path / "iaa").mkdir()
    (tmp_path / "iaa" / "big.py").write_text(planted + "y = 0\n" * sizes.MODULE_CEILING)
    modules, functions = sizes.sizes(tmp_path / "iaa", sizes.MODULE_CEILING, sizes.FUNCTION_CEILING)
    assert modules == {"iaa.big": sizes.FUNCTION_CEILING + 4 + sizes.MODULE_CEILING}
    assert functions == {"iaa.big.f (line 2)": sizes.FUNCTION_CEILING + 2}


def _reached(start: str) -> set[str]:
    """``start`` and every module of iaa it imports, at any depth of a file, transitively."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen and name in MODULES:
            seen.add(name)
            todo.extend(GRAPH[name])
    return seen


def test_the_ray_launcher_reaches_no_mlflow() -> None:
    """Ray Tune and Train run where MLflow is not installed (the GPU machine carries a slimmed Ray and
    tracks into the port's fake): the launcher and every module it reaches import no ``mlflow``."""
    reached = _reached("iaa.platform.sweeps.launch") | _reached("iaa.platform.train_workers")
    assert sorted(n for n in reached if any(m.split(".")[0] == "mlflow" for m in GRAPH[n])) == []
