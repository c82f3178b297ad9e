"""What a request must satisfy before the engine admits it: a new id, a non-empty prompt of known token ids that
leaves room to generate, a tokenizer for stop strings, and a KV cache large enough to hold it whole."""

from __future__ import annotations

from collections.abc import Container

from hyflow.engine.config import SamplingParams

__all__ = ["check_request"]


def check_request(
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
    *,
    running: Container[str],
    max_model_len: int,
    vocab_size: int,
    block_size: int,
    num_blocks: int,
    has_tokenizer: bool,
) -> None:
    """ValueError naming the request, the rule and the fix when `prompt` / `params` cannot be served.

    A request needs ceil(min(len(prompt) + max_tokens, max_model_len) / block_size) KV blocks at most."""
    if request_id in running:
        raise ValueError(f"request_id {request_id!r} is already running; use a unique id per request")
    if len(prompt) == 0:
        raise ValueError(f"request {request_id!r}: the prompt is empty; give at least one token id")
    if len(prompt) >= max_model_len:
        raise ValueError(
            f"request {request_id!r}: the prompt has {len(prompt)} tokens, but max_model_len is "
            f"{max_model_len} and at least one must be generated; shorten the prompt"
        )
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise ValueError(
            f"request {request_id!r}: token ids must be in [0, {vocab_size}); got min {min(prompt)}, max {max(prompt)}"
        )
    if params.stop and not has_tokenizer:
        raise ValueError(
            f"request {request_id!r}: stop strings {params.stop} need a tokenizer; pass one to the "
            "engine or use stop_token_ids"
        )
    needed = -(-min(len(prompt) + params.max_tokens, max_model_len) // block_size)
    if needed > num_blocks:
        raise ValueError(
            f"request {request_id!r} needs {needed} KV blocks but the cache has only "
            f"{num_blocks}; lower max_tokens or give the KV cache more memory"
        )
