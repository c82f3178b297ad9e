"""Write hyflow/config/verl_keys.yaml: every leaf key of verl's generated `ppo_trainer` config and its default.

    python scripts/extract_verl_keys.py /path/to/verl-git-dir v0.9.0 v0.7.0 > hyflow/config/verl_keys.yaml

Reads `verl/trainer/config/_generated_ppo_trainer.yaml` at each revision (`git show REV:path`, so the git directory
of a bare clone is enough). The first revision is the one hyflow targets; keys that only older revisions have are
added after it, with their older default. `_target_` entries (verl's class names) are left out. The values are
verl's defaults as its generated file prints them (interpolations stay strings). hyflow reads the file to accept a
verl key it does not implement when a script sets it to verl's default (the feature switched off).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import yaml

GENERATED = "verl/trainer/config/_generated_ppo_trainer.yaml"
# ppo_trainer.yaml's defaults list picks the training engine by name; the generated file shows only the result.
DEFAULTS_LIST_CHOICES = {"model_engine": "dp"}


def leaves(node: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in node.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name == "_target_":
            continue
        if isinstance(value, dict) and value:
            yield from leaves(value, key)
        else:
            yield key, value


def generated_keys(git_dir: str, revision: str) -> dict[str, Any]:
    text = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{revision}:{GENERATED}"], capture_output=True, text=True, check=True
    ).stdout
    return dict(leaves(yaml.safe_load(text)))


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    git_dir, revisions = argv[0], argv[1:]
    keys: dict[str, Any] = dict(DEFAULTS_LIST_CHOICES)
    for revision in revisions:
        for key, value in generated_keys(git_dir, revision).items():
            keys.setdefault(key, value)
    header = (
        f"# verl's ppo_trainer keys and defaults: {GENERATED} at {', '.join(revisions)} (first wins),\n"
        f"# plus the defaults-list choice {', '.join(DEFAULTS_LIST_CHOICES)}. Written by scripts/extract_verl_keys.py;"
        " do not edit by hand.\n"
    )
    sys.stdout.write(header + yaml.safe_dump(keys, sort_keys=False, width=200))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
