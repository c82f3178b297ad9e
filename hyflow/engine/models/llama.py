"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) for the engine, reading Hugging Face weights by name.

The families differ only in switches of `DecoderArgs`: qkv bias (Qwen2), q/k RMSNorm per head (Qwen3), sliding
window layers (Mistral, some Qwen2/3), tied embeddings, and the RoPE variant. q/k/v and gate/up are fused into
one matmul each (`qkv_proj`, `gate_up_proj`); `load_weights` maps the HF names (`q_proj`, `gate_proj`, ...) onto
their slices in place, so a weight update never reallocates.

With tensor parallelism (parallel.py) each rank builds the same model with its `ShardLayout`: its own query and KV
heads in `qkv_proj` and its MLP columns in `gate_up_proj` (column-parallel), the matching input slices of `o_proj`
and `down_proj` (row-parallel, their partial sums all-reduced before the bias); `load_weights` takes the full HF
tensors and copies this rank's slice, or this rank's slice alone (`DecoderArgs.hf_slice` says which part that is:
what the weight sync sends a TP rank). The embedding and LM head are split by vocabulary rows (the LM head's
logits all-gathered); the norms are replicated.

Shapes: T new tokens in one step (flattened over sequences), hidden size E, H heads, Hkv KV heads, head dim D;
on one TP rank of a group of tp: H / tp query heads, max(Hkv / tp, 1) KV heads, I / tp MLP columns, ceil(V / tp)
vocabulary rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hyflow.engine import triton_rope
from hyflow.engine.attention import AttentionMasks, AttentionMetadata, paged_attention, write_kv_cache
from hyflow.engine.models.moe import (
    MOE_BASE_FAMILY,
    MoEArgs,
    SparseMoeBlock,
    expert_hf_slice,
    expert_weight_target,
    load_expert_weight,
    rename_router,
)
from hyflow.engine.models.mrope import rotary_embedding
from hyflow.engine.models.ops import add_rms_norm, rms_norm, silu_and_mul
from hyflow.engine.models.rope import RotaryEmbedding, rope_parameters
from hyflow.engine.parallel import ShardLayout, TensorParallel, TensorSlice

# HF projection name -> (our fused parameter, shard index among the fused parts)
PACKED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


@dataclass
class DecoderArgs:
    """The shape and switches of one decoder, read from a Hugging Face config by `DecoderArgs.from_hf`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_positions: int
    rope: dict[str, Any]
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    sliding_windows: list[int | None] = field(default_factory=list)  # one per layer, None = full attention
    tp_size: int = 1  # tensor-parallel ranks the model is split over, and which of them this copy is
    tp_rank: int = 0
    moe: MoEArgs | None = None  # the experts of a mixture-of-experts model (moe.py); None: dense

    def mlp_columns(self, name: str) -> tuple[int, int, int]:
        """(columns on this rank, first column, columns in all) of the MLP that HF weight `name` belongs to: the
        dense MLP's, or Qwen2-MoE's shared expert's."""
        if self.moe is not None and ".shared_expert." in name:
            full = self.moe.shared_intermediate_size
            columns = full // self.tp_size
            return columns, self.tp_rank * columns, full
        layout = self.layout
        return layout.intermediate_size, layout.intermediate_start, self.intermediate_size

    def sharded(self, tp_size: int, tp_rank: int) -> DecoderArgs:
        """These args for TP rank `tp_rank` of `tp_size`; ValueError (naming the fix) when the model does not split
        that many ways."""
        ShardLayout.for_rank(
            self.num_heads, self.num_kv_heads, self.intermediate_size, self.vocab_size, tp_size, tp_rank
        )
        if self.moe is not None:
            self.moe.check_split(tp_size)
        return dataclasses.replace(self, tp_size=tp_size, tp_rank=tp_rank)

    @property
    def layout(self) -> ShardLayout:
        """The heads and MLP columns this TP rank holds (all of them when tp_size is 1)."""
        return ShardLayout.for_rank(
            self.num_heads, self.num_kv_heads, self.intermediate_size, self.vocab_size, self.tp_size, self.tp_rank
        )

    def hf_slice(self, name: str) -> TensorSlice | None:
        """The part of the full HF tensor `name` (a decoder weight) that this TP rank holds; None: all of it.
        Column-parallel weights (q/k/v, gate/up, their biases, the vocabulary rows) slice dim 0, row-parallel ones
        (o_proj, down_proj) dim 1; norms and row-parallel biases are whole on every rank."""
        if self.tp_size == 1:
            return None
        layout, head_dim = self.layout, self.head_dim
        expert = expert_weight_target(name)
        if expert is not None:
            return expert_hf_slice(expert, self.moe, self.tp_size, self.tp_rank)
        columns, start, full_columns = self.mlp_columns(name)
        for hf_part, (ours, index) in PACKED.items():
            if f".{hf_part}." in name:
                if ours == "qkv_proj":
                    first = layout.head_start if index == 0 else layout.kv_head_start
                    heads = layout.num_heads if index == 0 else layout.num_kv_heads
                    full = self.num_heads if index == 0 else self.num_kv_heads
                    return TensorSlice(0, first * head_dim, heads * head_dim, full * head_dim)
                return TensorSlice(0, start, columns, full_columns)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return TensorSlice(0, layout.vocab_start, layout.vocab_real_rows, self.vocab_size)
        if name.endswith(".o_proj.weight"):
            width = layout.num_heads * head_dim
            return TensorSlice(1, layout.head_start * head_dim, width, self.num_heads * head_dim)
        if name.endswith(".down_proj.weight"):
            return TensorSlice(1, start, columns, full_columns)
        return None

    @classmethod
    def from_hf(cls, config: Any, family: str, max_positions: int) -> DecoderArgs:
        """The args of `config` (a text config) for a `family` of `engine.models.ARCHITECTURES`; a
        mixture-of-experts family (moe.py) takes its attention from the dense family it extends."""
        moe = MoEArgs.from_hf(config, family) if family in MOE_BASE_FAMILY else None
        family = MOE_BASE_FAMILY.get(family, family)
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(
                f"hidden_act={act!r} is not supported by the hyflow engine (only 'silu'); "
                "use rollout.name=hf to generate with transformers instead."
            )
        num_heads = config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            rms_norm_eps=config.rms_norm_eps,
            max_positions=max_positions,
            rope=rope_parameters(config),
            qkv_bias=bool(getattr(config, "qkv_bias", True)) if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=family == "qwen3",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            sliding_windows=_sliding_windows(config, family),
            moe=moe,
        )


def _sliding_windows(config: Any, family: str) -> list[int | None]:
    """Per-layer sliding window: from `layer_types` where the config has them, else Mistral's global window."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return [window if kind == "sliding_attention" else None for kind in layer_types]
    if family == "mistral" or (family != "llama" and getattr(config, "use_sliding_window", False)):
        return [window] * config.num_hidden_layers
    return [None] * config.num_hidden_layers


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32 (Zhang & Sennrich 2019)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return add_rms_norm(x, residual, self.weight, self.eps)


class RowParallelLinear(nn.Linear):
    """y = sum over TP ranks of x_r W_r^T, then + b: the input features are split across the ranks (Megatron's
    row-parallel linear); the bias is added once, after the all-reduce. With one rank, a plain `nn.Linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x)
        out = self.tp.all_reduce(nn.functional.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Token embedding whose rows are split across the TP ranks: each rank looks up the ids in its rows (zeros for
    the others) and an all-reduce sums the parts. With one rank, a plain `nn.Embedding`."""

    def __init__(self, rows: int, dim: int, start: int, tp: TensorParallel) -> None:
        super().__init__(rows, dim)
        self.start, self.tp = start, tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = nn.functional.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(outside.unsqueeze(-1), 0.0))


class Attention(nn.Module):
    def __init__(self, args: DecoderArgs, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        layout = args.layout
        self.num_heads, self.num_kv_heads, self.head_dim = layout.num_heads, layout.num_kv_heads, args.head_dim
        self.q_size, self.kv_size = layout.num_heads * args.head_dim, layout.num_kv_heads * args.head_dim
        self.qkv_proj = nn.Linear(args.hidden_size, self.q_size + 2 * self.kv_size, bias=args.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, args.hidden_size, args.o_bias, tp)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.rotary = rotary
        self.scale = args.head_dim**-0.5
        self.fused_rope_cache = True  # on CUDA with Triton: triton_rope's kernel (False: the PyTorch ops)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        masks: AttentionMasks,
        window: int | None,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        # one launch instead of three (not for the three position rows of an image prefill, mrope.py)
        if self.fused_rope_cache and q.is_cuda and positions.dim() == 1 and triton_rope.available():
            q = triton_rope.rope_and_write_cache(
                q, k, v, self.rotary.cos, self.rotary.sin, positions, kv_cache[0], kv_cache[1], meta.slot_mapping
            )
        else:
            q, k = self.rotary(positions, q, k)
            write_kv_cache(kv_cache[0], kv_cache[1], meta, k, v)
        out = paged_attention(q, kv_cache[0], kv_cache[1], meta, masks, window, self.scale)
        return self.o_proj(out.flatten(1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (Shazeer 2020)."""

    def __init__(self, args: DecoderArgs, tp: TensorParallel) -> None:
        super().__init__()
        columns = args.layout.intermediate_size
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * columns, bias=args.mlp_bias)
        self.down_proj = RowParallelLinear(columns, args.hidden_size, args.mlp_bias, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, args: DecoderArgs, rotary: RotaryEmbedding, tp: TensorParallel, index: int) -> None:
        super().__init__()
        self.self_attn = Attention(args, rotary, tp)
        sparse = args.moe is not None and args.moe.sparse_layers[index]
        self.mlp = SparseMoeBlock(args.hidden_size, args.moe, tp) if sparse else MLP(args, tp)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        masks: AttentionMasks,
        window: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(MLP output, residual stream before it); the caller adds the two (fused into the next norm)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm.add_forward(x, residual)
        x = self.self_attn(positions, x, kv_cache, meta, masks, window)
        x, residual = self.post_attention_layernorm.add_forward(x, residual)
        if isinstance(self.mlp, SparseMoeBlock):  # it may record its routing at the tokens' cache slots
            return self.mlp(x, meta.slot_mapping), residual
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    def __init__(self, args: DecoderArgs, tp: TensorParallel) -> None:
        super().__init__()
        self.rotary = rotary_embedding(args.head_dim, args.max_positions, args.rope)
        layout = args.layout
        self.embed_tokens = VocabParallelEmbedding(layout.vocab_rows, args.hidden_size, layout.vocab_start, tp)
        self.layers = nn.ModuleList(DecoderLayer(args, self.rotary, tp, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class DecoderForCausalLM(nn.Module):
    """Llama-family causal LM over the paged KV cache: `forward` -> hidden states, `compute_logits` -> logits."""

    def __init__(self, args: DecoderArgs, tp: TensorParallel | None = None) -> None:
        super().__init__()
        self.tp = tp = tp or TensorParallel()
        assert (tp.size, tp.rank) == (args.tp_size, args.tp_rank), "DecoderArgs and the TP group disagree"
        self.args = args
        self.model = DecoderModel(args, tp)
        self.lm_head = nn.Linear(args.hidden_size, args.layout.vocab_rows, bias=False)  # this rank's vocab rows
        if args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states (T, E) of the new tokens; their K/V land in `kv_caches` (one (k, v) pair per layer).
        `input_embeds` (T, E) replaces the token embeddings (an image prefill's, vision_inputs.py); `positions` are
        (T,), or (3, T) M-RoPE rows (mrope.py)."""
        masks = AttentionMasks(meta, block_size)
        x = self.model.embed_tokens(input_ids) if input_embeds is None else input_embeds
        residual = None
        for layer, kv_cache, window in zip(self.model.layers, kv_caches, self.args.sliding_windows):
            x, residual = layer(positions, x, residual, kv_cache, meta, masks, window)
        return self.model.norm.add_forward(x, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) in the model's dtype (gathered from the TP ranks' vocab rows); the sampler computes in
        fp32."""
        if self.tp.size == 1:
            return self.lm_head(hidden)
        return self.tp.all_gather_columns(self.lm_head(hidden))[:, : self.args.vocab_size]

    def _shard(self, name: str) -> tuple[str, tuple[int, int] | None, TensorSlice | None]:
        """For one HF weight name: our parameter name; the (offset, length) along its dim 0 that the weight fills
        (None: all of it); and the slice of the full HF tensor that this TP rank holds (None: all of it)."""
        layout, head_dim = self.args.layout, self.args.head_dim
        source = self.args.hf_slice(name)
        for hf_part, (ours, index) in PACKED.items():
            if f".{hf_part}." in name:
                if ours == "qkv_proj":
                    q, kv = layout.num_heads * head_dim, layout.num_kv_heads * head_dim
                    return name.replace(hf_part, ours), [(0, q), (q, kv), (q + kv, kv)][index], source
                columns = self.args.mlp_columns(name)[0]
                return name.replace(hf_part, ours), (index * columns, columns), source
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return name, (0, layout.vocab_real_rows), source
        return name, None, source

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies HF-named tensors into the parameters in place: each either the full tensor (this TP rank's slice
        of it is taken) or that slice alone (`DecoderArgs.hf_slice`); returns how many tensors were loaded."""
        params = dict(self.named_parameters(remove_duplicate=False))
        count = 0
        for hf_name, tensor in weights:
            if "rotary_emb" in hf_name:
                continue
            if hf_name == "lm_head.weight" and self.args.tie_word_embeddings:
                continue  # the same tensor as model.embed_tokens.weight
            expert = expert_weight_target(hf_name)
            if expert is not None and expert.param in params:
                args = self.args
                load_expert_weight(params[expert.param], hf_name, tensor, args.moe, args.tp_size, args.tp_rank)
                count += 1
                continue
            name, span, source = self._shard(rename_router(hf_name))
            if name not in params:
                raise KeyError(
                    f"weight {hf_name!r} has no counterpart in the hyflow engine's model (expected Hugging Face "
                    "Llama/Qwen/Mistral names such as 'model.layers.0.mlp.up_proj.weight')"
                )
            target = params[name].data if span is None else params[name].data.narrow(0, *span)
            full = list(target.shape)
            if source is not None:
                full[source.dim] = source.full
            if list(tensor.shape) == full:
                tensor = tensor if source is None else source.take(tensor)
            elif tensor.shape != target.shape:  # neither the full tensor nor this rank's slice of it
                mine = "" if source is None else f" (or this rank's slice {tuple(target.shape)})"
                expected = f"{tuple(full)}{mine}"
                raise ValueError(
                    f"weight {hf_name!r} has shape {tuple(tensor.shape)}, the engine expects "
                    f"{expected}; the model config and the weights disagree"
                )
            target.copy_(tensor)
            count += 1
        return count
