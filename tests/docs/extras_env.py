"""Run hyflow commands as in a fresh environment built from hyflow's core dependencies and some extras only.

    python tests/docs/extras_env.py demo '[["demo", "--task", "openai_agent", ...], ["demo", ...]]'

A fresh virtual environment is too slow to build in CI, so this one is simulated: the distributions that
`pip install -e ".[EXTRAS]"` would install are resolved from pyproject.toml and the installed packages' own
requirements (recursively, markers evaluated); every other installed top-level module is hidden from the import
system, so that importing it raises `No module named ...` (and `importlib.util.find_spec` gives None) as in that
fresh environment. Then each argument list runs through `hyflow.cli.main`, in this one process, and any non-zero
exit ends the script with that code.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as metadata
import json
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# What a fresh virtual environment holds before pip installs anything into it.
VENV_BASE = {"pip"}


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements(extras: list[str]) -> list[Requirement]:
    """pyproject.toml's core dependencies and those of `extras`; ValueError naming an extra that does not exist."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise ValueError(f"extras {unknown} are not in pyproject.toml's optional-dependencies ({sorted(optional)}).")
    lines = project["dependencies"] + [line for extra in extras for line in optional[extra]]
    return [Requirement(line) for line in lines]


def installed_closure(requirements: list[Requirement]) -> set[str]:
    """The canonical names of the distributions pip would install for `requirements` (as installed here)."""
    found: set[str] = set(VENV_BASE)
    pending = [(requirement, "") for requirement in requirements]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonical(requirement.name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # not installed here: nothing of it can be imported anyway
        for wanted in [""] if name in found else ["", *requirement.extras]:
            pending += [(Requirement(line), wanted) for line in requires]
        found.add(name)
    return found


def hidden_modules(allowed: set[str]) -> set[str]:
    """Installed top-level modules that no distribution of `allowed` provides (hyflow itself is always there)."""
    provided = metadata.packages_distributions()
    return {
        module
        for module, dists in provided.items()
        if module != "hyflow" and not any(canonical(dist) in allowed for dist in dists)
    }


def hide(modules: set[str]) -> None:
    """Make the top-level `modules` unfindable, as if they were not installed."""

    class ExtrasOnlyPathFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if path is None and fullname in modules:
                return None
            return super().find_spec(fullname, path, target)

    sys.meta_path[:] = [
        ExtrasOnlyPathFinder if finder is importlib.machinery.PathFinder else finder for finder in sys.meta_path
    ]
    for name in [name for name in sys.modules if name.partition(".")[0] in modules]:
        del sys.modules[name]


def main(extras: str, commands: str) -> int:
    hide(hidden_modules(installed_closure(declared_requirements([e for e in extras.split(",") if e]))))
    from hyflow import cli

    for argv in json.loads(commands):
        print(f"=== hyflow {' '.join(argv)}", flush=True)
        code = cli.main(argv)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
