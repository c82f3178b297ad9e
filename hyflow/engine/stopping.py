"""When a sequence stops: its end-of-sequence ids, stop tokens, stop strings and length limits (one owner for the
engine's stop conditions)."""

from __future__ import annotations

from typing import Any

from torch import nn

from hyflow.engine.config import SamplingParams
from hyflow.engine.sequence import FinishReason, Sequence


def eos_token_ids(model: str | nn.Module, hf_config: Any, tokenizer: Any) -> set[int]:
    """End-of-sequence ids from the model config, its generation config and the tokenizer."""
    if isinstance(model, nn.Module):
        generation_config = getattr(model, "generation_config", None)
    else:
        from transformers import GenerationConfig

        try:
            generation_config = GenerationConfig.from_pretrained(model)
        except OSError:  # the folder has no generation_config.json
            generation_config = None
    ids: set[int] = set()
    for source in (hf_config, generation_config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return ids


def stop_token_ids(params: SamplingParams, eos_ids: set[int]) -> frozenset[int]:
    """The token ids that end a sequence sampled with `params`: its stop tokens, and the EOS ids unless `ignore_eos`
    (what `finish_reason` checks, as one set a window's rows test at once)."""
    return frozenset(params.stop_token_ids) if params.ignore_eos else frozenset(eos_ids).union(params.stop_token_ids)


def finish_reason(seq: Sequence, eos_ids: set[int], max_model_len: int, tokenizer: Any) -> FinishReason | None:
    """ "stop" after an EOS (unless `ignore_eos`), a stop token or a stop string; "length" at `max_tokens` or the
    context limit; None while the sequence goes on."""
    token, params = seq.token_ids[-1], seq.params
    if (not params.ignore_eos and token in eos_ids) or token in params.stop_token_ids:
        return "stop"
    if params.stop and hits_stop_string(seq, tokenizer):
        return "stop"
    if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= max_model_len:
        return "length"
    return None


def hits_stop_string(seq: Sequence, tokenizer: Any) -> bool:
    """Whether the text of the last few tokens (enough to hold the longest stop string even at one byte per token,
    4 per character) contains a stop string."""
    longest = max(len(s) for s in seq.params.stop)
    tail = tokenizer.decode(seq.output_token_ids[-(4 * longest + 2) :], skip_special_tokens=False)
    return any(stop in tail for stop in seq.params.stop)
