"""benchmarks/async_learning.py's modes and corrections: each combination is a config hyflow accepts (the learning
runs themselves take minutes per mode; their numbers are in benchmarks/README.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hyflow.config import load_config
from tests.trainer.ppo_testkit import build_assets, tiny_overrides

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def async_learning(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import async_learning

    yield async_learning
    sys.modules.pop("async_learning", None)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return build_assets(tmp_path_factory.mktemp("async_learning_assets"))


def test_every_correction_loads_with_every_mode_and_leaves_sync_uncorrected(async_learning, assets, tmp_path):
    split = ["trainer.backend=ray", "trainer.placement=split"]
    for correction in async_learning.CORRECTIONS:
        for mode in async_learning.MODES:
            overrides = async_learning.mode_overrides(mode, correction)
            config = load_config([*tiny_overrides(assets, tmp_path), *split, *overrides])
            corrected = mode != "sync" and correction != "none"
            assert config.algorithm.rollout_correction.enabled is corrected, (mode, correction)
            assert config.async_training.mode == async_learning.MODES[mode][0].split("=")[1]
    bypass = load_config(
        [*tiny_overrides(assets, tmp_path), *split, *async_learning.mode_overrides("async4", "bypass")]
    )
    assert not bypass.recompute_old_log_prob  # PPO's ratio against the engine's log-probs: no old-log-prob pass
    tis = load_config([*tiny_overrides(assets, tmp_path), *split, *async_learning.mode_overrides("async1", "tis")])
    assert tis.recompute_old_log_prob and tis.algorithm.rollout_correction.rollout_is == "token"
