"""Where to split next: the modules of ``iaa`` over 400 lines and the functions over 50 (a
report, not a check; ``tests/test_architecture.py`` fails only past the hard ceilings below).

    python benchmarks/sizes.py

A function's length counts its decorators and docstring.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "iaa"
MODULE_LINES = 400      # the targets: a module fits on a screen or two
FUNCTION_LINES = 50
MODULE_CEILING = 600    # the hard limits (half again the targets): past them a test fails
FUNCTION_CEILING = 75


def long_functions(source: str, limit: int = FUNCTION_LINES) -> dict[str, int]:
    """Each function or method of ``source`` longer than ``limit`` lines (its decorators and
    docstring included), with its length."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if (length := node.end_lineno - start + 1) > limit:
                found[f"{node.name} (line {node.lineno})"] = length
    return found


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sizes(root: Path = ROOT, module_limit: int = MODULE_LINES,
          function_limit: int = FUNCTION_LINES) -> tuple[dict[str, int], dict[str, int]]:
    """The modules under ``root`` longer than ``module_limit`` lines and the functions longer than
    ``function_limit`` (``module.function (line N)``), with their lengths."""
    modules, functions = {}, {}
    for path in sorted(root.rglob("*.py")):
        name, source = _module_name(path, root), path.read_text(encoding="utf-8")
        if (n := len(source.splitlines())) > module_limit:
            modules[name] = n
        functions.update({f"{name}.{where}": n for where, n in long_functions(source, function_limit).items()})
    return modules, functions


def main() -> None:
    modules, functions = sizes()
    print(f"modules over {MODULE_LINES} lines: {len(modules)}")
    for name, n in sorted(modules.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}  {name}")
    print(f"functions over {FUNCTION_LINES} lines: {len(functions)}")
    for name, n in sorted(functions.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
