"""The verl parquet schema of RL prompt data, and the row checks `RLHFDataset` runs when it loads a file.

A row:

    data_source   str                  selects the reward scorer (`hyflow.reward.scorers`)
    prompt        list of messages     [{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]
    ability       str (optional)       task category, e.g. "math"
    reward_model  dict                 {"style": "rule"|"model", "ground_truth": ...}
    extra_info    dict (optional)      split, index, tools_kwargs, interaction_kwargs, ...
    agent_name    str (optional)       the agent loop that runs the row
    tools         list|str (optional)  OpenAI function schemas (or their JSON) rendered by the chat template

Every problem is reported as a `ValueError` naming the file, the row and the column, before training starts.
"""

from __future__ import annotations

import json
from typing import Any

from hyflow.reward.scorers import needs_ground_truth

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
REWARD_STYLES = ("rule", "model")


class RowError:
    """Builds the ValueError for one row: `<source>, row <i>, column '<c>': <problem>. <fix>`."""

    def __init__(self, source: str, row: int) -> None:
        self.source, self.row = source, row

    def __call__(self, column: str, problem: str, fix: str) -> ValueError:
        return ValueError(f"{self.source}, row {self.row}, column {column!r}: {problem}. {fix}")


def check_messages(messages: Any, error: RowError, column: str = "prompt") -> None:
    """A prompt must be a non-empty list of `{"role", "content"}` dicts with string content."""
    if not isinstance(messages, list) or not messages:
        got = f"got {type(messages).__name__}"
        raise error(column, f"expected a non-empty list of chat messages, {got}", 'Write [{"role": "user", ...}].')
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise error(column, f"message {i} is a {type(message).__name__}", 'Write {"role": ..., "content": ...}.')
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise error(column, f"message {i} has role {role!r}", f"Use one of {list(MESSAGE_ROLES)}.")
        content = message.get("content")
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            problem = f"message {i} has {type(content).__name__} content, not a string"
            raise error(column, problem, "Store message content as text.")


def _check_optional(row: dict[str, Any], column: str, kind: type, error: RowError, fix: str) -> None:
    value = row.get(column)
    if value is not None and not isinstance(value, kind):
        raise error(column, f"expected a {kind.__name__}, got {type(value).__name__}", fix)


def check_row(row: dict[str, Any], source: str, index: int, prompt_key: str, reward_fn_key: str) -> None:
    """Check one row of the schema above; raises ValueError naming `source`, `index` and the column."""
    error = RowError(source, index)
    for column in (prompt_key, reward_fn_key, "reward_model"):
        if column not in row:
            problem = f"the column is missing (columns: {sorted(row)})"
            raise error(column, problem, "Write the file in the verl schema, e.g. with `hyflow prepare-data`.")
    check_messages(row[prompt_key], error, prompt_key)
    if not isinstance(row[reward_fn_key], str):
        got = type(row[reward_fn_key]).__name__
        raise error(reward_fn_key, f"expected a string, got {got}", "It names the dataset, e.g. 'openai/gsm8k'.")
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        problem = f"expected a dict with 'ground_truth', got {reward_model!r:.80}"
        raise error("reward_model", problem, 'Write {"style": "rule", "ground_truth": ...}.')
    style = reward_model.get("style")
    if style is not None and style not in REWARD_STYLES:
        raise error("reward_model", f"style is {style!r}", f"Use one of {list(REWARD_STYLES)}.")
    if reward_model["ground_truth"] is None and style != "model" and needs_ground_truth(row[reward_fn_key]):
        raise error(
            "reward_model",
            f"ground_truth is None, and the scorer of data source {row[reward_fn_key]!r} needs one",
            "Fill in the answer, give the row style 'model', or register its scorer with "
            "@register_scorer(..., needs_ground_truth=False).",
        )
    _check_optional(row, "extra_info", dict, error, "Store per-row information as a dict (or leave it empty).")
    _check_optional(row, "agent_name", str, error, "Name a registered agent loop, e.g. 'tool_agent'.")


def row_tools(row: dict[str, Any], source: str, index: int) -> list[dict] | None:
    """The row's tool schemas (a list of dicts, or its JSON string), or None when it has none."""
    tools, error = row.get("tools"), RowError(source, index)
    if tools is None:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise error("tools", f"not valid JSON ({exc})", "Store a list of function schemas.") from exc
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        problem = f"expected a list of dicts, got {type(tools).__name__}"
        raise error("tools", problem, 'Store [{"type": "function", "function": {...}}, ...].')
    return tools or None
