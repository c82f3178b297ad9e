"""`hyflow demo --task vision`: a tiny VLM SFT'd on pictures of shapes, then GRPO raises its validation accuracy."""

import re

import pytest
import torch

from hyflow.demos import runner as demo
from hyflow.demos import vision


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)  # the demo sets its own thread count


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_vision_demo_raises_validation_accuracy_by_ten_points_or_more(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as --device cpu does; restored afterwards
    assert demo.main(["--task", "vision", "--output", str(tmp_path), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    found = re.search(r"validation accuracy: ([\d.]+)% after SFT -> ([\d.]+)% after GRPO", printed)
    assert found, printed
    before, after = float(found.group(1)), float(found.group(2))
    # Seeds 0/1/2/3/4 gain +32.3/+30.1/+23.8/+24.8/+18.3 points (256 test prompts, 0.4 points each): 10 is about
    # half the smallest, 25 prompts' worth.
    assert after - before >= 10.0, printed
    assert (tmp_path / "sft" / "huggingface" / "processor_config.json").is_file()


def test_vision_task_brings_its_own_run_sizes_and_flags_still_win(monkeypatch):
    plans = []
    monkeypatch.setattr(demo, "run_demo", plans.append)
    assert demo.main(["--task", "vision", "--grpo-steps", "3"]) == 0
    assert plans[0].grpo_steps == 3 and plans[0].grpo_prompts == vision.PLAN_DEFAULTS["grpo_prompts"]
    assert demo.main(["--task", "arith"]) == 0
    assert plans[1].grpo_prompts == demo.DemoPlan().grpo_prompts
