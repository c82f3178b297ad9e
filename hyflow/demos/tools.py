"""The `tools` task of `hyflow demo`: a tiny model learns to call a calculator, then GRPO makes it more reliable.

    hyflow demo --task tools          # the sizes of PLAN_DEFAULTS below, unless a flag sets one

What changes from the single-turn tasks (everything else is `hyflow.demos.runner`'s run):
1. data: `hyflow.data.preprocess.tool_traces` writes products with a Hermes-format trace per question (call
   `calculator` with the expression, read its result, answer);
2. SFT imitates the whole trace (`messages` + the calculator's schema in `tools`): the loss covers the model's
   tool call and its final answer, never the tool's response;
3. GRPO runs each prompt through `ToolAgentLoop` (`actor_rollout_ref.rollout.multi_turn`): the model's call is
   parsed, the calculator runs, its result joins the context with response_mask 0, the model answers, and the
   `arith` scorer rewards a right number in `<answer></answer>`.

What the model must learn is to copy: the numbers of the question into the call, the tool's result into the
answer. The tiny model learns that late in SFT: the loss sits near 0.2 for ~500 steps of 32 traces, then drops
within ~100 steps to ~0.001 (measured: 0.196 at step 480, 0.141 at 560, 0.023 at 640); run to the end, SFT leaves
the model 97% right, and GRPO has nothing left to add (at lr 1e-3 it lost accuracy: 96.9% → 68.4% after 20
steps). So the defaults stop SFT in the middle of the drop (`sft_target_loss`), partly right, and GRPO runs at a
lower learning rate. Measured with the plain `hyflow demo --task tools` (these defaults): SFT stopped at step 593,
validation accuracy 16.4% after SFT -> 34.8% after 40 GRPO steps (+18.4 points), 2232 s wall time on a 2-core CPU
shared with seven other jobs (load average ~20; GRPO steps took 12-40 s).

`NUM_DIGITS = 2` or 3 makes the tool indispensable (products a tiny model cannot compute) but needs a longer SFT,
since more digits must be copied right.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

TASK = "tools"
NUM_DIGITS = 1  # digits of each operand (see the module docstring)
MAX_PROMPT_LENGTH = 352  # the calculator's schema in the system turn takes most of it
MAX_RESPONSE_LENGTH = 80  # tool call (~34 tokens) + tool response (~21) + answer (~13)
TOOL_CONFIG = Path(__file__).parents[1] / "agent" / "configs" / "calculator_tool.yaml"
# `hyflow demo --task tools` uses these instead of DemoPlan's defaults (a flag given on the command line wins).
PLAN_DEFAULTS: dict[str, Any] = dict(
    sft_steps=800,
    sft_target_loss=0.08,
    sft_batch_size=32,
    train_size=2000,
    test_size=64,
    grpo_steps=40,
    grpo_prompts=16,
    grpo_lr=3e-4,
    test_freq=10,
)


def with_overrides(base: Sequence[str], updates: dict[str, Any]) -> list[str]:
    """`base` (`key=value` strings) with the keys of `updates` set to their values (`None`: key removed)."""
    kept = [item for item in base if item.split("=", 1)[0] not in updates]
    return kept + [f"{key}={value}" for key, value in updates.items() if value is not None]


def build_assets(
    plan: Any, out: Path, model_sizes: dict[str, int], num_digits: int = NUM_DIGITS, agent_name: str = "tool_agent"
) -> tuple[str, dict[str, str]]:
    """The untrained model folder and the tool traces' train/test parquet files (`plan`: a `runner.DemoPlan`), whose
    rows run the agent loop `agent_name`."""
    from hyflow.data.preprocess.tool_traces import write_splits
    from hyflow.models.tiny import build_tiny_model

    model = build_tiny_model(out / "base_model", arch="qwen2", seed=plan.seed, **model_sizes)
    difficulty = dict(num_digits=num_digits, agent_name=agent_name)
    data = write_splits(out / "data", plan.train_size, plan.test_size, plan.seed, **difficulty)
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
