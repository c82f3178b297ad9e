"""Synthetic tool-use traces: multi-digit products that need the `calculator` tool, in Hermes tool-call format.

    from hyflow.data.preprocess.tool_traces import write_splits
    files = write_splits("data/tool_arith", train_size=2000, test_size=100, seed=0)   # {"train": ..., "test": ...}

Each row serves both phases of the tool demo:
- SFT reads `messages` (the whole trace) and `tools` (the calculator's schema, as a JSON string):

      user       Compute 347 * 862. Use the calculator, then put the answer in <answer></answer>.
      assistant  <tool_call>{"name": "calculator", "arguments": {"expression": "347 * 862"}}</tool_call>
      tool       299114
      assistant  <answer>299114</answer>

- GRPO reads the verl schema: `prompt` (the user turn), `agent_name: tool_agent`, `reward_model.ground_truth`
  (the product) and `data_source: arith`, whose scorer checks the number in `<answer></answer>`.

With two or more digits per operand the product is out of reach for a tiny model's mental arithmetic, so a right
answer needs the tool: copy the expression into the call, then copy the tool's result into the answer. (With one
digit, the `hyflow demo --task tools` default, a model could also learn the table by heart.)
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from hyflow.agent.tools.calculator import CalculatorTool
from hyflow.data.preprocess.common import make_row

DATA_SOURCE = "arith"  # scored by hyflow.reward.scorers.arith (the number in <answer></answer>)
AGENT_NAME = "tool_agent"
INSTRUCTION = "Use the calculator, then put the answer in <answer></answer>."
TOOL_SCHEMA = CalculatorTool.default_schema


def make_problem(rng: random.Random, num_digits: int, operators: str) -> tuple[str, int]:
    """Two operands of exactly `num_digits` digits and an operator of `operators`, drawn again until the result
    has the most digits the operator gives (`2 * num_digits` for `*`, `num_digits + 1` for `+`, `num_digits` for
    `-`, never negative): every trace of one task then has the same token layout, so the numbers a model must copy
    (question -> call, tool response -> answer) always sit the same distance back."""
    low, high = 10 ** (num_digits - 1), 10**num_digits - 1
    while True:
        a, b, op = rng.randint(low, high), rng.randint(low, high), rng.choice(operators)
        value = {"*": a * b, "+": a + b, "-": a - b}[op]
        width = {"*": 2 * num_digits, "+": num_digits + 1, "-": num_digits}[op]
        if value >= 0 and len(str(value)) == width:
            return f"{a} {op} {b}", value


def trace_messages(question: str, expression: str, value: int) -> list[dict[str, Any]]:
    """The conversation to imitate: the question, one calculator call, its result, the final answer."""
    call = {"type": "function", "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(value)},
        {"role": "assistant", "content": f"<answer>{value}</answer>"},
    ]


def make_rows(
    num_rows: int,
    seed: int,
    split: str = "train",
    num_digits: int = 3,
    operators: str = "*",
    agent_name: str = AGENT_NAME,
) -> list[dict[str, Any]]:
    """`num_rows` rows (see the module docstring), each run by the agent loop `agent_name`; the same arguments
    always give the same rows."""
    if num_digits < 1:
        raise ValueError(f"tool_traces: num_digits={num_digits} must be >= 1 (digits of each operand).")
    if not operators or any(op not in "+-*" for op in operators):
        raise ValueError(f"tool_traces: operators={operators!r} must be a non-empty string of '+', '-', '*'.")
    rng = random.Random(seed)
    rows = []
    for index in range(num_rows):
        expression, value = make_problem(rng, num_digits, operators)
        question = f"Compute {expression}. {INSTRUCTION}"
        row = make_row(DATA_SOURCE, question, "tool_use", str(value), split, index, expression=expression)
        row["agent_name"] = agent_name
        row["messages"] = trace_messages(question, expression, value)
        row["tools"] = json.dumps([TOOL_SCHEMA])
        rows.append(row)
    return rows


def write_splits(
    output_dir: str | os.PathLike, train_size: int = 2000, test_size: int = 100, seed: int = 0, **difficulty: Any
) -> dict[str, str]:
    """Write `<output_dir>/train.parquet` (seed) and `test.parquet` (seed + 1); return {split: path}."""
    from hyflow.data.prepare import write_parquet

    Path(output_dir).mkdir(parents=True, exist_ok=True)
    splits = {
        "train": make_rows(train_size, seed, "train", **difficulty),
        "test": make_rows(test_size, seed + 1, "test", **difficulty),
    }
    written = {}
    for split, rows in splits.items():
        written[split] = os.path.join(output_dir, f"{split}.parquet")
        write_parquet(rows, written[split])
    return written
