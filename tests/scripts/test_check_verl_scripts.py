"""scripts/check_verl_scripts.py runs a verl-style launch script under stand-ins and loads its overrides."""

import importlib.util
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "check_verl_scripts", Path(__file__).parents[2] / "scripts" / "check_verl_scripts.py"
)
check_verl_scripts = importlib.util.module_from_spec(_SPEC)
sys.modules["check_verl_scripts"] = check_verl_scripts  # dataclasses look their module up by name
_SPEC.loader.exec_module(check_verl_scripts)

# Written for this test in the shape of verl's newer scripts (bash arrays, a torch_npu probe, "$@").
FSDP_SCRIPT = """set -xeuo pipefail
DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
ACTOR=(
    actor_rollout_ref.actor.optim.clip_grad=0.5
    actor_rollout_ref.actor.ppo_mini_batch_size=8
)
[ "$DEVICE" = gpu ] && ACTOR+=(actor_rollout_ref.nccl_timeout=1200)
python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_batch_size=16 \\
    data.train_files="['$HOME/data/gsm8k/train.parquet']" actor_rollout_ref.rollout.n=4 "${ACTOR[@]}" "$@"
"""
MEGATRON_SCRIPT = "python3 -m verl.trainer.main_ppo --config-name='ppo_megatron_trainer' data.train_batch_size=8\n"
UV_NPU_SCRIPT = "uv run --frozen --extra vllm python3 -m verl.trainer.main_ppo trainer.device=npu\n"
BROKEN_SCRIPT = "python3 -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.clip_gard=1.0\n"


@pytest.fixture
def verl_tree(tmp_path):
    folder = tmp_path / "examples" / "grpo_trainer"
    folder.mkdir(parents=True)
    (folder / "run_fsdp.sh").write_text(FSDP_SCRIPT)
    (folder / "run_megatron.sh").write_text(MEGATRON_SCRIPT)
    (folder / "run_typo.sh").write_text(BROKEN_SCRIPT)
    (folder / "run_uv_npu.sh").write_text(UV_NPU_SCRIPT)
    return tmp_path


def test_the_launch_arguments_are_recorded_with_bash_arrays_and_probes_expanded(verl_tree):
    (argv,) = check_verl_scripts.capture_launches(verl_tree / "examples/grpo_trainer/run_fsdp.sh")
    _, overrides = check_verl_scripts.split_launch(argv)

    assert "actor_rollout_ref.nccl_timeout=1200" in overrides  # the probe for torch_npu failed: gpu branch
    assert any(o.startswith("data.train_files=['") and "/data/gsm8k/train.parquet']" in o for o in overrides)


def test_each_script_is_reported_as_loading_skipped_or_failing(verl_tree, capsys):
    status = check_verl_scripts.main([str(verl_tree)])

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("loads     grpo_trainer/run_fsdp.sh")
    assert lines[1].startswith("skipped   grpo_trainer/run_megatron.sh  Megatron-LM backend")
    assert lines[2].startswith("fails     grpo_trainer/run_typo.sh")
    assert "Did you mean 'actor_rollout_ref.actor.optim.clip_grad'" in lines[3] or "clip_gard" in lines[3]
    assert lines[-2].startswith("skipped   grpo_trainer/run_uv_npu.sh  Ascend NPU")  # launched through `uv run`
    assert lines[-1] == "4 scripts: 1 fails, 1 loads, 2 skipped" and status == 1
