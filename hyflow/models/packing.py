"""Padding removal: the rows of a batch packed into one sequence, with attention that stays inside each row.

    packed = pack_rows(attention_mask, response_length)      # which tokens are real, where each row starts
    hidden = forward_packed(decoder, input_ids, position_ids, packed)        # (N, H): real tokens only
    hidden[packed.sources]                                   # the states that predict the real response tokens

An RL batch is padded to its longest prompt (left) and longest response (right); with lengths that vary, a third
to a half of its tokens are padding, and a padded forward spends that share of the matmuls and attention on them.
Packed, the decoder runs on the N real tokens as one sequence of length N, with `position_ids` restarting at each
row (so rotary embeddings are per row), and attention is causal within each row only ("varlen" attention over
`cu_seqlens` = the cumulative row lengths [0, L₀, L₀+L₁, …, N]).

The attention is registered with transformers' `AttentionInterface` as "hyflow_varlen" and receives the row
boundaries through the model's forward kwargs (`cu_seq_lens_q`, `max_length_q`, the names transformers' own
flash-attention path uses). On CUDA with bf16/fp16 it runs PyTorch's built-in flash-attention kernel in its
variable-length form (`aten._flash_attention_forward`, differentiable, grouped-query heads natively); elsewhere it
runs `scaled_dot_product_attention` row by row, which gives the same numbers as the padded forward (the tests
compare the two).

Packing needs the mask's contents on the host (how many real tokens, the longest row). The training loops pack
each micro-batch from its host copy and send the result with the batch (`PackedRows.to`), so a forward never
waits for the device; `pack_rows` on a device mask works too, and syncs with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION_NAME = "hyflow_varlen"


@dataclass
class PackedRows:
    """Where the real tokens of a (B, T) batch sit once packed: `indices` (N,) into the flattened batch, row
    boundaries `cu_seqlens` (B + 1,) int32, the longest row `max_len`, and the (B, T) batch shape.

    With a response length R, also the M real response tokens: their places (`response_rows`, `response_cols`)
    in the (B, R) response block, and `sources` (M,), the packed position of the token before each (whose hidden
    state predicts it). Without one these are None."""

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    shape: tuple[int, int]
    response_rows: torch.Tensor | None = None
    response_cols: torch.Tensor | None = None
    sources: torch.Tensor | None = None

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The real tokens of a (B, T, ...) tensor, packed: (N, ...)."""
        return tensor.flatten(0, 1)[self.indices]

    def flat_index(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Packed positions of the real batch positions (rows[i], cols[i]); -1 where (b, t) is padding."""
        lookup = torch.full((self.shape[0] * self.shape[1],), -1, dtype=torch.long, device=self.indices.device)
        lookup[self.indices] = torch.arange(self.indices.numel(), device=self.indices.device)
        return lookup[rows * self.shape[1] + cols]

    def to(self, device: torch.device) -> PackedRows:
        """The same packing on `device`. From the host to CUDA it travels as one pinned, non-blocking copy, queued
        behind the device's work like a kernel (the host does not wait)."""
        tensors = [self.indices, self.cu_seqlens, self.response_rows, self.response_cols, self.sources]
        present = [t for t in tensors if t is not None]
        device, here = torch.device(device), present[0].device
        if device.type == here.type and device.index in (None, here.index):
            return self
        flat = torch.cat([t.long() for t in present])
        if here.type == "cpu" and device.type == "cuda":
            flat = flat.pin_memory()
        moved = iter(flat.to(device, non_blocking=True).split([t.numel() for t in present]))
        indices, cu_seqlens = next(moved), next(moved).int()
        rest = [None if t is None else next(moved) for t in tensors[2:]]
        return PackedRows(indices, cu_seqlens, self.max_len, self.shape, *rest)


def pack_rows(attention_mask: torch.Tensor, response_length: int | None = None) -> PackedRows:
    """The packing of a (B, T) 0/1 attention mask (any padding side), and of its last `response_length` columns'
    real tokens when given. On a host mask nothing waits; on a device mask it syncs (`nonzero`, `max_len`).

    Raises ValueError if a real response token has no real token before it (nothing would predict it)."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    indices = mask.flatten().nonzero().squeeze(1)
    packed = PackedRows(indices, cu_seqlens, int(lengths.max()), tuple(mask.shape))
    if response_length is None:
        return packed
    rows, cols = mask[:, -response_length:].nonzero(as_tuple=True)
    sources = packed.flat_index(rows, cols + mask.shape[1] - response_length - 1)
    if bool((sources < 0).any()):
        raise ValueError(
            "a response token has no real token before it (empty prompt, or padding between prompt and "
            "response); prompts must hold at least one token and responses follow them directly"
        )
    packed.response_rows, packed.response_cols, packed.sources = rows, cols, sources
    return packed


def _rowwise_sdpa(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seqlens: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """Causal attention row by row: q (N, Hq, D), k/v (N, Hkv, D) → (N, Hq, D)."""
    groups = query.shape[1] // key.shape[1]
    outputs = []
    bounds = cu_seqlens.tolist()
    for start, end in pairwise(bounds):
        if end == start:
            continue
        q = query[start:end].transpose(0, 1)
        k = key[start:end].transpose(0, 1).repeat_interleave(groups, dim=0)
        v = value[start:end].transpose(0, 1).repeat_interleave(groups, dim=0)
        outputs.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale).transpose(0, 1))
    return torch.cat(outputs)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_len: int,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(q kᵀ · scale + causal-within-row mask) v for packed rows: q (N, Hq, D), k/v (N, Hkv, D) → (N, Hq, D).

    Hq must be a multiple of Hkv (grouped-query attention); scale defaults to 1/√D.
    """
    if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16):
        return torch.ops.aten._flash_attention_forward(
            query, key, value, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, True, False, scale=scale
        )[0]
    return _rowwise_sdpa(query, key, value, cu_seqlens, scale)


def _transformers_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: q (1, Hq, N, D), k/v (1, Hkv, N, D) → ((1, N, Hq, D), None)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None or query.shape[0] != 1:
        raise ValueError(
            "attn_implementation='hyflow_varlen' runs packed rows only: call the model through "
            "hyflow.models.packing.forward_packed (batch of one, cu_seq_lens_q and max_length_q set)."
        )
    if dropout:
        raise ValueError("hyflow_varlen attention has no dropout; set the model's attention_dropout to 0")
    output = varlen_attention(
        query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
        cu_seqlens, int(kwargs["max_length_q"]), scaling,
    )  # fmt: skip
    return output.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The mask builder for packed rows: none (the row boundaries travel as cu_seqlens)."""
    return None


def use_varlen_attention(model: nn.Module) -> None:
    """Registers "hyflow_varlen" with transformers and switches `model` (a Hugging Face model) to it; in a
    vision-language model only its language model (the vision tower keeps its own attention over its patches)."""
    from transformers import AttentionInterface

    from hyflow.models.multimodal import text_model

    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:  # transformers < 4.53
        raise ValueError(
            "use_remove_padding=True needs transformers >= 4.53 (AttentionMaskInterface); upgrade transformers "
            "or set actor_rollout_ref.model.use_remove_padding=False"
        ) from error
    AttentionInterface.register(ATTENTION_NAME, _transformers_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    model = text_model(model)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME


def packed_position_ids(position_ids: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """Position ids of the packed sequence: (B, T) -> (1, N); Qwen2-VL's M-RoPE rows (B, 3, T) -> (3, 1, N)."""
    if position_ids.dim() == 3:
        return torch.stack([packed.gather(position_ids[:, row]) for row in range(position_ids.shape[1])])[:, None]
    return packed.gather(position_ids).unsqueeze(0)


def forward_packed(
    decoder: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, packed: PackedRows, **model_kwargs: Any
) -> torch.Tensor:
    """The decoder's last hidden states (N, H) at the real tokens of a (B, T) batch, computed packed.

    A vision-language backbone (Qwen2-VL's) runs too: its image pads stay in the packed ids in row order, so
    `model_kwargs` (`mm_encoder_outputs`, the vision tower's output for the rows' images) fill them as in the padded
    forward, and (B, 3, T) M-RoPE position ids are packed row by row."""
    hidden = decoder(
        input_ids=packed.gather(input_ids).unsqueeze(0),
        position_ids=packed_position_ids(position_ids, packed),
        # A 4D mask counts as already prepared: transformers passes it through untouched (the varlen attention
        # ignores it; cu_seqlens separates the rows) instead of building one and, first, looking for packed rows
        # in position_ids on the host, a device sync in every forward.
        attention_mask=torch.empty((1, 1, 0, 0), dtype=torch.bool, device=input_ids.device),
        use_cache=False,
        cu_seq_lens_q=packed.cu_seqlens,
        cu_seq_lens_k=packed.cu_seqlens,
        max_length_q=packed.max_len,
        max_length_k=packed.max_len,
        **model_kwargs,
    ).last_hidden_state
    return hidden[0]
