"""No import cycles among ladle's modules.

A cycle makes the import order matter (one module sees the other half-initialized) and is
usually hidden by moving an import into a function; this test reads the imports instead of
running them. It walks every module's import statements that run at import time (module level,
also inside module-level `if`/`try`/`with` and class bodies), skipping imports inside functions
and `if TYPE_CHECKING:` blocks, and asserts that the graph of ladle modules has no strongly
connected component of more than one module, except those allowed below. Importing `a.b.c` also
runs the `__init__` of `a` and `a.b`, so the graph has those edges too (unless the importer lies
inside that package, whose `__init__` has then already begun): `linear.py` importing
`quant/base.py` while `quant/__init__.py` imports `linear.py` is a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parents[1] / "src"

# Cycles tolerated for now: none. (The warm-up names EngineCore only for type checking; so does
# Linear its QuantMethod.)
ALLOWED_CYCLES: list[frozenset[str]] = []


def module_name(path: Path, root: Path = SOURCE_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_statements(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported (not inside functions)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif is_type_checking_block(node):
            yield from import_time_statements(node.orelse)
        elif isinstance(node, ast.ClassDef):
            yield from import_time_statements(node.body)
        else:
            for field in ("body", "orelse", "finalbody"):
                yield from import_time_statements(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                yield from import_time_statements(handler.body)


def enclosing_packages(target: str, importer: str, modules: set[str]) -> set[str]:
    """The packages whose `__init__` importing `target` runs: its ancestors, except those the
    importer lies inside."""
    packages = set()
    parts = target.split(".")
    for length in range(1, len(parts)):
        package = ".".join(parts[:length])
        inside = importer == package or importer.startswith(package + ".")
        if package in modules and not inside:
            packages.add(package)
    return packages


def imported_modules(path: Path, modules: set[str], root: Path = SOURCE_ROOT) -> set[str]:
    """The ladle modules `path` imports at import time: each the most specific existing module,
    and the packages around it that the import initializes."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in import_time_statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
                found |= enclosing_packages(target, name, modules)
                if isinstance(node, ast.ImportFrom):
                    break  # the first hit is the most specific: a submodule, else the package
    return found


def import_graph(root: Path = SOURCE_ROOT) -> dict[str, set[str]]:
    paths = sorted((root / "ladle").rglob("*.py"))
    modules = {module_name(path, root) for path in paths}
    return {module_name(path, root): imported_modules(path, modules, root) for path in paths}


def strongly_connected_components(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[set[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = lowlink[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = lowlink[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    lowlink[node] = min(lowlink[node], index[child])
                continue
            work.pop()
            if work:
                lowlink[work[-1][0]] = min(lowlink[work[-1][0]], lowlink[node])
            if lowlink[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def test_the_walker_sees_module_level_imports_only(tmp_path):
    source = tmp_path / "example.py"
    source.write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import json\n"
        "try:\n    import csv\nexcept ImportError:\n    import gzip\n"
        "def later():\n    import re\n"
        "class Holder:\n    import io\n"
    )
    names = {
        alias.name
        for node in import_time_statements(ast.parse(source.read_text()).body)
        for alias in node.names
    }
    assert names == {"os", "TYPE_CHECKING", "csv", "gzip", "io"}


def test_a_submodule_import_runs_the_packages_around_it():
    modules = {"pkg", "pkg.sub", "pkg.sub.leaf", "pkg.other"}
    # From outside, importing pkg.sub.leaf runs pkg's and pkg.sub's __init__.
    assert enclosing_packages("pkg.sub.leaf", "outside", modules) == {"pkg", "pkg.sub"}
    # From inside pkg, pkg's __init__ has already begun; pkg.sub's has not.
    assert enclosing_packages("pkg.sub.leaf", "pkg.other", modules) == {"pkg.sub"}
    assert enclosing_packages("pkg.sub.leaf", "pkg.sub", modules) == set()


def test_a_package_and_a_module_importing_its_submodule_are_a_cycle(tmp_path):
    """The shape quant/__init__.py and linear.py had: the package imports the module, which
    imports one of the package's submodules (and so runs the package's __init__)."""
    root = tmp_path / "ladle"
    (root / "quant").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "quant" / "__init__.py").write_text("from ladle.linear import Linear\n")
    (root / "quant" / "base.py").write_text("")
    (root / "linear.py").write_text("from ladle.quant.base import QuantMethod\n")
    graph = import_graph(tmp_path)
    assert graph["ladle.linear"] == {"ladle.quant.base", "ladle.quant"}
    cycles = [component for component in strongly_connected_components(graph) if len(component) > 1]
    assert cycles == [{"ladle.quant", "ladle.linear"}]


def test_the_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycles = [component for component in strongly_connected_components(graph) if len(component) > 1]
    assert cycles == [{"a", "b", "c"}]


def test_ladle_has_no_import_cycles():
    graph = import_graph()
    assert "ladle.cli" in graph or "ladle.cli.main" in graph  # the walk found the package
    cycles = [
        sorted(component)
        for component in strongly_connected_components(graph)
        if len(component) > 1 and frozenset(component) not in ALLOWED_CYCLES
    ]
    assert cycles == [], "import cycles (break them, do not hide them in functions): " + str(cycles)
