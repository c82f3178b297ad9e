"""The paths of a `PPOTrainerConfig`: `~` expanded in every one, and each file or folder the run will read checked
before any worker starts.

- `expand_user_paths(config)`: every path field (a name ending in `path`, `_files` or `_dir`, and the tokenizer
  folders) gets `os.path.expanduser`, wherever the value came from (command line, YAML, Python).
- `check_paths(config)`: model folders (`actor_rollout_ref.model.path`, the critic's and the reward model's, the
  tokenizer folders when set) are local Hugging Face folders; data files exist; the training files hold at least
  one batch (`data.train_batch_size` prompts) once `data.train_max_samples` is applied; config and code files
  (custom reward function, tool / interaction / agent-loop YAML) exist. Rows are counted from the parquet footer
  (or the JSON lines), without reading the data.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from hyflow.config.ppo_trainer import PPOTrainerConfig
from hyflow.models.folders import check_local_model_folder, check_local_tokenizer_folder

_ROLLOUT = "actor_rollout_ref.rollout"
_PATH_NAMES = ("tokenizer", "input_tokenizer")
_PATH_SUFFIXES = ("path", "_files", "_dir")


def is_path_field(name: str) -> bool:
    """Whether a config field holds a file-system path (so `~` in it means the home folder)."""
    return name in _PATH_NAMES or name.endswith(_PATH_SUFFIXES)


def expand_user_paths(node: Any) -> None:
    """`~` -> the home folder in every path field of a config dataclass tree (in place)."""
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if dataclasses.is_dataclass(value):
            expand_user_paths(value)
        elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                expand_user_paths(item)
        elif is_path_field(f.name) and isinstance(value, str):
            setattr(node, f.name, os.path.expanduser(value))
        elif is_path_field(f.name) and isinstance(value, list):
            setattr(node, f.name, [os.path.expanduser(v) if isinstance(v, str) else v for v in value])


def check_paths(config: PPOTrainerConfig) -> list[str]:
    """One message per path that does not lead to what the run will read."""
    return [*_half_embedded_default(config), *_model_problems(config), *_data_problems(config), *_file_problems(config)]


def _half_embedded_default(config: PPOTrainerConfig) -> list[str]:
    """A model without data, or data without a model: the embedded default stands in for both or for neither."""
    model, files = config.actor_rollout_ref.model.path, config.data.train_files
    if (model is None) == (files is None):
        return []
    missing = "data.train_files" if files is None else "actor_rollout_ref.model.path"
    given = "actor_rollout_ref.model.path" if files is None else "data.train_files"
    return [
        f"{missing} is not set, but {given} is: the embedded default (tiny model + synthetic task) stands in "
        f"for both or for neither. Fix: set {missing} too, or leave out both."
    ]


def _model_problems(config: PPOTrainerConfig) -> list[str]:
    model, critic, reward = config.actor_rollout_ref.model, config.critic.model, config.reward_model
    folders = [
        ("actor_rollout_ref.model.path", model.path),
        ("actor_rollout_ref.model.tokenizer_path", model.tokenizer_path),
        ("data.tokenizer", config.data.tokenizer),
    ]
    if config.use_critic and critic.path != model.path:  # the actor's folder is checked once, under its own key
        folders.append(("critic.model.path", critic.path))
    if config.use_critic and critic.tokenizer_path not in (model.path, critic.path):
        folders.append(("critic.model.tokenizer_path", critic.tokenizer_path))
    if reward.enable:
        folders.append(("reward_model.model.path", reward.model.path))
    if config.distillation.enabled:
        folders.append(("distillation.teacher_models.teacher_model.model_path", config.distillation.teacher_path))
    problems = []
    for key, path in folders:
        if path is None:
            continue
        check = check_local_tokenizer_folder if "tokenizer" in key else check_local_model_folder
        try:
            check(path, key)
        except ValueError as err:
            problems.append(str(err))
    return problems


def _file_list(files: str | list[str] | None) -> list[str]:
    return [] if files is None else [files] if isinstance(files, str) else list(files)


def _data_problems(config: PPOTrainerConfig) -> list[str]:
    data = config.data
    problems, train_rows = [], 0
    for key, files in [("data.train_files", data.train_files), ("data.val_files", data.val_files)]:
        for path in _file_list(files):
            if not os.path.isfile(path):
                problems.append(
                    f"{key}: {path!r} is not a file. Fix: point {key} at existing .parquet (or .jsonl) files, "
                    "e.g. the ones `hyflow prepare-data` writes."
                )
            elif key == "data.train_files":
                train_rows += count_rows(path)
    if problems or data.train_files is None:
        return problems
    if data.train_max_samples > 0:
        train_rows = min(train_rows, data.train_max_samples)
    if train_rows < data.train_batch_size:
        problems.append(
            f"data.train_batch_size={data.train_batch_size} is more than the {train_rows} training rows of "
            f"data.train_files (after data.train_max_samples={data.train_max_samples}), so not one full batch can "
            f"be drawn. Fix: set data.train_batch_size to at most {train_rows}, or add training data."
        )
    return problems


def count_rows(path: str) -> int:
    """Rows of a parquet file (from its footer) or of a JSON-lines file (its non-empty lines)."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _file_problems(config: PPOTrainerConfig) -> list[str]:
    rollout = config.actor_rollout_ref.rollout
    files = [
        ("custom_reward_function.path", config.custom_reward_function.path),
        (f"{_ROLLOUT}.multi_turn.tool_config_path", rollout.multi_turn.tool_config_path),
        (f"{_ROLLOUT}.multi_turn.interaction_config_path", rollout.multi_turn.interaction_config_path),
        (f"{_ROLLOUT}.multi_turn.function_tool_path", rollout.multi_turn.function_tool_path),
        (f"{_ROLLOUT}.agent.agent_loop_config_path", rollout.agent.agent_loop_config_path),
        *(
            (f"reward_model.reward_functions[{i}].path", function.path)
            for i, function in enumerate(config.reward_model.reward_functions)
        ),
    ]
    return [
        f"{key}={path!r} is not a file. Fix: point {key} at an existing local file."
        for key, path in files
        if path and not os.path.isfile(path)
    ]
