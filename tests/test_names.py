"""One name per concept: no two modules of hyflow define a public top-level class of the same name (a reader who
greps for a class finds one definition; a module's private helpers, `_Name`, are its own)."""

import ast
from collections import defaultdict
from pathlib import Path

import hyflow

PACKAGE = Path(hyflow.__file__).parent


def _top_level_classes() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(PACKAGE.parent)))
    return found


def test_no_two_modules_define_a_public_class_of_the_same_name():
    duplicates = {name: paths for name, paths in _top_level_classes().items() if len(paths) > 1}

    assert duplicates == {}
