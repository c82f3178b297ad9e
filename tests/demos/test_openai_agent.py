"""The `openai_agent` demo, short: a tiny model SFT'd on calculator traces until it calls the calculator now and
then, then GRPO through `calculator_agent` — an agent written with the `openai` client that runs the calculator in
its own code and returns its reward — raises that reward and the share of calls, with everything seeded."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import yaml

from hyflow.config import load_config
from hyflow.config.sft import load_sft_config
from hyflow.demos import openai_agent as demo_openai_agent
from hyflow.demos import runner as demo
from hyflow.demos import tools as demo_tools
from hyflow.trainer.ppo_trainer import PPOTrainer
from hyflow.trainer.sft_trainer import HF_DIR, SFTTrainer
from tests.docs.markdown import REPO, blocks

# The demo's own sizes (37 SFT steps: the model calls the calculator in about a third of its replies), 10 GRPO
# steps instead of 20, no validation.
PLAN = dataclasses.replace(demo.DemoPlan(task=demo_openai_agent.TASK, **demo_openai_agent.PLAN_DEFAULTS), grpo_steps=10)


class StepLog:
    """A tracking backend that keeps every step's metrics."""

    def __init__(self) -> None:
        self.steps: list[dict[str, float]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        self.steps.append(dict(data))

    def finish(self) -> None:
        pass


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.xfail(
    reason="regressed with the packages of a fresh install on 2026-12-02 (openai 3.57.0, transformers 5.24.0): the "
    "score falls 0.163 -> 0.142, deterministically, also at fa0b429 where it passed in CI; cause not yet found",
    strict=False,
)
def test_grpo_through_the_openai_client_agent_raises_its_reward_and_its_calculator_use(tmp_path):
    model, data = demo_openai_agent.build_assets(PLAN, tmp_path, demo.MODEL_SIZES["tiny"], demo_tools.NUM_DIGITS)
    SFTTrainer(load_sft_config(demo_tools.sft_overrides(demo.sft_overrides(PLAN, model, data, tmp_path)))).fit()
    grpo = demo.grpo_overrides(PLAN, str(tmp_path / "sft" / HF_DIR), data, tmp_path, "cpu")
    overrides = demo_tools.with_overrides(
        demo_openai_agent.grpo_overrides(grpo), {"data.val_files": None, "trainer.val_before_train": False}
    )
    trainer, log = PPOTrainer(load_config(overrides)), StepLog()
    trainer.init_workers()
    try:
        trainer.tracking.loggers["steps"] = log
        trainer.fit()
    finally:
        trainer.close()

    def mean(key: str, steps: list[dict[str, float]]) -> float:
        return sum(step[key] for step in steps) / len(steps)

    first, last = log.steps[:3], log.steps[-3:]
    rise = {key: (mean(key, first), mean(key, last)) for key in ("critic/score/mean", "agent/num_tool_calls/mean")}
    # measured (seed 0, any load): reward 0.162 -> 0.302, calls per episode 0.32 -> 0.64 (mean of steps 1-3 -> 8-10)
    assert rise["critic/score/mean"][1] >= rise["critic/score/mean"][0] + 0.07, rise
    assert rise["agent/num_tool_calls/mean"][1] >= rise["agent/num_tool_calls/mean"][0] + 0.15, rise
    assert [step["reward/extra/reward_from_agent/mean"] for step in log.steps] == [1.0] * PLAN.grpo_steps
    # token consistency over the agent's turns: the actor re-scores each assembled trajectory (tool results
    # inserted by the agent's code included) to the probabilities the engine sampled its tokens with
    assert max(step["training/rollout_probs_diff_max"] for step in log.steps) < 1e-3


def test_the_demo_task_has_its_own_sizes_and_its_loop_file():
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "`hyflow demo --task openai_agent`" in readme  # the command README names parses to these sizes
    plan = demo.plan_from_args(demo._parser().parse_args(["--task", demo_openai_agent.TASK]))
    assert plan == demo.DemoPlan(task=demo_openai_agent.TASK, **demo_openai_agent.PLAN_DEFAULTS)
    overrides = dict(item.split("=", 1) for item in demo_openai_agent.grpo_overrides([]))
    assert overrides["actor_rollout_ref.rollout.agent.default_agent_loop"] == demo_openai_agent.AGENT_NAME
    assert "actor_rollout_ref.rollout.multi_turn.tool_config_path" not in overrides  # the agent runs its own tool
    loops = yaml.safe_load(demo_openai_agent.AGENT_LOOP_CONFIG.read_text())
    assert loops == {
        "agent_loops": [{"name": demo_openai_agent.AGENT_NAME, "_target_": "hyflow.demos.openai_agent.CalculatorAgent"}]
    }
    shown = [b.code for b in blocks(REPO / "docs" / "concepts" / "agent_loop.md") if b.lang == "yaml"]
    assert any(yaml.safe_load(code) == loops for code in shown)  # the docs show the file as it is
