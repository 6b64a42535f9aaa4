"""The step contract's boundary: the device side (worker, model, attention, kernels, sampling)
imports nothing of the engine core's scheduler side or of the engine loop, at any level of a
file (module-level, inside functions, under TYPE_CHECKING). What crosses is plain data in
ladle.protocol, so a worker can run in another process."""

from __future__ import annotations

import ast
from pathlib import Path

import ladle

PACKAGE = Path(ladle.__file__).parent
DEVICE_SIDE = ("worker", "model", "attention", "kernels", "sample")
FORBIDDEN = ("ladle.core", "ladle.engine", "ladle.frontend")


def imported_modules(path: Path) -> list[str]:
    """Every module a file imports, wherever the import statement sits."""
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.append(node.module)
            modules += [f"{node.module}.{alias.name}" for alias in node.names]
    return modules


def test_imported_modules_sees_every_level(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ladle.core.request import Request\n"
        "def f():\n    import ladle.engine.engine_core\n"
    )
    found = imported_modules(source)
    assert "ladle.core.request" in found and "ladle.engine.engine_core" in found


def test_the_device_side_imports_neither_core_nor_engine():
    offenders = []
    for folder in DEVICE_SIDE:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            for module in imported_modules(path):
                if module.startswith(FORBIDDEN):
                    offenders.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert offenders == []
