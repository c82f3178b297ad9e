"""benchmarks/vlm_grpo_step.py runs GRPO steps of the tiny Qwen2.5-VL on image prompts on the CPU, with the
reference's forward and the engine's generation among the stages, and writes its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def vlm_grpo_step(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import vlm_grpo_step

    yield vlm_grpo_step
    for name in ("vlm_grpo_step", "grpo_step_hyflow", "grpo_step_measure", "grpo_step_report", "vlm_generate"):
        sys.modules.pop(name, None)


def test_the_tokenizer_round_trips_random_ids_and_keeps_the_vision_tokens_at_the_configs_ids(vlm_grpo_step):
    config = vlm_grpo_step.model_config(tiny=True)
    tokenizer = vlm_grpo_step.build_tokenizer(config.get_text_config().vocab_size)
    ids = [3, 400, 17, config.image_token_id, 0]
    assert tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] == ids
    assert tokenizer.convert_tokens_to_ids("<|vision_start|>") == config.vision_start_token_id
    assert vlm_grpo_step.special_ids(151936)["<|image_pad|>"] == 151655  # Qwen2.5-VL's own id at the 3B shape


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_tiny_shape_trains_grpo_steps_on_image_prompts_with_the_reference(vlm_grpo_step, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    result = vlm_grpo_step.main(["--tiny", "--steps", "2"])
    hyflow = result["hyflow"]
    assert len(hyflow["step_s"]) == 2 and hyflow["mean_s"] > 0
    assert {"gen", "ref", "update_actor"} <= set(hyflow["stages_mean_s"])  # engine, reference and actor all ran
    assert result["shape"]["prompt_length"] == 8 + 4 + 2  # text, a 56-pixel image's 2 x 2 tokens, vision start/end
    assert all(0 < length <= 8 for length in hyflow["response_length_mean"])
    assert json.loads((tmp_path / "vlm_grpo_step_tiny.json").read_text())["shape"]["shape"] == "tiny"
