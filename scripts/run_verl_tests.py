"""Run verl's own unit tests against hyflow, out of tree: copy them, change only the imports and device strings.

    python scripts/run_verl_tests.py /path/to/verl-checkout tests/test_protocol_on_cpu.py tests/single_controller
    python scripts/run_verl_tests.py /path/to/verl-checkout --list     # the CPU test files it knows how to port

verl's code never enters this repository: the tests are copied to a scratch directory (`--workdir`, default a new
temporary one), each `verl.<module>` import is rewritten to the hyflow module that holds the same names (the table
below), `cuda` devices become `cpu` and `nccl` becomes `gloo`, and pytest runs there with one line per file:
passed / failed / errors. Tests that import a verl module with no hyflow counterpart fail at collection; the
porting guide (docs/howto/port_verl.md) lists them with the reason.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Longest prefix first: the first match rewrites an import.
MODULES = [
    ("verl.single_controller.base.decorator", "hyflow.controller.decorator"),
    ("verl.single_controller.base.worker", "hyflow.controller.worker"),
    ("verl.single_controller.base", "hyflow.controller"),
    ("verl.single_controller.ray.base", "hyflow.controller"),
    ("verl.single_controller.ray", "hyflow.controller"),
    ("verl.single_controller", "hyflow.controller"),
    # verl's tests rebind the registries as module attributes: point them at the module that owns them
    ("verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY", "hyflow.algorithms.registry.ADV_ESTIMATOR_REGISTRY"),
    ("verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY", "hyflow.algorithms.registry.POLICY_LOSS_REGISTRY"),
    ("verl.trainer.ppo.core_algos", "hyflow.algorithms"),
    ("verl.experimental.agent_loop.tool_parser", "hyflow.agent.parser_formats"),
    ("verl.experimental.agent_loop.tool_agent_loop", "hyflow.agent.tool_agent"),
    ("verl.workers.reward_manager.registry", "hyflow.reward.managers"),
    ("verl.workers.reward_manager", "hyflow.reward.managers"),
    ("verl.utils.reward_score", "hyflow.reward.scorers"),
    ("verl.protocol", "hyflow.protocol"),
    ("verl.utils.ray_utils", "hyflow.controller.ray_objects"),
    ("verl.utils.tensordict_utils", "hyflow.utils.tensordict_utils"),
    ("verl.base_config", "hyflow.config.base_config"),
    ("verl.utils.device", "hyflow.utils.device"),
    ("verl.trainer.ppo.metric_utils", "hyflow.trainer.metric_utils"),
    ("verl.utils.metric.utils", "hyflow.utils.metric"),
    ("verl.utils.metric", "hyflow.utils.metric"),
    ("verl.utils.py_functional", "hyflow.utils.metric"),  # for append_to_dict
    ("verl.workers.config.actor", "hyflow.config.actor_rollout_ref"),
    ("verl.tools.schemas", "hyflow.agent.tools.schemas"),
    ("verl.tools.tool_registry", "hyflow.agent.tools.registry"),
    ("verl.tools.base_tool", "hyflow.agent.tools.base"),
    ("verl.tools.function_tool", "hyflow.agent.tools.function_tool"),
    ("from verl.utils import tensordict_utils", "from hyflow.utils import tensordict_utils"),
    ("verl.utils.dataset.rl_dataset", "hyflow.data.dataset"),
    ("from verl.tools import function_tool", "from hyflow.agent.tools import function_tool"),
    # verl-config: verl's worker configs, its new engine's padding helpers, rollout correction, multi-trajectory GRPO
    ("verl.trainer.ppo.v1.utils", "hyflow.trainer.multi_trajectory"),
    ("verl.workers.utils.padding", "hyflow.utils.padding"),
    ("verl.workers.config.optimizer", "hyflow.config.verl_engine"),
    ("verl.workers.config.engine", "hyflow.config.verl_engine"),
    ("verl.workers.config.model", "hyflow.config.verl_engine"),
    ("verl.workers.config", "hyflow.config.verl_workers"),
    ("verl.utils.config", "hyflow.config.targets"),
    ("verl.trainer.ppo.rollout_corr_helper", "hyflow.algorithms.rollout_corr_helper"),
]
DEVICE_STRINGS = [(r'"cuda"', '"cpu"'), (r"'cuda'", "'cpu'"), (r'"nccl"', '"gloo"'), (r"'nccl'", "'gloo'")]
CPU_TESTS = ["tests/test_protocol_on_cpu.py", "tests/trainer/ppo/test_core_algos_on_cpu.py", "tests/single_controller"]


def port_source(source: str) -> str:
    """The test's text with verl imports pointed at hyflow and CUDA/NCCL strings at CPU/gloo."""
    source = re.sub(
        r"^(\s*)from verl import DataProto\b", r"\1from hyflow.protocol import DataProto", source, flags=re.M
    )
    for old, new in MODULES:
        source = re.sub(rf"\b{re.escape(old)}\b", new, source)
    for old, new in DEVICE_STRINGS:
        source = source.replace(old, new)
    return source


def copy_tests(verl_root: Path, targets: list[str], workdir: Path) -> list[Path]:
    """Copy each target file (or every test_*.py under a target folder) into `workdir`, ported."""
    copied = []
    for target in targets:
        path = verl_root / target
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            destination = workdir / file.relative_to(verl_root)
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_text(port_source(file.read_text()))
            if file.name.startswith("test_"):
                copied.append(destination)
            _copy_package_markers(verl_root, file, workdir)
    return copied


def _copy_package_markers(verl_root: Path, file: Path, workdir: Path) -> None:
    """The `__init__.py` of each folder above `file`, so `tests.<area>.<helper>` imports as in verl (and not
    from hyflow's own `tests` package)."""
    for folder in file.relative_to(verl_root).parents:
        marker = verl_root / folder / "__init__.py"
        if folder != Path(".") and marker.is_file() and not (workdir / folder / "__init__.py").exists():
            (workdir / folder).mkdir(parents=True, exist_ok=True)
            (workdir / folder / "__init__.py").write_text(port_source(marker.read_text()))


def run_file(test_file: Path, workdir: Path, timeout_s: int) -> str:
    """pytest's closing line for one file (or why it did not finish)."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(workdir),
        str(test_file),
    ]
    # Ray's workers import a test module's plain classes by the name pytest gave the module: put its folder on
    # their path, as pytest puts it on the driver's.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(test_file.parent), os.environ.get("PYTHONPATH")])),
    }
    try:
        result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout_s} s"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else result.stderr.strip()[-200:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verl_root", type=Path, help="a checkout of verl (its tests/ folder is read)")
    parser.add_argument("targets", nargs="*", default=CPU_TESTS, help="test files or folders, relative to verl_root")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder for the ported tests")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per test file (default 600)")
    parser.add_argument("--list", action="store_true", help="list the default targets and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(CPU_TESTS))
        return
    if not (args.verl_root / "tests").is_dir():
        sys.exit(f"{args.verl_root} has no tests/ folder; pass the root of a verl checkout.")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="verl-tests-"))
    shutil.rmtree(workdir / "tests", ignore_errors=True)
    for test_file in copy_tests(args.verl_root, args.targets, workdir):
        print(f"{test_file.relative_to(workdir)}: {run_file(test_file, workdir, args.timeout)}", flush=True)


if __name__ == "__main__":
    main()
