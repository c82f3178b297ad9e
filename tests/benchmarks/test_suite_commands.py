"""Pre-flight of the GPU suites, on the CPU: every command `run_multi_gpu_suite.sh` would run on 2, 4 and 8 GPUs,
and `run_gpu_suite.sh` in every part (peers included), is accepted by its script's own argument parser (each
benchmark's `parse_args(argv)`, with the checks it makes after parsing; flags spelled out in full), and every
pytest target it names exists; so a misspelled flag, a value a script refuses or a renamed test fails here, not on
a lease. Beyond the parsers: each part's steps fit one 10-minute device call, every Ray GPU step gives Ray the CPUs
its GPU bundles hold, and every training run makes a config hyflow accepts (on a tiny model of the run's sizes).

The commands come from the suites themselves: with `DRY_RUN=1` (benchmarks/suite_step.sh) each step prints its
name, time limit and command instead of running it, and a fake `nvidia-smi` on PATH reports the GPUs. The commands
of the README's "Several GPUs" section and of async_rl.py's and grpo_step.py's docstrings go through the same check.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
FAKE_NVIDIA_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
    i=0
    while [ $i -lt {gpus} ]; do echo "GPU $i: NVIDIA H200 (UUID: GPU-fake-$i)"; i=$((i + 1)); done
else
    echo "NVIDIA H200"
fi
"""


def suite_steps(script: str, tmp_path: Path, gpus: int = 1, parts: str | None = None) -> dict[str, tuple[int, list]]:
    """Step name → (time limit in seconds, command argv) of a suite run with DRY_RUN=1 on a machine whose
    nvidia-smi lists `gpus` GPUs."""
    bin_dir = tmp_path / f"bin_{gpus}"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI.format(gpus=gpus))
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key not in ("GPUS", "OUT")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", DRY_RUN="1")
    command = ["bash", str(BENCHMARKS / script), str(tmp_path / "results"), *([parts] if parts else [])]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    steps = [line.split("\t", 2) for line in done.stdout.splitlines() if "\t" in line]
    return {name: (int(limit), shlex.split(command)) for name, limit, command in steps}


def suite_commands(script: str, tmp_path: Path, gpus: int = 1, parts: str | None = None) -> dict[str, list[str]]:
    """Step name → command (argv) of a DRY_RUN=1 suite run (`suite_steps`)."""
    return {name: argv for name, (_, argv) in suite_steps(script, tmp_path, gpus, parts).items()}


def python_target(argv: list[str]) -> tuple[str, list[str]]:
    """(target, its arguments) of a suite command: the script path of `python3 [-m torch.distributed.run ...]
    benchmarks/x.py ...`, or "pytest" for `python3 -m pytest ...`; `env VAR=...` in front is skipped."""
    words = list(argv)
    if words[0] == "env":
        words.pop(0)
        while "=" in words[0]:
            words.pop(0)
    assert words[0] in ("python", "python3"), f"not a python command: {shlex.join(argv)}"
    words.pop(0)
    if words[:2] == ["-m", "pytest"]:
        return "pytest", words[2:]
    if words[:2] == ["-m", "torch.distributed.run"]:
        words = words[2:]
        while not words[0].endswith(".py"):  # torchrun's own options, e.g. --nproc-per-node 8
            words.pop(0)
    return words[0], words[1:]


@contextlib.contextmanager
def whole_flags_only() -> Iterator[None]:
    """argparse without prefix matching (`allow_abbrev=False`): a flag must be spelled out, so that `--prompt` for
    `--prompts` is caught too (it would run today, and break once another flag shares the prefix)."""
    original = argparse.ArgumentParser.__init__

    def exact(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**kwargs, "allow_abbrev": False})

    argparse.ArgumentParser.__init__ = exact
    try:
        yield
    finally:
        argparse.ArgumentParser.__init__ = original


def parser_refusal(script: str, args: list[str]) -> str | None:
    """What `script`'s own `parse_args(args)` says when it refuses them (None: accepted)."""
    name = Path(script).stem
    sys.path.insert(0, str(REPO / Path(script).parent))
    try:
        module = importlib.import_module(name)
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors), whole_flags_only():
            try:
                module.parse_args(args)
            except SystemExit as exit_:
                return errors.getvalue().strip().splitlines()[-1] if errors.getvalue() else f"exit {exit_.code}"
    finally:
        sys.path.remove(str(REPO / Path(script).parent))
    return None


def missing_pytest_targets(args: list[str]) -> list[str]:
    """The test files and `file::test` ids among pytest's arguments that do not exist (options are skipped)."""
    missing = []
    for target in (arg for arg in args if not arg.startswith("-") and (arg.endswith(".py") or "::" in arg)):
        path, _, test = target.partition("::")
        source = REPO / path
        if not source.is_file() or (
            test and not re.search(rf"^(async )?def {re.escape(test)}\(", source.read_text(), re.M)
        ):
            missing.append(target)
    return missing


def problems(commands: dict[str, list[str]]) -> dict[str, str]:
    """Step name → why its command would fail before doing any work (nothing for the commands that pass)."""
    found = {}
    for name, argv in commands.items():
        target, args = python_target(argv)
        if target == "pytest":
            if missing := missing_pytest_targets(args):
                found[name] = f"no such test: {missing}"
        elif not (REPO / target).is_file():
            found[name] = f"no such script: {target}"
        elif refusal := parser_refusal(target, args):
            found[name] = refusal
    return found


@pytest.mark.parametrize("gpus", [2, 4, 8])
def test_every_command_of_the_multi_gpu_suite_is_accepted_by_its_scripts_parser(tmp_path, gpus):
    commands = suite_commands("run_multi_gpu_suite.sh", tmp_path, gpus)

    assert {f"async_rl_0.5b_{gpus}gpu", f"async_rl_7b_{gpus}gpu", "grpo_7b_nemo_rl_1gpu"} <= set(commands)
    assert f"grpo_7b_nemo_rl_ray_{gpus}gpu" in commands and ("sync_32b_8gpu_tp8" in commands) == (gpus == 8)
    assert problems(commands) == {}


MULTI_GPU_PARTS = "tests,sync,sync32b,actor,actor7b,rollout,grpo,grpo7b1,grpo7b,grpo32b,nemo1,nemo,async,async7b"


@pytest.mark.parametrize("gpus", [2, 8])
def test_each_part_of_the_multi_gpu_suite_fits_one_ten_minute_device_call(tmp_path, gpus):
    limits = {part: suite_steps("run_multi_gpu_suite.sh", tmp_path, gpus, part) for part in MULTI_GPU_PARTS.split(",")}

    assert all(sum(limit for limit, _ in steps.values()) <= 600 for steps in limits.values()), {
        part: sum(limit for limit, _ in steps.values()) for part, steps in limits.items()
    }
    assert all(limits[part] for part in MULTI_GPU_PARTS.split(",") if gpus == 8 or "32b" not in part)
    every_part = suite_steps("run_multi_gpu_suite.sh", tmp_path, gpus)  # the default: all of them
    assert set(every_part) == {name for steps in limits.values() for name in steps}


def test_every_command_of_the_one_gpu_suite_is_accepted_by_its_scripts_parser(tmp_path):
    commands = suite_commands("run_gpu_suite.sh", tmp_path, parts="tests,grpo,actor,rollout,vlm,moe,peers,nemo")

    expected = {"gpu_tests", "grpo_step", "vlm_grpo_step", "moe_kernels", "moe_generate", "grpo_7b"}
    assert expected | {"grpo_7b_nemo_rl_1gpu"} <= set(commands)
    assert problems(commands) == {}


def test_a_misspelled_or_shortened_flag_a_refused_value_and_a_renamed_test_are_each_caught(tmp_path):
    commands = suite_commands("run_multi_gpu_suite.sh", tmp_path, 8, parts="tests,nemo1,async")
    bad = {
        "flag": [word.replace("--micro-batch-size", "--micro-batch-sise") for word in commands["grpo_7b_nemo_rl_1gpu"]],
        "prefix": ["--prompt" if word == "--prompts" else word for word in commands["async_rl_0.5b_8gpu"]],
        "value": [*commands["async_rl_0.5b_8gpu"], "--train-gpus", "8"],
        "test": [word.replace("test_tp2_on", "test_tp3_on") for word in commands["tp_nccl_test"]],
    }

    found = problems(bad)
    assert "unrecognized arguments: --micro-batch-sise" in found["flag"]
    assert "unrecognized arguments: --prompt" in found["prefix"]
    assert "--train-gpus=8 must leave the rollout pool a device" in found["value"]
    assert found["test"].startswith("no such test")


def test_the_several_gpus_section_of_the_benchmarks_readme_shows_only_commands_the_scripts_accept():
    readme = (BENCHMARKS / "README.md").read_text()
    section = readme.split("## Several GPUs", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in re.findall(r"^\s*(python3? benchmarks/\S+\.py.*)$", section, re.M)]
    commands = {line: shlex.split(line.split("  #")[0]) for line in lines}

    assert len(commands) >= 4
    assert problems(commands) == {}


def test_the_latest_leases_commands_in_the_benchmarks_readme_are_accepted_by_their_scripts():
    readme = (BENCHMARKS / "README.md").read_text()
    section = readme.split("### Lease of 2026-12-02 (07:05", 1)[1].split("\n### ", 1)[0].replace("\\\n", " ")
    found = re.findall(r"^(?:[A-Z_]+=\S+ )*(python3? benchmarks/\S+\.py.*)$", section, re.M)
    commands = {line: shlex.split(line.split("  #")[0]) for line in found}

    assert len(commands) >= 5
    assert problems(commands) == {}


def test_the_mixture_of_experts_section_of_the_benchmarks_readme_shows_only_commands_the_scripts_accept():
    readme = (BENCHMARKS / "README.md").read_text()
    section = readme.split("## Mixture of experts", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in re.findall(r"^\s*(python3? benchmarks/\S+\.py.*)$", section, re.M)]
    commands = {line: shlex.split(line.split("  #")[0]) for line in lines}

    assert len(commands) >= 3
    assert problems(commands) == {}


@pytest.mark.parametrize("script", ["async_rl.py", "grpo_step.py", "rollout_throughput.py"])
def test_the_commands_a_scripts_docstring_shows_are_accepted_by_its_parser(script):
    docstring = ast.get_docstring(ast.parse((BENCHMARKS / script).read_text()))
    joined = docstring.replace("\\\n", " ")  # a command continued on the next line
    lines = re.findall(rf"^\s*(python3? benchmarks/{re.escape(script)}.*)$", joined, re.M)
    commands = {line: shlex.split(line.split("  #")[0]) for line in lines}

    assert len(commands) >= 5
    assert problems(commands) == {}


def ray_overrides(script: str, args: list[str], tmp_path: Path) -> list[list[str]]:
    """The trainer overrides of each run a Ray GPU command makes (async_rl: one per mode), by its own functions."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        module = importlib.import_module(Path(script).stem)
        parsed = module.parse_args(args)
        if Path(script).name == "grpo_step.py":
            from grpo_step_hyflow import hyflow_overrides

            return [hyflow_overrides(parsed, {"train": "t", "model": "m", "tokenizer": "k"}, tmp_path)]
        found = {"train": "t", "val": "v", "model": "m"}
        return [module.overrides(found, parsed, mode) for mode in parsed.modes.split(",")]
    finally:
        sys.path.remove(str(BENCHMARKS))


def value_of(overrides: list[str], key: str, default: str = "") -> str:
    return next((item.split("=", 1)[1] for item in overrides if item.startswith(f"{key}=")), default)


@pytest.mark.parametrize("gpus", [2, 8])
def test_every_ray_gpu_step_gives_ray_the_cpus_its_gpu_bundles_hold(tmp_path, gpus):
    from hyflow.controller.ray_pool import RayResourcePool

    cpus_per_gpu = RayResourcePool([1], use_gpu=True).bundle_resources()["CPU"]  # what a pool reserves a GPU
    commands = suite_commands("run_multi_gpu_suite.sh", tmp_path, gpus)
    ray_steps = {name: python_target(argv) for name, argv in commands.items() if "ray" in name or "async" in name}

    assert len(ray_steps) >= 5
    for name, (script, args) in ray_steps.items():
        for overrides in ray_overrides(script, args, tmp_path):
            bundles = int(value_of(overrides, "trainer.n_gpus_per_node"))
            shares = value_of(overrides, "trainer.rollout_shares_devices") == "True"
            if value_of(overrides, "trainer.placement") == "split" and not shares:  # a second pool of its own
                bundles += int(value_of(overrides, "trainer.rollout_n_gpus_per_node", "1"))
            assert int(value_of(overrides, "trainer.ray_init.num_cpus")) >= bundles * cpus_per_gpu, name


def trainer_configs(script: str, args: list[str], root: Path) -> list[Any]:
    """The checked `PPOTrainerConfig` of each run a grpo_step / async_rl command makes, on a tiny model and data of
    the command's sizes (its prompts, lengths and steps), built under `root`; a refused config raises ConfigError."""
    from hyflow.config import load_config

    sys.path.insert(0, str(BENCHMARKS))
    try:
        module = importlib.import_module(Path(script).stem)
        parsed = module.parse_args(args)
        tiny = argparse.Namespace(**vars(parsed))
        if Path(script).name == "grpo_step.py":
            from grpo_step_assets import build_assets
            from grpo_step_hyflow import hyflow_overrides

            tiny.tiny = True
            return [load_config(hyflow_overrides(parsed, build_assets(root, tiny), root))]
        tiny.shape = None
        found = module.assets(root, tiny)
        return [load_config(module.overrides(found, parsed, mode)) for mode in parsed.modes.split(",")]
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_every_training_run_of_the_multi_gpu_suite_makes_a_config_hyflow_accepts(tmp_path):
    commands = suite_commands("run_multi_gpu_suite.sh", tmp_path, 8)
    runs = {name: python_target(argv) for name, argv in commands.items() if name.startswith(("grpo", "async"))}

    configs = {name: trainer_configs(script, args, tmp_path / name) for name, (script, args) in runs.items()}
    assert len(configs["async_rl_0.5b_8gpu"]) == 4 and configs["async_rl_0.5b_8gpu"][1].trainer.placement == "split"
    nemo = configs["grpo_7b_nemo_rl_ray_8gpu"][0]
    assert nemo.use_reference_policy and nemo.data.max_response_length == 1024 and nemo.trainer.n_gpus_per_node == 8
