"""benchmarks/grpo_step_verl.py configures verl with verl 0.9's own keys and reads its console logger's lines."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
VERL_KEYS = Path(__file__).parents[2] / "hyflow" / "config" / "verl_keys.yaml"


def load_script():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location("grpo_step_verl", BENCHMARKS / "grpo_step_verl.py")
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
        return script
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_every_override_is_a_key_of_verl_0_9s_generated_config(tmp_path):
    script = load_script()
    args = argparse.Namespace(
        prompts=8, n=8, prompt_length=64, response_length=256, micro_batch_size=64, log_prob_micro_batch_size=64,
        steps=4, verl_gpu_memory_utilization=0.5,
    )  # fmt: skip
    assets = {"train": "t.parquet", "model": "m", "tokenizer": "tok"}
    overrides = script.verl_overrides(args, assets, tmp_path, tmp_path / "grpo_step.py")
    known = set(yaml.safe_load(VERL_KEYS.read_text()))
    keys = [override.split("=", 1)[0] for override in overrides]
    # `+a.b.c=v` adds key c to the dict a.b, which verl's config must have
    keys = [key.removeprefix("+").rsplit(".", 1)[0] if key.startswith("+") else key for key in keys]
    assert [key for key in keys if key not in known] == []
    assert "actor_rollout_ref.rollout.name=vllm" in overrides and "actor_rollout_ref.rollout.n=8" in overrides


def test_console_lines_become_one_dict_of_numbers_per_step():
    script = load_script()
    lines = [
        "(TaskRunner pid=12) some other output",
        "(TaskRunner pid=7) step:2 - timing_s/step:1.5 - timing_s/gen:0.75 - actor/pg_loss:-0.01",
        "step:1 - timing_s/step:9.25 - timing_s/gen:4.0 - training/global_step:1",
        "\x1b[36m(TaskRunnerV1 pid=7005)\x1b[0m step:3 - timing_s/step:10.5 - training/num_turns/mean:np.float64(2.0)",
    ]
    assert script.parse_step_lines(lines) == [
        {"timing_s/step": 9.25, "timing_s/gen": 4.0, "training/global_step": 1.0},
        {"timing_s/step": 1.5, "timing_s/gen": 0.75, "actor/pg_loss": -0.01},
        {"timing_s/step": 10.5},
    ]


def test_the_scripts_that_pack_and_unpack_verls_site_are_valid_bash():
    for script in ("pack_verl.sh", "unpack_verl.sh"):
        result = subprocess.run(["bash", "-n", str(BENCHMARKS / "peers" / script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def logged_steps(count: int) -> list[dict[str, float]]:
    return [{"timing_s/step": 10.0 + step, "timing_s/gen": 2.0} for step in range(count)]


def test_a_run_stopped_by_its_timeout_keeps_the_steps_it_logged_and_says_so():
    script = load_script()
    args = argparse.Namespace(steps=4, verl_timeout=330)

    result = script.verl_result(logged_steps(3), "none: stopped after --verl-timeout=330 s", args, [])

    assert result["step_s"] == [10.0, 11.0, 12.0]
    assert result["verl_stages_s"][2] == {"step": 12.0, "gen": 2.0}
    assert result["stopped"].startswith("3 of 4 steps: stopped after --verl-timeout=330 s")


def test_a_complete_run_has_no_note_and_too_few_steps_or_a_crash_raise_with_the_logs_tail():
    script = load_script()
    args = argparse.Namespace(steps=4, verl_timeout=330)

    assert "stopped" not in script.verl_result(logged_steps(4), 0, args, [])
    with pytest.raises(RuntimeError, match="after 1 of 4 steps; last lines of its log:\nout of memory"):
        script.verl_result(logged_steps(1), "none: stopped", args, ["out of memory"])  # only the warm-up
    with pytest.raises(RuntimeError, match="exited with code 1 after 4 of 4 steps"):
        script.verl_result(logged_steps(4), 1, args, ["Traceback"])
