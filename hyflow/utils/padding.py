"""A padded RL batch as jagged (nested) tensors of its real tokens, and model outputs back to the response block.

verl's new training engine passes micro-batches without padding as `TensorDict`s of jagged nested tensors; these
are its helpers, under its names, on hyflow's packing (`hyflow.models.packing.pack_rows`: which tokens are real,
where each row starts):

    data = left_right_2_no_padding(data)              # input_ids, position_ids: nested rows of real tokens
    log_probs = no_padding_2_padding(output, data)    # (B, R): the model output that predicts each response token
    response_from_nested(output, response_mask)       # the same, as nested rows
    response_to_nested(advantages, response_mask)     # (B, R) padded -> nested rows of each response's length

Shape legend: B = rows, T = P + R (left-padded prompt, right-padded response), N = real tokens in the batch,
r_i / s_i = the response / whole-sequence length of row i. Position p of a packed sequence predicts token p + 1,
so the output for row i's response is the slice [o_i − r_i − 1, o_i − 1) with o_i = s_0 + … + s_i.
Only tokens move: per-token values of the response (old_log_probs, advantages, ...) stay padded (B, R).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from hyflow.models.packing import pack_rows
from hyflow.utils.nested_tensors import nested_tensor_from_tensor_list
from hyflow.utils.tensordict_columns import assign_non_tensor_data, get_non_tensor_data

__all__ = [
    "build_attention_mask_from_nested",
    "embeds_padding_2_no_padding",
    "left_right_2_no_padding",
    "no_padding_2_padding",
    "response_from_nested",
    "response_to_nested",
]

_REQUIRED = ("input_ids", "attention_mask", "response_mask", "position_ids")


def _lengths(nested: torch.Tensor) -> torch.Tensor:
    return nested.offsets().diff()


def left_right_2_no_padding(data: TensorDict) -> TensorDict:
    """`data` (in place) with `input_ids` and `position_ids` as nested rows of the real tokens of the
    (B, T) batch (M-RoPE position ids (B, k, T) become (B, k, *s_i*)), `loss_mask` = `response_mask`, and the
    non-tensor entries `max_seq_len` (T), `max_response_len` (R) and `indices` (N,) into the flattened batch."""
    missing = [key for key in _REQUIRED if key not in data.keys()]  # noqa: SIM118 (keys of nested tds)
    if missing:
        raise ValueError(f"left_right_2_no_padding needs {list(_REQUIRED)}; missing {missing}.")
    input_ids = data.pop("input_ids")
    attention_mask, position_ids = data["attention_mask"], data["position_ids"]
    packed = pack_rows(attention_mask)
    assign_non_tensor_data(data, "max_seq_len", input_ids.shape[1])
    assign_non_tensor_data(data, "max_response_len", data["response_mask"].shape[1])
    assign_non_tensor_data(data, "indices", packed.indices)
    offsets = packed.cu_seqlens.long()
    data["input_ids"] = torch.nested.nested_tensor_from_jagged(packed.gather(input_ids), offsets=offsets)
    if position_ids.dim() == 2:
        data["position_ids"] = torch.nested.nested_tensor_from_jagged(packed.gather(position_ids), offsets=offsets)
    else:
        rows = [position_ids[i][:, attention_mask[i].bool()] for i in range(position_ids.shape[0])]
        data["position_ids"] = nested_tensor_from_tensor_list(rows)
    data["loss_mask"] = data["response_mask"]
    return data


def _prompt_and_response_lengths(data: TensorDict) -> tuple[torch.Tensor, torch.Tensor, int]:
    prompts, responses = data["prompts"], data["responses"]
    if prompts.is_nested:
        response_lengths = _lengths(responses)
        max_response_len = get_non_tensor_data(data, "max_response_len", -1)
        if max_response_len < 0:
            max_response_len = int(response_lengths.max())
        return _lengths(prompts), response_lengths, max_response_len
    attention_mask = data["attention_mask"]
    prompt_len = prompts.shape[1]
    return attention_mask[:, :prompt_len].sum(1), attention_mask[:, prompt_len:].sum(1), responses.shape[1]


def no_padding_2_padding(tensor: torch.Tensor, data: TensorDict) -> torch.Tensor:
    """The (B, R, ...) block of a packed model output (nested, or (N, ...) values) that predicts each response
    token (the slice in the module docstring), zero after each response. `data` holds `prompts` and `responses`
    (nested, or padded with the batch's `attention_mask`)."""
    values = tensor.values() if tensor.is_nested else tensor
    prompt_lengths, response_lengths, max_response_len = _prompt_and_response_lengths(data)
    ends = (prompt_lengths + response_lengths).cumsum(0)
    if int(ends[-1]) != values.shape[0]:
        raise ValueError(
            f"no_padding_2_padding: the output holds {values.shape[0]} tokens, but the prompts and responses of "
            f"`data` hold {int(ends[-1])}; pass the output of the same micro-batch."
        )
    if bool((prompt_lengths == 0).any()):
        raise ValueError("no_padding_2_padding: a row has an empty prompt, so nothing predicts its first token.")
    columns = torch.arange(max_response_len, device=values.device)
    sources = (ends - response_lengths - 1).unsqueeze(1) + columns  # (B, R)
    inside = columns < response_lengths.unsqueeze(1)
    gathered = values[sources.clamp(max=values.shape[0] - 1)]
    return gathered * inside.view(*inside.shape, *([1] * (values.dim() - 1))).to(gathered.dtype)


def build_attention_mask_from_nested(input_ids: torch.Tensor, max_seq_len: int | None = None) -> torch.Tensor:
    """(B, max_seq_len) int32 mask, 1 on the first s_i positions of row i of nested `input_ids`."""
    if not input_ids.is_nested:
        raise ValueError("build_attention_mask_from_nested takes nested input_ids (left_right_2_no_padding's).")
    lengths = _lengths(input_ids).to(input_ids.values().device)
    width = int(lengths.max()) if max_seq_len is None else max_seq_len
    return (torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int32)


def _strip_padding(embeds: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = mask.bool()
    rows = [embeds[i, keep[i]] for i in range(keep.shape[0])]
    masks = [keep[i, keep[i]] for i in range(keep.shape[0])]
    return (
        torch.nested.as_nested_tensor(rows, layout=torch.jagged),
        torch.nested.as_nested_tensor(masks, layout=torch.jagged),
    )


def embeds_padding_2_no_padding(data: TensorDict) -> TensorDict:
    """`data` (in place) with `prompt_embeds` (B, T, D) and its 0/1 `prompt_embeds_mask` (B, T) as nested rows
    of the masked positions; the same for `negative_prompt_embeds` (classifier-free guidance) when present."""
    for name in ("prompt_embeds", "negative_prompt_embeds"):
        if isinstance(data.get(name, None), torch.Tensor):
            data[name], data[f"{name}_mask"] = _strip_padding(data[name], data[f"{name}_mask"])
    return data


def response_from_nested(tensor: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Nested rows r_i long of a nested (B, *s_i*) model output: the positions that predict row i's response
    tokens (response lengths from the nested `response_mask`)."""
    values, ends = tensor.values(), tensor.offsets()[1:]
    rows = [values[end - length - 1 : end - 1] for length, end in zip(_lengths(response_mask), ends, strict=True)]
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def response_to_nested(tensor: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """A padded (B, R) response tensor as nested rows of each response's length (from the nested mask)."""
    if not response_mask.is_nested:
        raise ValueError("response_to_nested takes a nested response_mask (rows of each response's length).")
    rows = [tensor[i, :length] for i, length in enumerate(_lengths(response_mask).tolist())]
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)
