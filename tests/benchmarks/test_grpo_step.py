"""benchmarks/grpo_step.py on the CPU: on the Ray backend two workers forming one engine of TP 2 train two GRPO
steps, and the report gives tokens/s per GPU and the weight sync's bytes per rank; NeMo-RL's shape options (several
optimizer steps a batch, a KL to a reference) add the old-log-prob and reference passes, and the report gives
NeMo-RL's measure, prompt + response tokens per second per GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..process_kit import shell_env

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "grpo_step.py"


@pytest.fixture
def grpo_step(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import grpo_step

    yield grpo_step
    sys.modules.pop("grpo_step", None)


def test_nemo_rls_shape_becomes_four_mini_batches_and_a_k3_kl_loss_to_a_bf16_reference(grpo_step, tmp_path):
    from grpo_step_hyflow import hyflow_overrides

    argv = ["--only", "hyflow", "--prompts", "4", "--n", "32", "--mini-batches", "4", "--kl-loss-coef", "0.01"]
    args = grpo_step.parse_args([*argv, "--micro-batch-size", "2", "--gradient-checkpointing"])
    overrides = hyflow_overrides(args, {"train": "t", "model": "m", "tokenizer": "k"}, tmp_path)

    assert "actor_rollout_ref.actor.ppo_mini_batch_size=1" in overrides  # 4 prompts / 4 optimizer steps
    assert {"actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01"} <= set(overrides)
    assert {
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16",
    } <= set(overrides)
    assert "actor_rollout_ref.model.enable_gradient_checkpointing=True" in overrides


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mini-batches", "4"], "add --only hyflow"),  # TRL's sides would run another step
        (["--only", "hyflow", "--prompts", "6", "--mini-batches", "4"], "must divide --prompts=6"),
        (["--only", "hyflow", "--mini-batches", "4", "--micro-batch-size", "32"], "each GPU's 16 rows of a mini"),
    ],
    ids=["other_sides", "prompts", "micro_batch"],
)
def test_shapes_hyflow_cannot_run_stop_before_any_model_is_built(grpo_step, capsys, argv, message):
    with pytest.raises(SystemExit):
        grpo_step.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.slow  # a Ray cluster, two workers, two GRPO steps
@pytest.mark.timeout(600)
def test_the_tiny_shape_on_two_ray_workers_with_one_tp2_engine_reports_per_gpu_throughput(tmp_path):
    command = [sys.executable, str(SCRIPT), "--tiny", "--backend", "ray", "--gpus", "2", "--tp", "2", "--steps", "2"]
    done = subprocess.run(command, env={**shell_env(), "OUT": str(tmp_path)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "generated tok/s per GPU" in done.stdout
    result = json.loads((tmp_path / "grpo_step_ray_2gpu.json").read_text())
    hyflow = result["hyflow"]
    assert result["shape"]["tp"] == 2 and len(hyflow["step_s"]) == 2
    assert hyflow["generated_tokens_per_s_per_gpu"] == pytest.approx(hyflow["generated_tokens_per_s"] / 2)
    sync = hyflow["weight_sync_mean"]  # step 2 synced the weights of step 1's update, half of them to each rank
    assert sync["rollout/weight_sync_gb"] > 0 and sync["rollout/weight_sync_comm_gb"] > 0


@pytest.mark.slow  # two GRPO steps with a reference and an old-log-prob pass on the CPU (~40 s)
@pytest.mark.timeout(600)
def test_the_tiny_nemo_rl_shaped_step_runs_the_log_prob_passes_and_reports_nemo_rls_measure(tmp_path):
    command = [sys.executable, str(SCRIPT), "--tiny", "--only", "hyflow", "--mini-batches", "2", "--steps", "2"]
    done = subprocess.run(
        [*command, "--kl-loss-coef", "0.01", "--gradient-checkpointing"],
        env={**shell_env(), "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "total tok/s/GPU (NeMo-RL)" in done.stdout
    result = json.loads((tmp_path / "grpo_step.json").read_text())
    hyflow, shape = result["hyflow"], result["shape"]
    assert {"old_log_prob", "ref", "update_actor"} <= set(hyflow["stages_mean_s"])
    assert shape["total_tokens"] == 4 * 4 * (16 + 32) and shape["mini_batches"] == 2
    assert hyflow["total_tokens_per_s_per_gpu"] == pytest.approx(shape["total_tokens"] / hyflow["mean_s"])


def test_the_nemo_rl_options_make_a_config_hyflow_accepts_with_a_reference_policy(grpo_step, tmp_path):
    from grpo_step_assets import build_assets
    from grpo_step_hyflow import hyflow_overrides

    from hyflow.config import load_config

    args = grpo_step.parse_args(["--tiny", "--only", "hyflow", "--mini-batches", "2", "--kl-loss-coef", "0.01"])
    config = load_config(hyflow_overrides(args, build_assets(tmp_path, args), tmp_path))

    assert config.use_reference_policy and config.actor_rollout_ref.actor.ppo_mini_batch_size == 2
    assert config.actor_rollout_ref.ref.fsdp_config.model_dtype == "bf16"
