"""The `tools` demo, short: a tiny model SFT'd on calculator traces calls the tool through `ToolAgentLoop`, the
calls run, only the model's tokens are trained on, and two GRPO steps train on the multi-turn batches."""

from __future__ import annotations

import pytest
import torch

from hyflow import fields as F
from hyflow.agent.parsers import ToolParser
from hyflow.agent.tools.calculator import CalculatorError, calculate, format_number
from hyflow.config import load_config
from hyflow.config.sft import load_sft_config
from hyflow.demos import runner as demo
from hyflow.demos import tools as demo_tools
from hyflow.trainer import stages
from hyflow.trainer.ppo_trainer import PPOTrainer
from hyflow.trainer.sft_trainer import HF_DIR, SFTTrainer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def calculator_text(expression: str) -> str:
    try:
        return format_number(calculate(expression))
    except CalculatorError:
        return "Error"


def check_rows(tokenizer, batch) -> int:
    """Check every row's masks against its text; return how many rows ran a calculator call."""
    parser, num_with_calls = ToolParser.get("hermes", tokenizer), 0
    for i in range(len(batch)):
        valid = batch.batch[F.ATTENTION_MASK][i, -batch.batch[F.RESPONSES].shape[-1] :].bool()
        response, mask = batch.batch[F.RESPONSES][i][valid], batch.batch[F.RESPONSE_MASK][i][valid].bool()
        model_text = tokenizer.decode(response[mask], skip_special_tokens=False)
        context_text = tokenizer.decode(response[~mask], skip_special_tokens=False)
        assert "<tool_response>" not in model_text and "<tool_call>" not in context_text
        calls = parser.parse(model_text).calls
        if "<tool_response>" in context_text:
            num_with_calls += 1
            expected = calculator_text(calls[0].arguments_dict().get("expression", ""))
            assert f"<tool_response>\n{expected}" in context_text  # the call ran, its result is context
    return num_with_calls


def test_a_short_sft_teaches_the_calculator_call_and_grpo_trains_on_the_tool_agents_rollouts(tmp_path):
    plan = demo.DemoPlan(
        sft_steps=40, sft_batch_size=16, sft_lr=1e-2, grpo_steps=2, grpo_prompts=4, grpo_samples=2, train_size=64
    )
    model, data = demo_tools.build_assets(plan, tmp_path, demo.MODEL_SIZES["tiny"])
    SFTTrainer(load_sft_config(demo_tools.sft_overrides(demo.sft_overrides(plan, model, data, tmp_path)))).fit()
    grpo = demo_tools.grpo_overrides(demo.grpo_overrides(plan, str(tmp_path / "sft" / HF_DIR), data, tmp_path, "cpu"))
    config = load_config(demo_tools.with_overrides(grpo, {"data.val_files": None, "trainer.val_before_train": False}))
    trainer = PPOTrainer(config)
    trainer.init_workers()
    try:
        batch = stages.new_prompt_batch(next(iter(trainer.train_loader))).repeat(2, interleave=True)
        trainer.workers.actor_rollout.rollout_mode()
        rollout = trainer.agent_manager.generate_sequences(stages.generation_input(batch, True, {}))
        trainer.workers.actor_rollout.trainer_mode()
        assert check_rows(trainer.tokenizer, rollout) > 0
        metrics = trainer.fit()
    finally:
        trainer.close()

    assert metrics["training/global_step"] == 2
    assert {"actor/pg_loss", "agent/num_tool_calls/mean", "agent/num_turns/mean", "critic/score/mean"} <= set(metrics)
    assert metrics["agent/num_turns/max"] >= 4  # prompt, call, tool response, answer
