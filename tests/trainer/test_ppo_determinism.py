"""Determinism and resuming: a fixed seed gives the golden metrics, and a resumed run matches an uninterrupted one.

Regenerate the golden file after an intended change of the numbers:

    HYFLOW_UPDATE_GOLDEN=1 python -m pytest tests/trainer/test_ppo_determinism.py -k golden
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from hyflow.trainer.checkpoint_manifest import MANIFEST_FILE
from hyflow.trainer.ppo_trainer import PPOTrainer
from tests.trainer.ppo_testkit import build_assets, read_metrics, tiny_config

GOLDEN = Path(__file__).parent / "golden" / "grpo_tiny_2_steps.json"
# Wall-clock dependent metrics are not compared.
VOLATILE_PREFIXES = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "rollout/weight_sync_s",
    "rollout/weight_sync_wait_s",
)
REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": (len(solution_str) % 5) / 4, "acc": float(str(ground_truth) in solution_str)}
"""


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("determinism")
    found = build_assets(root)
    (root / "reward.py").write_text(REWARD_FILE)
    found["reward"] = str(root / "reward.py")
    return found


def run_steps(assets, out: Path, *overrides: str) -> dict[int, dict[str, float]]:
    """Train in `out` (the trackers write under ./logs) and return {step: metrics without the wall-clock ones}
    of this run."""
    config = tiny_config(assets, out, f"custom_reward_function.path={assets['reward']}", *overrides)
    out.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(out):
        trainer = PPOTrainer(config)
        trainer.init_workers()
        log_file = trainer.tracking.log_dir / "metrics.jsonl"
        num_logged = len(log_file.read_text().splitlines())  # lines of earlier runs in the same folder
        try:
            trainer.fit()
        finally:
            trainer.close()
        steps = read_metrics(trainer.tracking.log_dir)[num_logged:]
    return {s["step"]: {k: v for k, v in s["data"].items() if not k.startswith(VOLATILE_PREFIXES)} for s in steps}


def assert_metrics_match(actual: dict[str, float], expected: dict[str, float]) -> None:
    assert sorted(actual) == sorted(expected)
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.mark.timeout(180)
def test_a_fixed_seed_reproduces_the_golden_metrics_of_the_first_two_steps(assets, tmp_path):
    steps = run_steps(assets, tmp_path, "trainer.seed=7")
    found = {str(step): metrics for step, metrics in steps.items()}

    if os.environ.get("HYFLOW_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(found) == sorted(golden) == ["1", "2"]
    for step in golden:
        assert_metrics_match(found[step], golden[step])


@pytest.mark.timeout(240)
def test_a_run_resumed_from_its_last_checkpoint_reaches_the_same_metrics(assets, tmp_path):
    common = ["trainer.total_training_steps=3", "trainer.save_freq=2"]
    uninterrupted = run_steps(assets, tmp_path / "a", *common)
    interrupted = tmp_path / "b"
    run_steps(assets, interrupted, *common)
    shutil.rmtree(interrupted / "ckpt" / "global_step_3")  # killed during step 3: step 2 is the last checkpoint

    resumed = run_steps(assets, interrupted, *common)

    assert min(resumed) == 3  # it went on from step 2's checkpoint
    assert_metrics_match(resumed[3], uninterrupted[3])


@pytest.mark.timeout(240)
def test_a_damaged_latest_checkpoint_resumes_from_the_one_before_and_reaches_the_same_metrics(assets, tmp_path, caplog):
    common = ["trainer.total_training_steps=2", "trainer.save_freq=1"]
    uninterrupted = run_steps(assets, tmp_path, *common)
    latest = tmp_path / "ckpt" / "global_step_2"
    assert (latest / MANIFEST_FILE).is_file() and not list(tmp_path.rglob("*.tmp"))
    metadata = latest / "actor" / "dcp" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:-1])  # truncated (a full disk, a partial copy)

    with caplog.at_level(logging.WARNING, logger="hyflow.trainer.checkpoint_manager"):
        resumed = run_steps(assets, tmp_path, *common)

    assert f"{metadata}: truncated" in caplog.text
    assert min(resumed) == 2  # it went on from step 1's checkpoint, the last whole one
    assert_metrics_match(resumed[2], uninterrupted[2])


class Killed(BaseException):
    """Stands for a kill -9 of the trainer."""


@pytest.mark.timeout(180)
def test_a_run_killed_right_after_a_checkpoint_has_already_written_that_steps_metrics(assets, tmp_path, monkeypatch):
    save = PPOTrainer.save_checkpoint

    def save_then_die(self):
        save(self)
        raise Killed

    monkeypatch.setattr(PPOTrainer, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        run_steps(assets, tmp_path, "trainer.total_training_steps=1", "trainer.save_freq=1")

    assert (tmp_path / "ckpt" / "global_step_1" / "trainer_state.pt").is_file()
    assert [line["step"] for line in read_metrics(tmp_path / "logs" / "tests" / "tiny")] == [1]
