"""The server's package stands on its own: no module of `omnistage.entrypoints.openai`
imports the CLI, and its modules import each other without a cycle (lazy imports
inside functions included), so each can be read and loaded from the bottom up."""

from __future__ import annotations

import ast
from pathlib import Path

import omnistage.entrypoints.openai as server_package

PACKAGE = "omnistage.entrypoints.openai"


def _imports() -> dict[str, set[str]]:
    root = Path(server_package.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.glob("*.py"):
        name = PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
        graph[name] = {d for d in deps if d.startswith("omnistage.entrypoints")}
    return graph


def test_no_module_of_the_server_imports_the_cli() -> None:
    offenders = [m for m, deps in _imports().items() if "omnistage.entrypoints.cli" in deps]
    assert offenders == []


def test_the_server_package_has_no_import_cycle() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join([*path, module]))
        if module in done or module not in graph:
            return
        for dep in sorted(graph[module]):
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
