"""`data.*`: which parquet files to read, how prompts are tokenized, batch sizes of the RL loop.

Keys and defaults follow verl's `data` section. `train_files=None` means hyflow's built-in synthetic demo task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

TruncationMode = Literal["error", "left", "right", "middle"]


@dataclass
class DataConfig:
    """The prompt dataset (verl parquet schema) and the per-step batch of prompts."""

    tokenizer: str | None = None  # None: the actor model's tokenizer
    train_files: str | list[str] | None = None
    val_files: str | list[str] | None = None
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"  # column that picks the scorer
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024  # prompts per RL step (each sampled rollout.n times)
    val_batch_size: int | None = None  # None: the whole validation set in one batch
    return_raw_input_ids: bool = False
    return_raw_chat: bool = False  # keep the chat messages (agent loops need them)
    return_full_prompt: bool = False
    shuffle: bool = True
    validation_shuffle: bool = False
    seed: int = 1  # seed of the training sampler
    dataloader_num_workers: int = 0
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = 1
    truncation: TruncationMode = "error"  # what to do with a prompt longer than max_prompt_length
    trust_remote_code: bool = False
    train_max_samples: int = -1  # -1: all rows
    val_max_samples: int = -1
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    image_key: str = "images"  # column of each row's images (verl's multimodal schema)
    video_key: str = "videos"  # column of each row's videos: lists of frames or GIF / animated WebP files
    min_pixels: int | None = None  # fewest pixels per image after the processor's resize; None: the processor's own
    max_pixels: int | None = None  # most pixels per image after the processor's resize; None: the processor's own
