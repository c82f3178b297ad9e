"""The `tools` task of `hyflow demo`: a tiny model learns to call a calculator, then GRPO makes it reliable.

    hyflow demo --task tools                     # SFT on calculator traces, then GRPO through the tool agent loop

What changes from the single-turn tasks (everything else is `hyflow.demo`'s run):
1. data: `hyflow.data.preprocess.tool_traces` writes products of two 3-digit numbers, which the model cannot
   compute itself, with a Hermes-format trace per question (call `calculator`, read its result, answer);
2. SFT imitates the whole trace (`messages` + the calculator's schema in `tools`): the loss covers the model's
   tool call and its final answer, never the tool's response;
3. GRPO runs each prompt through `ToolAgentLoop` (`actor_rollout_ref.rollout.multi_turn`): the model's call is
   parsed, the calculator runs, its result joins the context with response_mask 0, the model answers, and the
   `arith` scorer rewards a right number in `<answer></answer>`. A short SFT leaves the copying of the expression
   and of the result error-prone; GRPO raises the share of right answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

TASK = "tools"
NUM_DIGITS = 3  # digits of each operand: 3-digit products need the tool
MAX_PROMPT_LENGTH = 352  # the calculator's schema in the system turn takes most of it
MAX_RESPONSE_LENGTH = 80  # tool call (~34 tokens) + tool response (~21) + answer (~13)
TOOL_CONFIG = Path(__file__).parent / "agent" / "configs" / "calculator_tool.yaml"


def with_overrides(base: Sequence[str], updates: dict[str, Any]) -> list[str]:
    """`base` (`key=value` strings) with the keys of `updates` set to their values (`None`: key removed)."""
    kept = [item for item in base if item.split("=", 1)[0] not in updates]
    return kept + [f"{key}={value}" for key, value in updates.items() if value is not None]


def build_assets(plan: Any, out: Path, model_sizes: dict[str, int]) -> tuple[str, dict[str, str]]:
    """The untrained model folder and the tool traces' train/test parquet files."""
    from hyflow.data.preprocess.tool_traces import write_splits
    from hyflow.models.tiny import build_tiny_model

    model = build_tiny_model(out / "base_model", arch="qwen2", seed=plan.seed, **model_sizes)
    data = write_splits(out / "data", plan.train_size, plan.test_size, plan.seed, num_digits=NUM_DIGITS)
    return model, data


def sft_overrides(base: Sequence[str]) -> list[str]:
    """The demo's SFT overrides, changed to imitate whole traces (messages + tools) instead of one answer."""
    return with_overrides(
        base,
        {
            "data.response_key": None,
            "data.messages_key": "messages",
            "data.tools_key": "tools",
            "data.max_length": MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH,
        },
    )


def grpo_overrides(base: Sequence[str]) -> list[str]:
    """The demo's GRPO overrides, changed to run every prompt through the tool agent loop with the calculator."""
    multi_turn = "actor_rollout_ref.rollout.multi_turn"
    return with_overrides(
        base,
        {
            "data.max_prompt_length": MAX_PROMPT_LENGTH,
            "data.max_response_length": MAX_RESPONSE_LENGTH,
            "data.return_raw_chat": True,
            "actor_rollout_ref.rollout.mode": "async",
            "actor_rollout_ref.rollout.agent.default_agent_loop": "tool_agent",
            f"{multi_turn}.enable": True,
            f"{multi_turn}.tool_config_path": str(TOOL_CONFIG),
            f"{multi_turn}.max_assistant_turns": 2,  # the call, then the answer
        },
    )
