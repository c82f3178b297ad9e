"""One sequence being generated: its tokens, cache blocks, sampling state, and why it ended; plus the outputs.

A request with `n` samples becomes `n` sequences that share the request id (and, through the block manager, the
prompt's cache blocks). `num_computed_tokens` counts the tokens whose K/V are in the cache: the next forward step
feeds `token_ids[num_computed_tokens:]`, which is the uncached part of the prompt on a prefill and the last
sampled token on a decode. `policy_versions[i]` is the engine's `policy_version` (the weights) that sampled output
token i; it changes inside one sequence when weights are loaded while it runs (a partial rollout).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Literal

import torch

from hyflow.engine.config import SamplingParams
from hyflow.engine.multimodal import PromptImages

FinishReason = Literal["stop", "length", "abort"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_seq_counter = itertools.count()


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        sample_index: int = 0,
        images: PromptImages | None = None,
    ) -> None:
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.sample_index = sample_index
        self.params = params
        self.seed = seed  # drives this sequence's random numbers (see sampler.py)
        self.token_ids = list(prompt_token_ids)
        self.num_tokens = len(self.token_ids)  # == len(token_ids), kept as a field: read many times per step
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.log_probs: list[float] = []
        self.raw_log_probs: list[float] = []
        self.top_log_probs: list[dict[int, float]] = []  # per output token, when params.top_log_probs
        self.policy_versions: list[int] = []  # per output token: the weights' version that sampled it
        self.images = images  # the prompt's images (multimodal.py), None for a text prompt
        self.stop_token_ids: frozenset[int] = frozenset()  # EOS and stop ids that end it (the engine sets them)
        self.routed_experts: torch.Tensor | None = None  # the routing record, set when it ends (routing_cache.py)

    def __len__(self) -> int:
        return self.num_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    def num_blocks(self, block_size: int) -> int:
        return -(-self.num_tokens // block_size)

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def block_key(self, index: int, block_size: int) -> tuple[int, ...]:
        """What identifies block `index`'s content for prefix sharing: its token ids, then the hashes of the
        images whose pad tokens it holds (every image's pads are the same id)."""
        start = index * block_size
        tokens = tuple(self.token_ids[start : start + block_size])
        return tokens if self.images is None else tokens + self.images.hashes_between(start, start + block_size)

    def append(
        self,
        token_id: int,
        log_prob: float,
        raw_log_prob: float | None,
        top: dict[int, float] | None = None,
        *,
        policy_version: int = 0,
    ) -> None:
        raw = None if raw_log_prob is None else [raw_log_prob]
        self.extend([token_id], [log_prob], raw, None if top is None else [top], policy_version=policy_version)

    def extend(
        self,
        token_ids: list[int],
        log_probs: list[float],
        raw_log_probs: list[float] | None,
        top_log_probs: list[dict[int, float]] | None = None,
        *,
        policy_version: int = 0,
    ) -> None:
        """Appends sampled tokens with their log-probs (and raw log-probs, top alternatives when asked), all sampled
        by the weights of `policy_version`."""
        self.token_ids.extend(token_ids)
        self.policy_versions.extend([policy_version] * len(token_ids))
        self.num_tokens += len(token_ids)
        self.log_probs.extend(log_probs)
        if raw_log_probs is not None:
            self.raw_log_probs.extend(raw_log_probs)
        if top_log_probs is not None:
            self.top_log_probs.extend(top_log_probs)

    def finish(self, reason: FinishReason) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason = reason


@dataclass
class CompletionOutput:
    """One sample of a request: the generated tokens, their log-probs, and why it ended."""

    index: int
    token_ids: list[int]
    log_probs: list[float]  # under the distribution sampled from (after temperature, top-k, top-p)
    finish_reason: FinishReason | None
    raw_log_probs: list[float] | None = None  # under log_softmax(logits), when SamplingParams.raw_log_probs
    text: str | None = None  # when the engine has a tokenizer
    # per token, the SamplingParams.top_log_probs most likely tokens -> log-prob (same distribution as log_probs)
    top_log_probs: list[dict[int, float]] | None = None
    # per token, the engine's policy_version (weights) that sampled it; None where nothing tracks it (hf fallback)
    policy_versions: list[int] | None = None
    # with EngineConfig.record_routing on a MoE model: (num_computed_tokens, num_moe_layers, k) expert ids of every
    # token that went through the model (prompt and response, all but the last sampled token); routing_cache.py
    routed_experts: torch.Tensor | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return all(out.finish_reason is not None for out in self.outputs)
