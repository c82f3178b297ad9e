"""README's commands, tested: each is run, or (where the real one takes too long for CI) its shrunk variant runs
the same code path and README's exact text is checked to parse, so that README cannot promise a broken command.

Every command of README's bash blocks must be claimed by one test here (`CLAIMED`): a new command in README
fails `test_every_readme_command_is_claimed_by_a_test` until a test covers it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from hyflow import cli
from hyflow.demos import runner as demo
from hyflow.demos import tools as demo_tools
from hyflow.demos.tools import with_overrides
from tests.process_kit import shell_env

from .markdown import REPO, blocks, pages

README = REPO / "README.md"
EXTRAS_ENV = Path(__file__).with_name("extras_env.py")

# The first words of each README command -> the test that covers it.
CLAIMED = {
    "pip install torch==": "test_the_torch_pin_is_the_one_the_test_script_installs",
    "pip install -e": "test_readme_demo_commands_run_shrunk_with_only_the_extras_readme_installs",
    "hyflow demo --grpo-steps 0": "test_the_tiny_model_route_to_hyflow_train_runs",
    "hyflow demo": "test_readme_demo_commands_run_shrunk_with_only_the_extras_readme_installs",
    "hyflow demo --task tools": "test_readme_serving_commands_and_snippet_stream_a_calculator_call_of_the_demo_model",
    "hyflow serve": "test_readme_serving_commands_and_snippet_stream_a_calculator_call_of_the_demo_model",
    "bash scripts/test.sh": "test_the_test_script_is_valid_bash",
    "hyflow prepare-data gsm8k": "test_the_prepare_data_command_parses",
    "hyflow prepare-data arith": "test_the_tiny_model_route_to_hyflow_train_runs",
    "python -m hyflow.trainer.main_ppo": "test_the_training_command_loads_through_the_config_checker",
    "hyflow train": "test_the_tiny_model_route_to_hyflow_train_runs",
}


def readme_commands() -> list[str]:
    """Each command of README's bash blocks: continuation lines joined, comments dropped, `&&` chains split."""
    commands = []
    for block in blocks(README):
        if block.lang != "bash":
            continue
        text = re.sub(r"\\\n\s*", " ", block.code)
        for line in text.splitlines():
            line = line.split("  #")[0].strip()
            commands += [part.strip() for part in line.split("&&") if part.strip()]
    return commands


def command(prefix: str) -> list[str]:
    """The words of README's one command that starts with `prefix` (and no longer claimed prefix)."""
    found = [c for c in readme_commands() if _claim(c) == prefix]
    assert len(found) == 1, f"README has {len(found)} commands starting with {prefix!r}: {found}"
    return shlex.split(found[0])


def _claim(text: str) -> str | None:
    matches = [prefix for prefix in CLAIMED if text.startswith(prefix)]
    return max(matches, key=len, default=None)


def test_every_readme_command_is_claimed_by_a_test():
    unclaimed = [c for c in readme_commands() if _claim(c) is None]
    assert not unclaimed, f"README commands no test covers (add them to CLAIMED): {unclaimed}"
    assert all(name in globals() for name in CLAIMED.values())


def test_the_torch_pin_is_the_one_the_test_script_installs():
    pin = command("pip install torch==")[2]
    assert f"pip install -q {pin}" in (REPO / "scripts" / "test.sh").read_text()
    assert pin == "torch==2.13.0"
    assert "--index-url https://download.pytorch.org/whl/cpu" in README.read_text()  # the CPU-only route


def readme_extras() -> list[str]:
    """The extras of README's `pip install -e ".[...]"`."""
    target = command("pip install -e")[3]
    return re.fullmatch(r"\.\[(.*)\]", target)[1].split(",")


def test_the_editable_install_names_extras_that_exist():
    defined = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(readme_extras()) <= set(defined)


def test_the_test_script_is_valid_bash():
    words = command("bash scripts/test.sh")
    subprocess.run(["bash", "-n", str(REPO / words[1])], check=True)


def test_the_prepare_data_command_parses():
    from hyflow.data.prepare import _parser

    args = _parser().parse_args(command("hyflow prepare-data gsm8k")[2:])
    assert (args.task, args.input.endswith("data/gsm8k")) == ("gsm8k", True)


SHRINK_DEMO = ["--device", "cpu", "--threads", "1", "--sft-steps", "3", "--grpo-steps", "2", "--train-size", "16"]
SHRINK_DEMO += ["--test-size", "4", "--sft-batch-size", "4", "--grpo-prompts", "2", "--grpo-samples", "2"]
SHRINK_DEMO += ["--test-freq", "1"]


def documented_demo_tasks() -> set[str]:
    """Every task that README or a docs page shows as `hyflow demo --task NAME`."""
    texts = [README.read_text(), *(page.read_text() for page in pages())]
    return {task for text in texts for task in re.findall(r"hyflow demo --task (\w+)", text)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_demo_commands_run_shrunk_with_only_the_extras_readme_installs(tmp_path):
    """README's `hyflow demo` and every `--task` the docs show, shrunk, in one process that can import only what
    `pip install -e ".[<README's extras>]"` installs (tests/docs/extras_env.py: a fresh venv, simulated)."""
    words = command("hyflow demo")
    assert words[:2] == ["hyflow", "demo"]
    tasks = ["arith", *sorted(documented_demo_tasks())]
    assert {"tools", "openai_agent", "vision"} <= set(tasks)
    runs = [[*words[1:], "--task", task, *SHRINK_DEMO] for task in tasks]
    env = shell_env() | {
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    command_line = [sys.executable, str(EXTRAS_ENV), ",".join(readme_extras()), json.dumps(runs)]
    result = subprocess.run(command_line, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "validation accuracy:" in result.stdout
    for task in tasks:  # each in its own folder (hyflow-demo/<task>), the GRPO-trained model as a HF folder
        folder = tmp_path / demo.default_output(task)
        phases = [row.split(",")[0] for row in (folder / "curves.csv").read_text().splitlines()[1:]]
        assert phases.count("sft") >= 1 and phases.count("grpo") == 3, task  # validation before training, 2 steps
        assert (folder / "grpo" / "huggingface" / "config.json").is_file(), task
        assert f"model: {(folder / 'grpo' / 'huggingface').resolve()}" in result.stdout


def test_readme_tools_demo_claim_names_the_plain_command_and_its_defaults():
    text = " ".join(README.read_text().split())
    assert "`hyflow demo --task tools`" in text
    plan = demo.plan_from_args(demo._parser().parse_args(["--task", "tools"]))
    assert f"then {plan.grpo_steps} GRPO steps" in text  # README's numbers were measured with these defaults
    assert plan == demo.DemoPlan(task="tools", **demo_tools.PLAN_DEFAULTS)


def _training_overrides() -> list[str]:
    words = command("python -m hyflow.trainer.main_ppo")
    return words[3:]


def test_the_training_command_loads_through_the_config_checker():
    from hyflow.config import load_config

    config = load_config(_training_overrides(), check_files=False)  # README's model and data are the user's
    assert config.algorithm.adv_estimator == "grpo" and config.actor_rollout_ref.rollout.n == 8
    assert "~" not in str(config.data.train_files)  # expanded to the home folder


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_tiny_model_route_to_hyflow_train_runs(tmp_path, monkeypatch):
    """README's three commands, in its order, shrunk: a shorter SFT, fewer rows, one smaller GRPO step."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    demo_words = command("hyflow demo --grpo-steps 0")
    shrunk_sft = ["--sft-steps", "3", "--train-size", "64", "--test-size", "8"]
    assert cli.main([*demo_words[1:], "--device", "cpu", "--threads", "1", *shrunk_sft]) == 0
    prepare = command("hyflow prepare-data arith")
    assert cli.main([*prepare[1:], "--train-size", "16", "--test-size", "4"]) == 0
    train = command("hyflow train")
    assert train[:2] == ["hyflow", "train"]
    small = {"data.train_batch_size": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 4}
    small |= {"actor_rollout_ref.rollout.n": 2, "data.max_response_length": 4, "trainer.total_training_steps": 1}
    command_line = [sys.executable, "-m", "hyflow", *with_overrides(train[1:], small)]
    subprocess.run(command_line, check=True, timeout=500, env=shell_env())  # as typed into a fresh shell
    assert (tmp_path / "logs" / "hyflow" / "default" / "metrics.jsonl").read_text().count('"step": 1') == 1
    assert not (tmp_path / "outputs").exists()


def test_the_validation_metric_names_readme_gives_are_the_logged_ones():
    from hyflow.trainer.validation import process_validation_metrics

    text = " ".join(README.read_text().split())
    assert "`val-core/<source>/acc/mean@N`" in text and "`val-core/<source>/reward/mean@N`" in text
    sources, uids = ["gsm8k"] * 4, [0, 0, 1, 1]
    with_acc = process_validation_metrics(sources, uids, {"reward": [1.0, 0.0, 1.0, 1.0], "acc": [1, 0, 1, 1]})
    float_only = process_validation_metrics(sources, uids, {"reward": [0.5, 0.25, 1.0, 0.0]})
    assert "val-core/gsm8k/acc/mean@2" in with_acc and "val-core/gsm8k/reward/mean@2" not in with_acc
    assert "val-core/gsm8k/reward/mean@2" in float_only


def readme_serving_snippet() -> str:
    section = README.read_text().split("## Serving", 1)[1].split("\n## ", 1)[0]
    (code,) = [block.code for block in blocks(README) if block.lang == "python" and block.code in section]
    return code


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(server: subprocess.Popen, port: int, log: Path, patience_s: float = 300.0) -> None:
    """Poll `/health` until the server answers 200; fail with the end of its log if it exits or never does."""
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        assert server.poll() is None, f"hyflow serve exited {server.returncode}:\n{log.read_text()[-3000:]}"
        with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as answer:
            if answer.status == 200:
                return
        time.sleep(1)
    raise AssertionError(f"hyflow serve did not answer /health within {patience_s:g} s")


# A short tools demo (the real one runs 37 min): 40 SFT steps at a high learning rate teach the calculator call.
SHRINK_TOOLS_DEMO = ["--device", "cpu", "--threads", "1", "--sft-steps", "40", "--sft-batch-size", "16"]
SHRINK_TOOLS_DEMO += ["--train-size", "64", "--test-size", "4", "--grpo-steps", "1", "--grpo-prompts", "4"]
SHRINK_TOOLS_DEMO += ["--grpo-samples", "2", "--test-freq", "1"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_readme_serving_commands_and_snippet_stream_a_calculator_call_of_the_demo_model(tmp_path, monkeypatch):
    """README's two serving commands in its order (the tools demo shrunk, `hyflow serve` as written but for the
    port), then its snippet: the demo's GRPO-trained model streams a parsed calculator call."""
    from hyflow.data.preprocess.tool_traces import TOOL_SCHEMA

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    words = command("hyflow demo --task tools")
    plan = demo.plan_from_args(demo._parser().parse_args([*words[2:], *SHRINK_TOOLS_DEMO]))
    demo.run_demo(dataclasses.replace(plan, sft_lr=1e-2, sft_target_loss=0.0))  # no flags for these two
    serve, port = command("hyflow serve"), free_port()
    serve[serve.index("--port") + 1] = str(port)
    printed, log = io.StringIO(), tmp_path / "serve.log"
    with (
        log.open("w") as output,
        subprocess.Popen(
            [sys.executable, "-m", "hyflow", *serve[1:]], env=shell_env(), stdout=output, stderr=subprocess.STDOUT
        ) as server,
    ):
        try:
            wait_until_healthy(server, port, log)
            code = readme_serving_snippet().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            namespace: dict = {}
            with contextlib.redirect_stdout(printed):
                exec(compile(code, str(README), "exec"), namespace)
        finally:
            server.terminate()
            server.wait(timeout=60)
    assert namespace["calculator"] == TOOL_SCHEMA  # the tool exactly as the demo's model learnt it
    call, reason = printed.getvalue().splitlines()[-2:]  # a short SFT's model may copy a number wrong
    assert re.fullmatch(r'calculator \{"expression": "\d \* \d"\}', call) and reason == "tool_calls", printed.getvalue()
