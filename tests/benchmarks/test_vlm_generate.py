"""benchmarks/vlm_generate.py runs on the CPU with the tiny Qwen2.5-VL shape and reports both sides' throughput."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "vlm_generate.py"


@pytest.mark.timeout(300)
def test_the_tiny_shape_reports_engine_and_transformers_tokens_per_second(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("vlm_generate", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setenv("OUT", str(tmp_path))
    args = ["--shape", "tiny", "--num-prompts", "2", "--n", "2", "--image-size", "56", "--new-tokens", "4"]
    result = script.main([*args, "--repeats", "1"])
    assert result["prompt_len"] == 64 + 2 + 4  # text, vision start/end, 2 x 2 merged patches of a 56-pixel image
    assert len(result["engine"]) == 1 and result["engine"][0] > 0 and result["hf"] > 0
    assert (tmp_path / "vlm_generate_tiny.json").is_file()
