"""DataProto in and out of a rollout: unpadded prompts from a left-padded batch, and responses packed back into the
layout the actor expects. Shared by the engine rollout and the `transformers.generate` fallback.

In:  input_ids, attention_mask, position_ids (B, P) (or (B, 3, P), a VLM's M-RoPE rows), prompts left-padded.
Out: prompts (B, P); responses, response_mask, rollout_log_probs (B, R), right-padded to R = response_length;
     input_ids, attention_mask, position_ids (B, P + R); non-tensor finish_reason (B,). With the engine's per-token
     policy versions also rollout_policy_versions (B, R) (-1 on padding) and non-tensor rollout_policy_version_min
     / _max (B,) (-1 for a row without tokens). With the engine's routing records (routing replay R3) also
     routed_experts (B, P + R, Lm, k), "no record" on padding and on each row's last token (`routing_rows`).
"""

from __future__ import annotations

import numpy as np
import torch

from hyflow import fields as F
from hyflow.engine.routing_cache import no_record_value
from hyflow.protocol import DataProto
from hyflow.rollout.policy_versions import version_range


def unpadded_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real tokens of each left-padded prompt row."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids.cpu(), attention_mask.cpu())]


def pack_responses(
    prompt_batch: DataProto,
    responses: list[list[int]],
    log_probs: list[list[float]],
    finish_reasons: list[str],
    response_length: int,
    pad_token_id: int,
    policy_versions: list[list[int]] | None = None,
    routed_experts: list[torch.Tensor | None] | None = None,
) -> DataProto:
    """The rollout output for `prompt_batch` (which keeps its non-tensor fields and meta_info); `policy_versions`:
    per row, the policy version that sampled each token (the engine's), None where nothing tracked them;
    `routed_experts`: per row, the engine's routing record of prompt and response (None: no routing replay)."""
    prompts = prompt_batch.batch[F.INPUT_IDS]
    prompt_mask = prompt_batch.batch[F.ATTENTION_MASK]
    prompt_positions = prompt_batch.batch[F.POSITION_IDS]
    batch_size, device = prompts.shape[0], prompts.device
    response_ids = torch.full((batch_size, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(batch_size, response_length, dtype=torch.long)
    response_log_probs = torch.zeros(batch_size, response_length, dtype=torch.float32)
    for i, (tokens, lps) in enumerate(zip(responses, log_probs)):
        tokens, lps = tokens[:response_length], lps[:response_length]
        response_ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_mask[i, : len(tokens)] = 1
        response_log_probs[i, : len(lps)] = torch.tensor(lps, dtype=torch.float32)
    response_ids, response_mask = response_ids.to(device), response_mask.to(device)
    steps = torch.arange(1, response_length + 1, device=device).unsqueeze(0)
    response_positions = prompt_positions[..., -1:] + steps  # (B, R), or (B, 3, R) for M-RoPE (text: all rows +1)

    tensors = {
        F.PROMPTS: prompts,
        F.RESPONSES: response_ids,
        F.RESPONSE_MASK: response_mask,
        F.ROLLOUT_LOG_PROBS: response_log_probs.to(device),
        F.INPUT_IDS: torch.cat([prompts, response_ids], dim=1),
        F.ATTENTION_MASK: torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1),
        F.POSITION_IDS: torch.cat([prompt_positions, response_positions], dim=-1),
    }
    non_tensors = dict(prompt_batch.non_tensor_batch)
    non_tensors[F.FINISH_REASON] = np.array(finish_reasons, dtype=object)
    if policy_versions is not None:
        versions = torch.full((batch_size, response_length), -1, dtype=torch.long)
        for i, row in enumerate(policy_versions):
            row = row[:response_length]
            versions[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        tensors[F.ROLLOUT_POLICY_VERSIONS] = versions.to(device)
        non_tensors.update(version_range(versions))
    if routed_experts is not None:
        prompt_lengths = prompt_mask.sum(-1).tolist()
        total = prompts.shape[1] + response_length
        tensors[F.ROUTED_EXPERTS] = routing_rows(routed_experts, prompt_lengths, prompts.shape[1], total).to(device)
    return DataProto.from_dict(tensors, non_tensors, dict(prompt_batch.meta_info))


def routing_rows(
    records: list[torch.Tensor | None], prompt_lengths: list[int], prompt_length: int, total_length: int
) -> torch.Tensor:
    """`routed_experts` (B, total_length, Lm, k) of rows whose prompts are left-padded to `prompt_length`: row i's
    record (one row per token from its first prompt token on, hyflow/engine/routing_cache.py) placed from column
    prompt_length - prompt_lengths[i], cut at `total_length`. "No record" elsewhere: padding, and each sequence's
    last token, which the engine never fed through the model (the trainer routes it itself; it predicts nothing
    that is scored). Rows without a record (None) have none at all."""
    first = next((record for record in records if record is not None), None)
    shape, dtype = (first.shape[1:], first.dtype) if first is not None else ((1, 1), torch.uint8)
    rows = torch.full((len(records), total_length, *shape), no_record_value(dtype), dtype=dtype)
    for i, (record, length) in enumerate(zip(records, prompt_lengths)):
        if record is None:
            continue
        start = prompt_length - length
        count = min(len(record), total_length - start)
        rows[i, start : start + count] = record[:count]
    return rows
