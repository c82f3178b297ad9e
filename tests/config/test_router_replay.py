"""`actor_rollout_ref.actor.router_replay.mode`: verl's key loads; R3 without the engine's record and either mode on
a dense model are one clear problem each, naming the key, the value and the fix."""

import json

import pytest

from hyflow.config import ConfigError, load_config

KEY = "actor_rollout_ref.actor.router_replay.mode"


def _model_folder(tmp_path, **hf_config) -> str:
    """A model folder with only its config.json (the check reads nothing else)."""
    tmp_path.joinpath("config.json").write_text(json.dumps(hf_config))
    return str(tmp_path)


def _replay_problems(overrides: list[str], check_files: bool = True) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(overrides, check_files=check_files)
    return [problem for problem in caught.value.problems if KEY in problem]


def test_the_modes_load_and_disabled_is_the_default():
    assert load_config([]).actor_rollout_ref.actor.router_replay.mode == "disabled"
    config = load_config([f"{KEY}=R2", "actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B"], check_files=False)
    assert config.actor_rollout_ref.actor.router_replay.mode == "R2"


def test_r3_with_the_transformers_rollout_is_a_problem_naming_the_rollout_and_the_fix():
    (problem,) = _replay_problems([f"{KEY}=R3", "actor_rollout_ref.rollout.name=hf"], check_files=False)
    assert f"{KEY}=R3" in problem and "rollout.name='hf'" in problem
    assert "Fix: set actor_rollout_ref.rollout.name=hyflow" in problem


@pytest.mark.parametrize("mode", ["R2", "R3"])
def test_replay_on_a_dense_model_is_a_problem_naming_the_model(tmp_path, mode):
    path = _model_folder(tmp_path, model_type="qwen2", hidden_size=64)
    (problem,) = _replay_problems([f"{KEY}={mode}", f"actor_rollout_ref.model.path={path}"])
    assert f"{KEY}={mode}" in problem and path in problem and "is dense" in problem
    assert f"Fix: set {KEY}=disabled" in problem


def test_the_embedded_default_model_counts_as_dense():
    (problem,) = _replay_problems([f"{KEY}=R3"])
    assert "the embedded default model is dense" in problem


def test_a_mixture_of_experts_model_passes_the_replay_check(tmp_path):
    path = _model_folder(tmp_path, model_type="qwen3_moe", num_experts=4)
    assert _replay_problems([f"{KEY}=R3", f"actor_rollout_ref.model.path={path}"]) == []


def test_verls_rollout_switch_for_r3_is_accepted():
    config = load_config(["actor_rollout_ref.rollout.enable_rollout_routing_replay=True"])
    assert config.actor_rollout_ref.actor.router_replay.mode == "disabled"
