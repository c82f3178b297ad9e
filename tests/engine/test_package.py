"""The engine is a package of its own: it imports without the trainer's data bus, and its modules import one
another without cycles (counting every import: top level, inside functions and under TYPE_CHECKING)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import hyflow.engine

ENGINE_DIR = Path(hyflow.engine.__file__).parent


def engine_modules() -> dict[str, Path]:
    modules = {}
    for path in ENGINE_DIR.rglob("*.py"):
        parts = path.relative_to(ENGINE_DIR.parent.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_engine_modules(path: Path, known: set[str]) -> set[str]:
    """The engine modules a file imports anywhere in it (`from hyflow.engine import x` counts x when x is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.update(
                f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in known
            )
            if node.module in known:
                found.add(node.module)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_find_cycle_finds_a_cycle_and_accepts_a_dag():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_engine_modules_import_one_another_without_cycles():
    modules = engine_modules()
    known = set(modules)
    # A package's __init__ re-exports its modules; the edges that matter are between the modules themselves.
    graph = {name: imported_engine_modules(path, known) - {"hyflow.engine"} for name, path in modules.items()}
    graph["hyflow.engine"] = set()
    assert {"hyflow.engine.model_runner", "hyflow.engine.cuda_graphs", "hyflow.engine.in_flight"} <= known
    assert find_cycle(graph) is None


def test_the_engine_imports_without_the_trainers_data_bus_or_ray():
    names = sorted(engine_modules())
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}: importlib.import_module(name)\n"
        "leaked = sorted({'hyflow.protocol', 'hyflow.fields', 'hyflow.rollout', 'ray'} & set(sys.modules))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
