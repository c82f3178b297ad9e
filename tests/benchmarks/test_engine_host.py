"""benchmarks/engine_host.py on a few rows: the timed engine gives the plain engine's outputs, every part of a
window is measured, and the engine's functions are as they were afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def engine_host(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import engine_host

    yield engine_host
    sys.modules.pop("engine_host", None)


def test_the_timed_engine_gives_the_plain_engines_outputs_and_measures_every_part(engine_host, tmp_path, monkeypatch):
    import hyflow.engine.engine as engine_module
    import hyflow.engine.model_runner as runner_module

    originals, threads = (engine_module.read_outputs, runner_module.decode_step), torch.get_num_threads()
    monkeypatch.setenv("OUT", str(tmp_path))
    result = engine_host.main(["--rows", "6", "--prompt-len", "4", "--new-tokens", "20", "--repeats", "2"])
    assert (engine_module.read_outputs, runner_module.decode_step) == originals and torch.get_num_threads() == threads

    plain = engine_host.build_engine(6, 24, 8)
    torch.set_num_threads(1)  # as the benchmark runs: the CPU kernels' sums then add in the same order
    try:
        outputs = plain.generate(engine_host.random_prompts(6, 4), engine_host.benchmark_params(20))
    finally:
        torch.set_num_threads(threads)
    assert all(len(out.outputs[0].token_ids) == 20 for out in outputs)
    assert result["digest"] == engine_host.outputs_digest(outputs)
    parts = result["us_per_window"]
    assert set(parts) == set(engine_host.PARTS) and all(parts[name] > 0 for name in engine_host.PARTS)
    assert parts["host"] >= parts["take_outputs"] and len(result["host_us_per_run"]) == 2
    assert (tmp_path / "engine_host.json").exists()
