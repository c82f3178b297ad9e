"""No two modules of a package import each other: a module that needs another's name and is needed back is one idea
cut in two (or a helper in the wrong file). Every import counts, at the top, inside functions and under
TYPE_CHECKING, read from the source (nothing is imported). A package's `__init__` counts as the module `hyflow.x`.

Checked for the packages below; a package joins the list once its own circles are cut."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hyflow

ROOT = Path(hyflow.__file__).parent.parent
PACKAGES = ("hyflow/protocol", "hyflow/config", "hyflow/data")


def module_name(path: Path, root: Path) -> str:
    """hyflow/data/video.py -> hyflow.data.video; hyflow/protocol/__init__.py -> hyflow.protocol."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, known: set[str]) -> set[str]:
    """The modules of `known` that `source` imports anywhere in it (`from a import b` names a.b when that is a
    module, else a)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in known else node.module)
    return found & known


def two_module_cycles(sources: dict[str, str]) -> list[tuple[str, str]]:
    """Each pair (a, b), a < b, of modules that import each other, given {module name: source}."""
    known = set(sources)
    graph = {name: imported_modules(source, known) - {name} for name, source in sources.items()}
    return sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph[b])


def package_sources(package: str) -> dict[str, str]:
    return {module_name(path, ROOT): path.read_text() for path in sorted((ROOT / package).rglob("*.py"))}


def test_two_module_cycles_finds_imports_at_the_top_inside_functions_and_under_type_checking():
    sources = {
        "pkg.a": "from pkg.b import thing\n",
        "pkg.b": "def f():\n    from pkg.a import other\n",
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n",
        "pkg.d": "import pkg.c\n",
        "pkg.e": "from pkg.a import thing\n",
    }

    assert two_module_cycles(sources) == [("pkg.a", "pkg.b"), ("pkg.c", "pkg.d")]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_modules_of_the_package_import_each_other(package):
    sources = package_sources(package)

    assert len(sources) > 1
    assert two_module_cycles(sources) == []
