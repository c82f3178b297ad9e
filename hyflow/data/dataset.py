"""`RLHFDataset`: RL prompts from parquet files in the verl schema, chat-templated and left-padded.

    dataset = RLHFDataset(config.data.train_files, tokenizer, config.data, max_samples=config.data.train_max_samples)
    loader = build_dataloader(dataset, config.data, train=True)      # hyflow.data.sampler: resumable
    batch = next(iter(loader))            # dict -> DataProto.from_single_dict(batch)

Everything is checked and tokenized when the dataset is built, so a malformed row or an over-long prompt (with
`truncation="error"`) stops the run before any compute is spent. Over-long prompts are dropped when
`filter_overlong_prompts` is set (the count is logged), otherwise truncated left, right or in the middle. Rows whose
prompt has no text (every user message's content "" or blank, and no image or video) are named in one warning per
file: they load, but the model would learn from the chat template alone.

Shapes of one item: input_ids, attention_mask, position_ids are (P,) with P = `max_prompt_length`, left-padded.

With a `processor` (a vision-language model's, `hyflow.models.processor.load_processor`), rows may carry images
(`data.image_key`, verl's schema, see `hyflow.data.multimodal`): the prompt ids then hold each image's pad tokens
(so `max_prompt_length` counts them), position_ids are Qwen2-VL's M-RoPE rows (3, P), and each item adds
`multi_modal_data` ({"image": [PIL images]}, plus "video": [[frames]] with `data.video_key`) and
`multi_modal_inputs` (pixel_values, image_grid_thw; pixel_values_videos, video_grid_thw).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from hyflow import fields as F
from hyflow.config.data import DataConfig
from hyflow.data.multimodal import process_prompt, row_images, row_position_ids, to_content_parts
from hyflow.data.schema import RowError, check_row, row_tools
from hyflow.data.utf8 import invalid_utf8_in_table, read_jsonl_rows
from hyflow.data.video import row_videos

logger = logging.getLogger(__name__)

_TRUNCATION_MODES = ("error", "left", "right", "middle")


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of one data file (parquet, or JSON lines) as plain Python dicts and lists."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"data file {path!r} does not exist; check data.train_files / data.val_files.")
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        try:
            rows = table.to_pylist()
        except UnicodeDecodeError as err:
            raise invalid_utf8_in_table(table, path) from err
    elif path.endswith(".jsonl"):
        rows = read_jsonl_rows(path)
    else:
        raise ValueError(f"data file {path!r}: use a .parquet (or .jsonl) file in the verl schema.")
    if not rows:
        raise ValueError(f"data file {path!r} is empty; it needs at least one row.")
    return rows


def truncate_ids(ids: list[int], max_length: int, mode: str) -> list[int]:
    """Cut `ids` to `max_length`: keep the end (`left`), the start (`right`) or both ends (`middle`)."""
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        return ids[:head] + ids[len(ids) - (max_length - head) :]
    raise ValueError(f"data.truncation={mode!r} is not a truncation mode; use one of {list(_TRUNCATION_MODES)}.")


def left_pad(ids: list[int], length: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, position_ids), each (length,), with `ids` right-aligned after padding."""
    num_pad = length - len(ids)
    input_ids = torch.tensor([pad_token_id] * num_pad + ids, dtype=torch.long)
    attention_mask = torch.tensor([0] * num_pad + [1] * len(ids), dtype=torch.long)
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)
    return input_ids, attention_mask, position_ids


def blank_prompt(messages: Any) -> bool:
    """True when a prompt has no text to answer: its user messages (all messages when none is a user's) hold only
    empty or blank content."""
    if not isinstance(messages, list):
        return False
    user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return not any(isinstance(m, dict) and str(m.get("content") or "").strip() for m in user or messages)


def _drop_none(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """Top-level entries that are not None: parquet gives every row the union of all rows' struct keys, filling
    the ones a row lacks (e.g. a tool it does not use) with None."""
    return {key: value for key, value in (kwargs or {}).items() if value is not None}


class RLHFDataset(Dataset):
    """Prompts of one or more files, validated, chat-templated and tokenized up front.

    `data_files`: a path or a list of paths. `max_samples` > 0 keeps only the first that many rows (after
    filtering). `processor`: a vision-language processor for rows with images (None: text only).
    """

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: Any,
        config: DataConfig,
        processor: Any = None,
        max_samples: int = -1,
    ) -> None:
        if config.truncation not in _TRUNCATION_MODES:
            raise ValueError(
                f"data.truncation={config.truncation!r} is not allowed; use one of {list(_TRUNCATION_MODES)}."
            )
        if tokenizer.pad_token_id is None:
            raise ValueError("RLHFDataset: the tokenizer has no pad token; set tokenizer.pad_token before training.")
        self.tokenizer = tokenizer
        self.processor = processor
        self.config = config
        self.data_files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        if not self.data_files:
            raise ValueError("RLHFDataset: no data files given; set data.train_files / data.val_files.")
        self.rows: list[dict[str, Any]] = []
        self.prompt_ids: list[list[int]] = []
        for path in self.data_files:
            self._load_file(os.fspath(path))
        if max_samples is not None and 0 < max_samples < len(self.rows):
            self.rows, self.prompt_ids = self.rows[:max_samples], self.prompt_ids[:max_samples]
        if not self.rows:
            raise ValueError(
                f"RLHFDataset: no rows left from {self.data_files} (all prompts were longer than "
                f"data.max_prompt_length={config.max_prompt_length}); raise it, or set "
                "data.filter_overlong_prompts=False and pick a data.truncation mode."
            )
        logger.info("RLHFDataset: %d prompts from %d file(s)", len(self.rows), len(self.data_files))

    def _load_file(self, path: str) -> None:
        config = self.config
        rows = read_rows(path)
        for index, row in enumerate(rows):
            check_row(row, f"data file {path!r}", index, config.prompt_key, config.reward_fn_key)
        self._warn_blank_prompts(rows, path)
        ids = [self._tokenize_prompt(row, path, index) for index, row in enumerate(rows)]
        limit = config.max_prompt_length
        if config.filter_overlong_prompts:
            kept = [i for i, prompt in enumerate(ids) if len(prompt) <= limit]
            if len(kept) < len(rows):
                logger.warning(
                    "%s: dropped %d of %d prompts longer than data.max_prompt_length=%d",
                    path,
                    len(rows) - len(kept),
                    len(rows),
                    limit,
                )
            rows, ids = [rows[i] for i in kept], [ids[i] for i in kept]
        elif config.truncation == "error":
            for index, prompt in enumerate(ids):
                if len(prompt) > limit:
                    raise ValueError(
                        f"data file {path!r}, row {index}, column {config.prompt_key!r}: the prompt has {len(prompt)} "
                        f"tokens, more than data.max_prompt_length={limit}. Raise max_prompt_length, set "
                        "data.filter_overlong_prompts=True, or data.truncation to 'left', 'right' or 'middle'."
                    )
        elif self.processor is not None and any(len(prompt) > limit for prompt in ids):
            raise ValueError(
                f"data file {path!r}: prompts with images longer than data.max_prompt_length={limit} cannot be "
                "truncated (a cut would split an image's tokens); raise max_prompt_length or set "
                "data.filter_overlong_prompts=True."
            )
        else:
            ids = [truncate_ids(prompt, limit, config.truncation) for prompt in ids]
        self.rows.extend(rows)
        self.prompt_ids.extend(ids)

    def _warn_blank_prompts(self, rows: list[dict[str, Any]], path: str) -> None:
        """One warning naming the rows of `path` whose prompt has no text (`blank_prompt`) and no image or video."""
        media = (self.config.image_key, self.config.video_key)
        blank = [
            index for index, row in enumerate(rows)
            if blank_prompt(row[self.config.prompt_key]) and not any(row.get(key) for key in media if key)
        ]  # fmt: skip
        if blank:
            shown = ", ".join(map(str, blank[:10])) + (f" and {len(blank) - 10} more" if len(blank) > 10 else "")
            logger.warning(
                "data file %r, column %r: %d of %d prompts have no text (rows %s): the model would be trained on "
                "the chat template alone for them. Fill in the messages' content or remove those rows.",
                path, self.config.prompt_key, len(blank), len(rows), shown,
            )  # fmt: skip

    def render_prompt(self, row: dict[str, Any], source: str = "row", index: int = 0) -> str:
        """The row's chat messages through the tokenizer's chat template, ending with the generation prompt."""
        kwargs = {"add_generation_prompt": True, **self.config.apply_chat_template_kwargs, "tokenize": False}
        tools = row_tools(row, source, index)
        if tools is not None:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(row[self.config.prompt_key], **kwargs)

    def _multimodal_prompt(self, row: dict[str, Any], source: str, index: int) -> tuple[list[int], dict, dict]:
        """(ids, multi_modal_data, multi_modal_inputs) of a row through the processor; decodes its images."""
        error = RowError(source, index)
        images = row_images(row, self.config.image_key, error)
        videos = row_videos(row, self.config.video_key, error)
        key = self.config.prompt_key
        messages = to_content_parts(row[key], len(images), error, key, len(videos))
        text = self.render_prompt({**row, key: messages}, source, index)
        ids, multi_modal_inputs = process_prompt(self.processor, text, images, videos)
        multi_modal_data = {"image": images, **({"video": videos} if videos else {})}
        return ids, multi_modal_data, multi_modal_inputs

    def _tokenize_prompt(self, row: dict[str, Any], path: str, index: int) -> list[int]:
        if self.processor is not None:
            return self._multimodal_prompt(row, f"data file {path!r}", index)[0]
        text = self.render_prompt(row, f"data file {path!r}", index)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            raise ValueError(
                f"data file {path!r}, row {index}, column {self.config.prompt_key!r}: the prompt tokenizes to no "
                f"tokens with the tokenizer {name!r}. Check that the tokenizer matches the data (a tokenizer "
                "saved beside a model may load as the model's own tokenizer class: point "
                "actor_rollout_ref.model.tokenizer_path at its folder), or set a chat template that renders it."
            )
        return ids

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, item: int) -> dict[str, Any]:
        row, ids = self.rows[item], self.prompt_ids[item]
        input_ids, attention_mask, position_ids = left_pad(
            ids, self.config.max_prompt_length, self.tokenizer.pad_token_id
        )
        extra_info = row.get(F.EXTRA_INFO) or {}
        row_index = extra_info.get("index")
        sample = {
            F.INPUT_IDS: input_ids,
            F.ATTENTION_MASK: attention_mask,
            F.POSITION_IDS: position_ids,
            F.RAW_PROMPT_IDS: ids,
            F.DATA_SOURCE: row[self.config.reward_fn_key],
            F.ABILITY: row.get(F.ABILITY) or "",
            F.REWARD_MODEL: row[F.REWARD_MODEL],
            F.EXTRA_INFO: extra_info,
            F.AGENT_NAME: row.get(F.AGENT_NAME) or None,  # None: rollout.agent.default_agent_loop
            F.INDEX: row_index if row_index is not None else item,
            F.TOOLS_KWARGS: _drop_none(extra_info.get("tools_kwargs")),
            F.INTERACTION_KWARGS: _drop_none(extra_info.get("interaction_kwargs")),
        }
        if self.config.return_raw_chat:
            sample[F.RAW_PROMPT] = row[self.config.prompt_key]
        if self.processor is not None:
            self._add_multimodal(sample, row, item)
        return sample

    def _add_multimodal(self, sample: dict[str, Any], row: dict[str, Any], item: int) -> None:
        """The item's images for generation and training, and its M-RoPE position ids (3, P)."""
        _, multi_modal_data, multi_modal_inputs = self._multimodal_prompt(row, "dataset", item)
        sample[F.MULTI_MODAL_DATA] = multi_modal_data
        sample[F.MULTI_MODAL_INPUTS] = multi_modal_inputs
        sample[F.POSITION_IDS] = row_position_ids(
            self.processor, sample[F.INPUT_IDS], sample[F.ATTENTION_MASK], multi_modal_inputs
        )
