"""README's commands, tested: each is run, or (where the real one takes too long for CI) its shrunk variant runs
the same code path and README's exact text is checked to parse, so that README cannot promise a broken command.

Every command of README's bash blocks must be claimed by one test here (`CLAIMED`): a new command in README
fails `test_every_readme_command_is_claimed_by_a_test` until a test covers it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib

import pytest

from hyflow import cli, demo, demo_tools
from hyflow.demo_tools import with_overrides
from tests.process_kit import shell_env

from .markdown import REPO, blocks

README = REPO / "README.md"

# The first words of each README command -> the test that covers it.
CLAIMED = {
    "pip install torch==": "test_the_torch_pin_is_the_one_the_test_script_installs",
    "pip install -e": "test_the_editable_install_names_extras_that_exist",
    "hyflow demo --grpo-steps 0": "test_the_tiny_model_route_to_hyflow_train_runs",
    "hyflow demo": "test_readme_demo_command_runs_shrunk",
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


def test_the_editable_install_names_extras_that_exist():
    target = command("pip install -e")[3]
    extras = re.fullmatch(r"\.\[(.*)\]", target)[1].split(",")
    defined = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) <= set(defined)


def test_the_test_script_is_valid_bash():
    words = command("bash scripts/test.sh")
    subprocess.run(["bash", "-n", str(REPO / words[1])], check=True)


def test_the_prepare_data_command_parses():
    from hyflow.data.prepare import _parser

    args = _parser().parse_args(command("hyflow prepare-data gsm8k")[2:])
    assert (args.task, args.input.endswith("data/gsm8k")) == ("gsm8k", True)


SHRINK_DEMO = ["--device", "cpu", "--threads", "1", "--sft-steps", "3", "--grpo-steps", "2", "--train-size", "64"]
SHRINK_DEMO += ["--test-size", "8", "--grpo-prompts", "4", "--grpo-samples", "2", "--test-freq", "1"]


@pytest.mark.timeout(300)
def test_readme_demo_command_runs_shrunk(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as --device cpu does; restored afterwards
    words = command("hyflow demo")
    assert words[:2] == ["hyflow", "demo"]
    assert cli.main([*words[1:], "--output", str(tmp_path), *SHRINK_DEMO]) == 0
    assert "validation accuracy:" in capsys.readouterr().out
    rows = (tmp_path / "curves.csv").read_text().splitlines()
    phases = [row.split(",")[0] for row in rows[1:]]
    assert phases.count("sft") >= 1 and phases.count("grpo") == 3  # validation before training, then two steps


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
