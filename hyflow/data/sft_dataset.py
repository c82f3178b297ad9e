"""`SFTDataset`: chat conversations from parquet, tokenised with the chat template, loss only on assistant tokens.

    dataset = SFTDataset("train.parquet", tokenizer, config.data)            # config.data: SFTDataConfig
    loader = DataLoader(dataset, batch_size=4, collate_fn=partial(collate_sft, pad_token_id=tokenizer.pad_token_id))
    batch = next(iter(loader))    # input_ids, attention_mask, position_ids, loss_mask: (B, L), right-padded

A row holds `data.messages_key` (a list of `{"role", "content"}` messages, multi-turn, with `tool_calls` on
assistant turns and `tool` turns allowed) and optionally `data.tools_key` (OpenAI function schemas rendered by the
template). With `data.response_key` set (e.g. `extra_info.answer`), a row of the RL schema is read as its prompt
messages plus one assistant turn holding that response, so `hyflow prepare-data` output trains directly.

How the loss mask is built, exactly for any chat template: the conversation is rendered prefix by prefix. For
message i, the text that `messages[:i+1]` adds to `messages[:i]` is that turn; for an assistant turn the part up to
`messages[:i]` rendered with the generation prompt is the header (not trained) and the rest is what the model must
write (trained), up to and including its end-of-turn (eos) token; template text after that (a newline) is not.
Each piece is tokenised on its own and the pieces are concatenated, exactly as generation sees a prompt and then
its own tokens. A template whose render of a prefix is not a prefix of the longer render (one that rewrites
earlier turns) is reported as an error naming the row.

With a `processor` (a vision-language model's), rows may carry images (`data.image_key`, "<image>" placeholders in
the messages, as in `hyflow.data.multimodal`): each image's pad token is expanded to its token count (never
trained), the item adds `multi_modal_inputs` (pixel_values, image_grid_thw) and position_ids (3, L), the M-RoPE
rows; `max_length` counts the image tokens.

Shapes of one item: (L,) with L the conversation's own length (at most `data.max_length`); `collate_sft` pads a
batch to its longest item. `loss_mask[t] = 1` means token t is an assistant token: its prediction from the tokens
before it is in the loss.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from hyflow import fields as F
from hyflow.config.sft import SFTDataConfig
from hyflow.data.dataset import read_rows
from hyflow.data.multimodal import (
    expand_vision_pads,
    image_features,
    row_images,
    row_position_ids,
    to_content_parts,
)
from hyflow.data.schema import RowError, check_messages, row_tools
from hyflow.data.video import row_videos, video_features

logger = logging.getLogger(__name__)

LOSS_MASK = "loss_mask"  # (B, L) int64: 1 = assistant token, trained; SFT batches only (never in a DataProto)
SFT_KEYS = (F.INPUT_IDS, F.ATTENTION_MASK, F.POSITION_IDS, LOSS_MASK)


def _render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, generation: bool, kwargs: dict) -> str:
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=generation, tokenize=False, **{**kwargs, **extra}
    )


def _trim_after_eos(mask: list[int], ids: list[int], eos_token_id: int | None) -> list[int]:
    """Untrain the template's text after the turn's last eos token (e.g. ChatML's newline after <|im_end|>)."""
    if eos_token_id is None or eos_token_id not in ids:
        return mask
    last = len(ids) - 1 - ids[::-1].index(eos_token_id)
    return mask[: last + 1] + [0] * (len(ids) - last - 1)


def tokenize_conversation(
    tokenizer: Any,
    messages: list[dict],
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
    error: RowError | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on assistant tokens) of a conversation; see the module docstring."""
    error = error or RowError("conversation", 0)
    kwargs = dict(template_kwargs or {})
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # the text tokenised so far
    for i, message in enumerate(messages):
        pieces: list[tuple[str, int]] = []
        if message["role"] == "assistant":
            if i == 0:
                raise error("messages", "the conversation starts with an assistant turn", "Start with a user turn.")
            pieces.append((_render(tokenizer, messages[:i], tools, True, kwargs), 0))
        pieces.append(
            (_render(tokenizer, messages[: i + 1], tools, False, kwargs), int(message["role"] == "assistant"))
        )
        for text, trained in pieces:
            if not text.startswith(done):
                raise error(
                    "messages",
                    f"the chat template renders message {i} so that the earlier turns change, so the assistant tokens "
                    "cannot be located exactly",
                    "Use a template that renders each prefix of a conversation as a prefix of the whole (ChatML does).",
                )
            piece_ids = tokenizer.encode(text[len(done) :], add_special_tokens=False)
            piece_mask = [trained] * len(piece_ids)
            if trained:
                piece_mask = _trim_after_eos(piece_mask, piece_ids, tokenizer.eos_token_id)
            ids += piece_ids
            mask += piece_mask
            done = text
    return ids, mask


def _get_path(row: dict[str, Any], dotted: str) -> Any:
    value: Any = row
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


class SFTDataset(Dataset):
    """Conversations of one or more files, validated and tokenised up front (bad rows stop before training)."""

    def __init__(
        self,
        data_files: str | Sequence[str],
        tokenizer: Any,
        config: SFTDataConfig,
        max_samples: int = -1,
        processor: Any = None,
    ) -> None:
        if tokenizer.pad_token_id is None:
            raise ValueError("SFTDataset: the tokenizer has no pad token; set tokenizer.pad_token before training.")
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "SFTDataset: the tokenizer has no chat template, so conversations cannot be rendered. Use an instruct "
                "model's tokenizer or add `chat_template` to its tokenizer_config.json."
            )
        self.tokenizer = tokenizer
        self.config = config
        self.processor = processor
        files = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
        if not files:
            raise ValueError("SFTDataset: no data files given; set data.train_files (and data.val_files).")
        self.examples: list[tuple[list[int], list[int], dict[str, torch.Tensor]]] = []
        for path in files:
            self.examples.extend(self._load_file(os.fspath(path)))
        if 0 < max_samples < len(self.examples):
            self.examples = self.examples[:max_samples]
        if not self.examples:
            raise ValueError(f"SFTDataset: no conversation with an assistant token is left in {files}.")
        num_tokens = sum(sum(mask) for _, mask, _ in self.examples)
        logger.info("SFTDataset: %d conversations, %d assistant tokens, from %s", len(self), num_tokens, files)

    def conversation(self, row: dict[str, Any], error: RowError) -> list[dict]:
        """The row's messages: `messages_key`, or `prompt_key` + one assistant turn from `response_key`."""
        config = self.config
        if config.response_key is None:
            if config.messages_key not in row:
                problem = f"the column is missing (columns: {sorted(row)})"
                fix = "Name it with data.messages_key, or set data.response_key for prompt/response rows."
                raise error(config.messages_key, problem, fix)
            messages = row[config.messages_key]
        else:
            response = _get_path(row, config.response_key)
            if not isinstance(response, str):
                problem = f"data.response_key={config.response_key!r} gives {type(response).__name__}, not a string"
                raise error(config.response_key, problem, "Point data.response_key at the reference response text.")
            messages = [*(row.get(config.prompt_key) or []), {"role": "assistant", "content": response}]
        check_messages(messages, error, config.messages_key if config.response_key is None else config.prompt_key)
        if not any(message["role"] == "assistant" for message in messages):
            raise error(config.messages_key, "the conversation has no assistant turn", "Add the turns to imitate.")
        return [{k: v for k, v in message.items() if v is not None} for message in messages]

    def _tokenize(self, row: dict[str, Any], source: str, index: int) -> tuple[list[int], list[int], dict]:
        """(ids, loss mask, multi_modal_inputs) of one row; images are decoded and their pads expanded."""
        config, error = self.config, RowError(source, index)
        messages = self.conversation(row, error)
        tools = row_tools({"tools": row.get(config.tools_key)}, source, index)
        if self.processor is None:
            ids, mask = tokenize_conversation(self.tokenizer, messages, tools, config.apply_chat_template_kwargs, error)
            return ids, mask, {}
        images = row_images(row, config.image_key, error)
        videos = row_videos(row, config.video_key, error)
        messages = to_content_parts(messages, len(images), error, config.messages_key, len(videos))
        ids, mask = tokenize_conversation(self.tokenizer, messages, tools, config.apply_chat_template_kwargs, error)
        inputs = {**image_features(self.processor, images), **video_features(self.processor, videos)}
        ids, mask = expand_vision_pads(self.processor, ids, mask, inputs)
        return ids, mask, inputs

    def _load_file(self, path: str) -> list[tuple[list[int], list[int], dict]]:
        config, source = self.config, f"data file {path!r}"
        examples, num_dropped = [], 0
        for index, row in enumerate(read_rows(path)):
            error = RowError(source, index)
            ids, mask, inputs = self._tokenize(row, source, index)
            if len(ids) > config.max_length and inputs:
                raise error(
                    config.messages_key,
                    f"the conversation has {len(ids)} tokens with its images, more than data.max_length="
                    f"{config.max_length} (a cut would split an image's tokens)",
                    "Raise data.max_length or lower the images' max_pixels.",
                )
            if len(ids) > config.max_length:
                if config.truncation == "error":
                    raise error(
                        config.messages_key,
                        f"the conversation has {len(ids)} tokens, more than data.max_length={config.max_length}",
                        "Raise data.max_length, or set data.truncation to 'left' (keep the end) or 'right'.",
                    )
                cut = slice(-config.max_length, None) if config.truncation == "left" else slice(config.max_length)
                ids, mask = ids[cut], mask[cut]
            if sum(mask) == 0:
                num_dropped += 1
                continue
            examples.append((ids, mask, inputs))
        if num_dropped:
            logger.warning(
                "%s: dropped %d conversations left without assistant tokens by truncation", path, num_dropped
            )
        return examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, item: int) -> dict[str, Any]:
        ids, mask, inputs = self.examples[item]
        sample: dict[str, Any] = {
            F.INPUT_IDS: torch.tensor(ids, dtype=torch.long),
            LOSS_MASK: torch.tensor(mask, dtype=torch.long),
        }
        if self.processor is not None:
            input_ids = sample[F.INPUT_IDS]
            sample[F.MULTI_MODAL_INPUTS] = inputs
            sample[F.POSITION_IDS] = row_position_ids(self.processor, input_ids, torch.ones_like(input_ids), inputs)
        return sample


def collate_sft(items: list[dict[str, Any]], pad_token_id: int, pad_to_multiple_of: int = 8) -> dict[str, Any]:
    """Right-pad a list of `SFTDataset` items to the longest (rounded up to `pad_to_multiple_of`): (B, L) each;
    items of a vision-language dataset keep their M-RoPE rows, (B, 3, L), and a list of `multi_modal_inputs`."""
    if not items:
        raise ValueError("collate_sft: got an empty list of samples.")
    longest = max(item[F.INPUT_IDS].numel() for item in items)
    length = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(items), length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), length), dtype=torch.long)
    loss_mask = torch.zeros((len(items), length), dtype=torch.long)
    for row, item in enumerate(items):
        n = item[F.INPUT_IDS].numel()
        input_ids[row, :n] = item[F.INPUT_IDS]
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = item[LOSS_MASK]
    position_ids = torch.clamp(torch.cumsum(attention_mask, dim=-1) - 1, min=0)
    batch = {
        F.INPUT_IDS: input_ids,
        F.ATTENTION_MASK: attention_mask,
        F.POSITION_IDS: position_ids,
        LOSS_MASK: loss_mask,
    }
    if F.MULTI_MODAL_INPUTS in items[0]:
        pad = [length - item[F.INPUT_IDS].numel() for item in items]
        batch[F.POSITION_IDS] = torch.stack(
            [torch.nn.functional.pad(i[F.POSITION_IDS], (0, n)) for i, n in zip(items, pad)]
        )
        batch[F.MULTI_MODAL_INPUTS] = [item[F.MULTI_MODAL_INPUTS] for item in items]
    return batch
