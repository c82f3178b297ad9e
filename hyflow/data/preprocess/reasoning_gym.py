"""The `reasoning_gym` tasks: procedural reasoning problems from the `reasoning-gym` library, with its own scorers.

    pip install 'hyflow[envs]'          # reasoning-gym
    hyflow prepare-data reasoning_gym --task basic_arithmetic,chain_sum --size 500 --seed 0 --output data/rg

Each entry of `reasoning_gym.create_dataset(task, size=..., seed=..., **config)` becomes one row: the system
prompt asks for the answer in `<answer></answer>` (one of reasoning-gym's `SYSTEM_PROMPTS`, by name: `default`,
`direct`, `simple`, `DeepSeekZero`, `chain_of_draft`; `none` leaves the system message out), the user message is
the entry's question, `data_source` is `reasoning_gym/<task>`, `reward_model.ground_truth` the entry's answer (as
text; JSON text when the answer is not a string, e.g. None for tasks with many right answers) and
`extra_info["entry"]` the whole entry (question, answer, metadata) as JSON text, so it survives parquet unchanged
and the scorer (`hyflow.reward.scorers.reasoning_gym`) rebuilds it for the task's `score_answer`.

Difficulty (curricula) goes through the task's config: `config={"min_digits": 2}` is passed to `create_dataset` for
every task; with several tasks, a config whose keys are all task names gives each task its own settings. Train rows
come from `seed`, test rows from `seed + 1`; with several tasks the rows are shuffled together by seed.
"""

from __future__ import annotations

import difflib
import json
import random
from typing import Any

DATA_SOURCE_PREFIX = "reasoning_gym/"
INSTALL_HINT = "reasoning-gym is not installed; install it with `pip install 'hyflow[envs]'` (or `reasoning-gym`)."


def import_reasoning_gym() -> Any:
    """The `reasoning_gym` module, or an ImportError that says how to install it."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return reasoning_gym


def known_tasks() -> list[str]:
    """Names of every task reasoning-gym registers."""
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_task(task: str) -> None:
    """ValueError naming the closest known tasks when reasoning-gym has no task called `task`."""
    import_reasoning_gym()
    tasks = known_tasks()
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=5, cutoff=0.5)
        hint = f"did you mean {close}? " if close else ""
        raise ValueError(
            f"reasoning_gym: task={task!r} is not a reasoning-gym task; {hint}"
            f"the {len(tasks)} tasks are: {', '.join(tasks)}."
        )


def parse_tasks(tasks: str | list[str]) -> list[str]:
    """Task names from `"a,b"` or a list, each checked against reasoning-gym's registry."""
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [n for n in names if n]
    if not names:
        raise ValueError("reasoning_gym: --task is required, e.g. --task basic_arithmetic (or several: a,b).")
    for name in names:
        check_task(name)
    return names


def task_configs(tasks: list[str], config: dict[str, Any] | str | None) -> dict[str, dict[str, Any]]:
    """Each task's config: one shared dict, or (several tasks) a dict keyed by task names; JSON text is accepted."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as exc:
            example = '{"min_digits": 2}'
            raise ValueError(f"reasoning_gym: --config {config!r} is not JSON ({exc}); e.g. '{example}'.") from None
    config = config or {}
    if not isinstance(config, dict):
        raise ValueError(f"reasoning_gym: --config must be a JSON object, got {config!r}.")
    if len(tasks) > 1 and config and set(config) <= set(tasks):
        return {task: dict(config.get(task, {})) for task in tasks}
    return {task: dict(config) for task in tasks}


def system_messages(system_prompt: str) -> list[dict[str, str]]:
    """The system message of reasoning-gym's prompt `system_prompt` ([] for "none")."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if system_prompt == "none":
        return []
    if system_prompt not in SYSTEM_PROMPTS:
        raise ValueError(
            f"reasoning_gym: system_prompt={system_prompt!r} is not one of {[*SYSTEM_PROMPTS, 'none']} "
            "(reasoning_gym.utils.SYSTEM_PROMPTS)."
        )
    return [{"role": "system", "content": SYSTEM_PROMPTS[system_prompt]}]


def entry_to_row(
    task: str, entry: dict[str, Any], split: str, index: int, system: list[dict[str, str]]
) -> dict[str, Any]:
    """One verl-schema row for a reasoning-gym entry (see the module docstring for where each part goes)."""
    answer = entry["answer"]
    try:
        entry_json = json.dumps({k: entry[k] for k in ("question", "answer", "metadata")})
    except TypeError as exc:
        raise ValueError(f"reasoning_gym/{task}: entry {index} cannot be stored as JSON ({exc}).") from exc
    return {
        "data_source": DATA_SOURCE_PREFIX + task,
        "prompt": [*system, {"role": "user", "content": entry["question"]}],
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": answer if isinstance(answer, str) else json.dumps(answer)},
        "extra_info": {"split": split, "index": index, "task": task, "entry": entry_json},
    }


def make_rows(
    tasks: list[str],
    configs: dict[str, dict[str, Any]],
    size: int,
    seed: int,
    split: str,
    system_prompt: str = "default",
) -> list[dict[str, Any]]:
    """`size` entries of each task as rows (shuffled together by `seed` when there are several tasks)."""
    reasoning_gym = import_reasoning_gym()
    if size < 1:
        raise ValueError(f"reasoning_gym: size={size} must be >= 1.")
    entries = []
    for task in tasks:
        try:
            dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **configs[task])
        except (TypeError, AssertionError, ValueError) as exc:
            raise ValueError(f"reasoning_gym/{task}: config {configs[task]} was refused by the task: {exc}") from exc
        entries.extend((task, entry) for entry in dataset)
    if len(tasks) > 1:
        random.Random(seed).shuffle(entries)
    system = system_messages(system_prompt)
    return [entry_to_row(task, entry, split, index, system) for index, (task, entry) in enumerate(entries)]


def make_splits(
    tasks: str | list[str] = "",
    train_size: int = 1000,
    test_size: int = 100,
    seed: int = 0,
    config: dict[str, Any] | str | None = None,
    system_prompt: str = "default",
) -> dict[str, list[dict[str, Any]]]:
    """Train rows from `seed` and test rows from `seed + 1` of each task (sizes are per task)."""
    tasks = parse_tasks(tasks)
    configs = task_configs(tasks, config)
    return {
        "train": make_rows(tasks, configs, train_size, seed, "train", system_prompt),
        "test": make_rows(tasks, configs, test_size, seed + 1, "test", system_prompt),
    }
