"""Cutting a per-device batch into mini-batches (one optimizer step each) and micro-batches (one forward each).

    mini_batches = split_mini_batches(batch, mini_batch_size, shuffle=True, generator=g)
    micro_batches, order = split_micro_batches(mini, micro_batch_size=4)                    # fixed size
    micro_batches, order = split_micro_batches(mini, max_token_len=4096, group=process_group)  # token budget

With a token budget (`use_dynamic_bsz`), sequences are packed into micro-batches whose summed valid-token counts
(`attention_mask.sum()`) stay within `max_token_len`, longest first into the least-filled micro-batch. Every rank
uses the same number of micro-batches (the maximum over ranks, found with one all-reduce), because each forward
and backward under FSDP is a collective that all ranks must join. `order` lists, per micro-batch, which rows of
the input it holds, so outputs can be put back in input order with `restore_order`.
"""

from __future__ import annotations

import heapq
import math

import torch
import torch.distributed as dist
from tensordict import NonTensorData, NonTensorStack, TensorDict

from hyflow import fields as F
from hyflow.protocol import DataProto


def split_mini_batches(
    batch: TensorDict, mini_batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None
) -> list[TensorDict]:
    """Split into mini-batches of `mini_batch_size` rows (optionally after a seeded shuffle)."""
    size = batch.batch_size[0]
    if mini_batch_size <= 0 or size % mini_batch_size:
        raise ValueError(
            f"ppo_mini_batch_size: this device holds {size} rows, which is not a multiple of its mini-batch size "
            f"{mini_batch_size} (ppo_mini_batch_size × rollout.n / number of devices). Make "
            "data.train_batch_size a multiple of ppo_mini_batch_size, and ppo_mini_batch_size × rollout.n a multiple "
            "of the number of devices."
        )
    if shuffle:
        batch = batch[torch.randperm(size, generator=generator)]
    return list(batch.split(mini_batch_size))


def _balanced_bins(lengths: list[int], num_bins: int) -> list[list[int]]:
    """Longest-processing-time packing: each row (longest first) goes to the bin with the fewest tokens so far."""
    heap = [(0, b) for b in range(num_bins)]
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, b = heapq.heappop(heap)
        bins[b].append(row)
        heapq.heappush(heap, (load + lengths[row], b))
    return [sorted(rows) for rows in bins]


def _fits(lengths: list[int], bins: list[list[int]], max_token_len: int) -> bool:
    return all(sum(lengths[i] for i in rows) <= max_token_len for rows in bins)


def token_budget_bins(
    lengths: list[int], max_token_len: int, group: dist.ProcessGroup | None = None
) -> list[list[int]]:
    """Row indices per micro-batch so each holds at most `max_token_len` tokens; same count on every rank."""
    longest = max(lengths)
    if longest > max_token_len:
        raise ValueError(
            f"ppo_max_token_len_per_gpu={max_token_len} is smaller than one sequence of this batch ({longest} "
            "tokens); the token budget must hold the longest prompt + response. Raise it to at least "
            "data.max_prompt_length + data.max_response_length."
        )
    num_bins = max(1, math.ceil(sum(lengths) / max_token_len))
    while num_bins < len(lengths) and not _fits(lengths, _balanced_bins(lengths, num_bins), max_token_len):
        num_bins += 1
    if dist.is_available() and dist.is_initialized():
        count = torch.tensor([num_bins], dtype=torch.int64)
        if dist.get_backend(group) == "nccl":
            count = count.cuda()
        dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)  # sync: all ranks agree on the count
        num_bins = min(int(count.item()), len(lengths))
    return _balanced_bins(lengths, num_bins)


def split_micro_batches(
    batch: TensorDict,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[list[TensorDict], list[list[int]]]:
    """Micro-batches by a fixed row count, or (when `max_token_len` is given) by a token budget.

    Fixed-size micro-batches take the rows longest first, so each holds rows of similar length and
    `trim_padding` can cut more columns. Returns the micro-batches and, for each, the row indices of `batch` it
    holds (the order of rows inside a mini-batch does not change its loss, which is normalised globally).
    """
    size = batch.batch_size[0]
    lengths = [int(n) for n in batch[F.ATTENTION_MASK].sum(dim=-1).tolist()]  # host data: no device sync
    if max_token_len is not None:
        bins = token_budget_bins(lengths, max_token_len, group)
    else:
        step = size if micro_batch_size is None else micro_batch_size
        if step <= 0:
            raise ValueError(f"micro_batch_size_per_gpu={step} must be a positive number of rows.")
        longest_first = sorted(range(size), key=lambda row: (-lengths[row], row))
        bins = [sorted(longest_first[start : start + step]) for start in range(0, size, step)]
    micro_batches = [batch[torch.tensor(rows, dtype=torch.long)] for rows in bins]
    return micro_batches, bins


def restore_order(outputs: list[torch.Tensor], bins: list[list[int]]) -> torch.Tensor:
    """Concatenate per-micro-batch outputs and put the rows back in the order of the original batch."""
    merged = torch.cat(outputs, dim=0)
    order = torch.tensor([row for rows in bins for row in rows], dtype=torch.long, device=merged.device)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return merged[inverse]


def to_device(data: TensorDict | torch.Tensor, device: torch.device) -> TensorDict | torch.Tensor:
    """Copy host data to the training device without stalling it.

    A copy from pageable host memory waits for all queued GPU work first; from pinned memory with
    `non_blocking=True` it is queued like a kernel, so the next micro-batch's copy does not drain the GPU.
    """
    if device.type != "cuda":
        return data.to(device)
    return data.pin_memory().to(device, non_blocking=True)


def trim_padding(micro: TensorDict, multiple: int = 64) -> TensorDict:
    """Drop the columns that are padding in every row: left of the earliest prompt token, right of the latest
    response token. (B, T) fields lose both sides, (B, R) fields the right side; the results for the kept
    columns are unchanged, and callers pad outputs back to R with zeros. Works on host tensors (no device sync).

    Token columns are the last dimension, so (B, 3, T) M-RoPE position ids are trimmed like (B, T) fields; a
    non-tensor entry (per-row `multi_modal_inputs`) is kept as it is.

    The kept width is rounded up to a multiple of `multiple` columns (where the batch has them), so the attention
    kernels see aligned, recurring shapes instead of a new odd length per micro-batch.
    """
    attention_mask = micro[F.ATTENTION_MASK]
    total_length, response_length = attention_mask.shape[1], micro[F.RESPONSES].shape[1]
    prompt_length = total_length - response_length
    occupied = attention_mask.any(dim=0)
    prompt_columns, response_columns = occupied[:prompt_length].nonzero(), occupied[prompt_length:].nonzero()
    # Keep at least the last prompt position: it predicts the first response token.
    start = min(int(prompt_columns[0, 0]), prompt_length - 1) if prompt_columns.numel() else prompt_length - 1
    keep = int(response_columns[-1, 0]) + 1 if response_columns.numel() else 1
    missing = -(prompt_length + keep - start) % multiple
    grow_right = min(missing, response_length - keep)
    keep, start = keep + grow_right, max(0, start - (missing - grow_right))
    trimmed = {}
    for key, value in micro.items():
        if not isinstance(value, torch.Tensor) or value.dim() < 2:
            trimmed[key] = value
        elif key == F.ROUTED_EXPERTS:  # (B, T, Lm, k): token columns in dimension 1
            trimmed[key] = value[:, start : prompt_length + keep]
        elif value.shape[-1] == total_length:
            trimmed[key] = value[..., start : prompt_length + keep]
        elif value.shape[-1] == response_length:
            trimmed[key] = value[..., :keep]
        else:
            trimmed[key] = value
    return TensorDict(trimmed, batch_size=micro.batch_size)


def select_model_inputs(data: DataProto, keys: tuple[str, ...] | list[str]) -> TensorDict:
    """The batch's tensors `keys`, plus the per-row `multi_modal_inputs` (a non-tensor stack) when the rows have
    them, so every split, shuffle and token-budget bin of the rows carries their images along."""
    batch = data.batch.select(*keys)
    rows = data.non_tensor_batch.get(F.MULTI_MODAL_INPUTS)
    if rows is not None:
        batch[F.MULTI_MODAL_INPUTS] = NonTensorStack(*(NonTensorData(dict(row)) for row in rows))
    return batch


def multi_modal_rows(micro: TensorDict) -> list[dict[str, torch.Tensor]] | None:
    """The per-row `multi_modal_inputs` that `select_model_inputs` put into a (micro-)batch, or None."""
    if F.MULTI_MODAL_INPUTS not in micro.keys():  # noqa: SIM118 (TensorDict membership)
        return None
    return list(micro[F.MULTI_MODAL_INPUTS])


def pad_responses(values: torch.Tensor, response_length: int) -> torch.Tensor:
    """Right-pad a (B, r) output of a trimmed micro-batch back to (B, R) with zeros."""
    return torch.nn.functional.pad(values, (0, response_length - values.shape[1]))
