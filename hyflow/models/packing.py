"""Padding removal: the rows of a batch packed into one sequence, with attention that stays inside each row.

    packed = pack_rows(attention_mask)                       # which tokens are real, and where each row starts
    hidden = forward_packed(decoder, input_ids, position_ids, packed)        # (N, H): real tokens only
    rows = packed.flat_index(response_positions)             # the packed row of any (b, t) position

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
    boundaries `cu_seqlens` (B + 1,) int32, the longest row `max_len`, and the (B, T) batch shape."""

    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_len: int
    shape: tuple[int, int]

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """The real tokens of a (B, T, ...) tensor, packed: (N, ...)."""
        return tensor.flatten(0, 1)[self.indices]

    def flat_index(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """Packed positions of the real batch positions (rows[i], cols[i]); -1 where (b, t) is padding."""
        lookup = torch.full((self.shape[0] * self.shape[1],), -1, dtype=torch.long, device=self.indices.device)
        lookup[self.indices] = torch.arange(self.indices.numel(), device=self.indices.device)
        return lookup[rows * self.shape[1] + cols]


def pack_rows(attention_mask: torch.Tensor) -> PackedRows:
    """The packing of a (B, T) 0/1 attention mask (any padding side). Syncs with the device twice (`nonzero` and
    `max_len`), once per micro-batch."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    indices = mask.flatten().nonzero().squeeze(1)
    return PackedRows(indices, cu_seqlens, int(lengths.max()), tuple(mask.shape))


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
    """Registers "hyflow_varlen" with transformers and switches `model` (a Hugging Face model) to it."""
    from transformers import AttentionInterface

    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:  # transformers < 4.53
        raise ValueError(
            "use_remove_padding=True needs transformers >= 4.53 (AttentionMaskInterface); upgrade transformers "
            "or set actor_rollout_ref.model.use_remove_padding=False"
        ) from error
    AttentionInterface.register(ATTENTION_NAME, _transformers_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION_NAME)
    else:
        model.config._attn_implementation = ATTENTION_NAME


def forward_packed(
    decoder: nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, packed: PackedRows
) -> torch.Tensor:
    """The decoder's last hidden states (N, H) at the real tokens of a (B, T) batch, computed packed."""
    hidden = decoder(
        input_ids=packed.gather(input_ids).unsqueeze(0),
        position_ids=packed.gather(position_ids).unsqueeze(0),
        attention_mask=None,
        use_cache=False,
        cu_seq_lens_q=packed.cu_seqlens,
        cu_seq_lens_k=packed.cu_seqlens,
        max_length_q=packed.max_len,
        max_length_k=packed.max_len,
    ).last_hidden_state
    return hidden[0]
