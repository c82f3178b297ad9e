"""The engine's mixture-of-experts layer (Qwen3-MoE, Qwen2-MoE, Mixtral): routing, the experts, their weights.

A sparse block replaces the dense MLP of a decoder layer. For each token x (hidden size E):

    p = softmax(x W_router^T)                        (fp32, over all X experts)
    (w, e) = top_k(p)                                 (k experts per token)
    w <- w / sum(w)                                   (Mixtral, and Qwen-MoE with `norm_topk_prob`)
    y = sum_j w_j · down_ej(silu(gate_ej x) * up_ej x)     (+ sigmoid(x g^T) · shared(x): Qwen2-MoE's shared expert)

(Shazeer et al. 2017, "Outrageously Large Neural Networks"; Fedus et al. 2021, "Switch Transformers"; Jiang et al.
2024, "Mixtral of Experts".) The experts' weights are held fused, as transformers 5 holds them: `w13` (X, 2·I, E)
with each expert's gate rows above its up rows, and `w2` (X, E, I). Checkpoints name them per expert
(`mlp.experts.3.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.3.w1.weight`) or fused
(`mlp.experts.gate_up_proj`, `mlp.experts.down_proj`); `expert_weight_target` maps either onto its place, so a
weight update never reallocates.

The experts run grouped: the (token, expert) pairs are sorted by expert and each expert multiplies its rows in one
matmul (eager; the same rows in the same order as transformers' loop, so fp32 results agree to the last bits). On
CUDA the fused Triton layer (triton_moe.py) computes the same without a host sync, inside CUDA graphs.

Tensor parallelism splits every expert's intermediate columns over the ranks (column-parallel gate/up, row-parallel
down, as the dense MLP): each rank computes its partial sum for all experts, the shared expert's partial sum is
added, and one all-reduce per layer completes both. The router and the shared-expert gate are replicated.

Shapes: T tokens, E hidden, X experts, k experts per token, I an expert's intermediate size (I / tp on a TP rank).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hyflow.engine import triton_moe
from hyflow.engine.models.ops import silu_and_mul
from hyflow.engine.parallel import TensorParallel, TensorSlice

# HF config `model_type` -> the dense family whose attention it shares.
MOE_BASE_FAMILY = {"qwen3_moe": "qwen3", "qwen2_moe": "qwen2", "mixtral": "mistral"}

# One expert's projection, by either naming: (layer prefix, expert, projection)
_PER_EXPERT = re.compile(
    r"^(.*)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$"
)
# All experts' projections fused: (layer prefix, which)
_FUSED = re.compile(r"^(.*)\.mlp\.experts\.(gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"^(.*)\.block_sparse_moe\.gate\.weight$")  # Mixtral's router name -> ours (mlp.gate)
_PART = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": None, "w2": None}


@dataclass(frozen=True)
class MoEArgs:
    """The experts of a mixture-of-experts decoder, read from a Hugging Face config by `MoEArgs.from_hf`."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert, whole (I)
    normalize_top_k: bool  # renormalise the k chosen probabilities to sum to 1
    weights_in_model_dtype: bool  # Qwen rounds the routing weights to the model's dtype; Mixtral keeps fp32
    sparse_layers: tuple[bool, ...]  # per layer: a sparse block (True) or the dense MLP
    shared_intermediate_size: int = 0  # Qwen2-MoE's shared expert (0: none)

    @classmethod
    def from_hf(cls, config: Any, model_type: str) -> MoEArgs:
        num_layers = config.num_hidden_layers
        if model_type == "mixtral":
            return cls(
                num_experts=config.num_local_experts,
                top_k=config.num_experts_per_tok,
                intermediate_size=config.intermediate_size,
                normalize_top_k=True,
                weights_in_model_dtype=False,
                sparse_layers=(True,) * num_layers,
            )
        dense_only = set(getattr(config, "mlp_only_layers", None) or [])
        step = getattr(config, "decoder_sparse_step", 1) or 1
        sparse = tuple(
            layer not in dense_only and config.num_experts > 0 and (layer + 1) % step == 0
            for layer in range(num_layers)
        )
        return cls(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            normalize_top_k=bool(config.norm_topk_prob),
            weights_in_model_dtype=True,
            sparse_layers=sparse,
            shared_intermediate_size=getattr(config, "shared_expert_intermediate_size", 0) or 0,
        )

    def check_split(self, tp_size: int) -> None:
        """ValueError naming the fix when the experts' columns do not split `tp_size` ways."""
        for key, size in (
            ("moe_intermediate_size", self.intermediate_size),
            ("shared_expert_intermediate_size", self.shared_intermediate_size),
        ):
            if size % tp_size:
                raise ValueError(
                    f"the model's {key}={size} is not divisible by tensor_model_parallel_size={tp_size}; set "
                    f"tensor_model_parallel_size to a divisor of {size}"
                )


def route(
    router_logits: torch.Tensor, top_k: int, normalize: bool, out_dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (T, k), expert ids (T, k)) of each token: p = softmax(logits) in fp32, the k largest p, divided by
    their sum when `normalize`; rounded to `out_dtype` (None: kept fp32). transformers' routers, exactly."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, expert_ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return (weights if out_dtype is None else weights.to(out_dtype)), expert_ids


def grouped_experts(
    x: torch.Tensor, expert_ids: torch.Tensor, weights: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor
) -> torch.Tensor:
    """y (T, E) = sum_j weights[t, j] · w2[e] (silu(gate_e x_t) * up_e x_t), e = expert_ids[t, j]: the (token,
    expert) pairs sorted by expert (stable, so each expert's rows keep token order), one matmul pair per expert that
    has tokens, the weighted rows summed back per token in expert order. Eager (reads the per-expert counts)."""
    num_tokens, top_k = expert_ids.shape
    flat = expert_ids.flatten()
    order = flat.argsort(stable=True)
    token_of = order // top_k
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    rows = x[token_of]
    out = torch.empty(len(flat), w2.shape[1], dtype=x.dtype, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            chunk = slice(start, start + count)
            out[chunk] = nn.functional.linear(silu_and_mul(nn.functional.linear(rows[chunk], w13[expert])), w2[expert])
            start += count
    weighted = out * weights.flatten()[order].unsqueeze(-1)
    y = torch.zeros(num_tokens, w2.shape[1], dtype=x.dtype, device=x.device)
    return y.index_add_(0, token_of, weighted.to(x.dtype))


class SharedExpert(nn.Module):
    """Qwen2-MoE's shared expert, this rank's columns of it: down(silu(gate x) * up x), partial sum (no all-reduce:
    the sparse block reduces once for both)."""

    def __init__(self, hidden_size: int, columns: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden_size, 2 * columns, bias=False)
        self.down_proj = nn.Linear(columns, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class SparseMoeBlock(nn.Module):
    """Router + experts (+ Qwen2-MoE's gated shared expert), on this TP rank's expert columns; the partial sums of
    the experts and the shared expert are all-reduced once."""

    def __init__(self, hidden_size: int, moe: MoEArgs, tp: TensorParallel) -> None:
        super().__init__()
        self.moe, self.tp = moe, tp
        columns = moe.intermediate_size // tp.size
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = nn.Module()
        self.experts.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * columns, hidden_size))
        self.experts.w2 = nn.Parameter(torch.empty(moe.num_experts, hidden_size, columns))
        self.shared_expert = None
        self.shared_expert_gate = None
        if moe.shared_intermediate_size:
            self.shared_expert = SharedExpert(hidden_size, moe.shared_intermediate_size // tp.size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)
        self.routing_record: torch.Tensor | None = None  # (slots, k): where to record the routing (routing_cache.py)

    def forward(self, x: torch.Tensor, slot_mapping: torch.Tensor | None = None) -> torch.Tensor:
        """y (T, E) of the step's T tokens; with a `routing_record`, their expert ids land at their cache slots."""
        moe = self.moe
        weights, expert_ids = route(
            self.gate(x), moe.top_k, moe.normalize_top_k, x.dtype if moe.weights_in_model_dtype else None
        )
        if self.routing_record is not None and slot_mapping is not None:
            self.routing_record.index_copy_(0, slot_mapping, expert_ids.to(self.routing_record.dtype))
        experts = triton_moe.fused_experts if x.is_cuda and triton_moe.available() else grouped_experts
        y = experts(x, expert_ids, weights, self.experts.w13, self.experts.w2)
        if self.shared_expert is not None:
            y = y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return self.tp.all_reduce(y)


@dataclass(frozen=True)
class ExpertTarget:
    """Where one HF expert tensor goes: our parameter, the expert (None: all, a fused tensor), the gate (0) or up (1)
    half of `w13` (None: `w2`), and the dimension of the HF tensor along which TP ranks split it."""

    param: str
    expert: int | None
    part: int | None
    split_dim: int


def rename_router(name: str) -> str:
    """Mixtral's `block_sparse_moe.gate.weight` under our name `mlp.gate.weight`; other names unchanged."""
    match = _ROUTER.match(name)
    return f"{match.group(1)}.mlp.gate.weight" if match else name


def expert_weight_target(name: str) -> ExpertTarget | None:
    """The place of an HF expert tensor (per-expert or fused naming); None for any other name."""
    match = _PER_EXPERT.match(name)
    if match:
        prefix, expert, proj = match.groups()
        part = _PART[proj]
        param = f"{prefix}.mlp.experts.{'w2' if part is None else 'w13'}"
        return ExpertTarget(param, int(expert), part, split_dim=1 if part is None else 0)
    match = _FUSED.match(name)
    if match:
        prefix, which = match.groups()
        if which == "down_proj":
            return ExpertTarget(f"{prefix}.mlp.experts.w2", None, None, split_dim=2)
        return ExpertTarget(f"{prefix}.mlp.experts.w13", None, None, split_dim=1)  # both halves: see load
    return None


def expert_hf_slice(target: ExpertTarget, moe: MoEArgs, tp_size: int, tp_rank: int) -> TensorSlice | None:
    """This TP rank's slice of an HF expert tensor (None: all of it). A fused gate_up tensor holds the gate and up
    columns apart, not one range: its ranks take the whole tensor and cut both halves (`load_expert_weight`)."""
    if tp_size == 1 or (target.expert is None and target.param.endswith("w13")):
        return None
    columns = moe.intermediate_size // tp_size
    return TensorSlice(target.split_dim, tp_rank * columns, columns, moe.intermediate_size)


def load_expert_weight(
    param: torch.Tensor, name: str, tensor: torch.Tensor, moe: MoEArgs, tp_size: int, tp_rank: int
) -> None:
    """Copies the HF expert tensor `name` (whole, or this rank's slice of it) into `param` (our w13 or w2) in
    place; ValueError naming the tensor when its shape is neither."""
    target = expert_weight_target(name)
    columns = moe.intermediate_size // tp_size
    dest = param.data if target.expert is None else param.data[target.expert]
    if target.expert is None and target.part is None and target.param.endswith("w13"):  # fused gate_up (X, 2I, E)
        full = moe.intermediate_size
        if tensor.shape[1] == 2 * full and tp_size > 1:
            gate, up = tensor[:, :full], tensor[:, full:]
            start = tp_rank * columns
            tensor = torch.cat([gate[:, start : start + columns], up[:, start : start + columns]], 1)
        _copy_checked(dest, tensor, name, target.param)
        return
    if target.part is not None:
        dest = dest.narrow(0, target.part * columns, columns)
    if tp_size > 1 and tensor.shape[target.split_dim] == moe.intermediate_size:
        tensor = tensor.narrow(target.split_dim, tp_rank * columns, columns)
    _copy_checked(dest, tensor, name, target.param)


def _copy_checked(dest: torch.Tensor, tensor: torch.Tensor, name: str, ours: str) -> None:
    if tensor.shape != dest.shape:
        raise ValueError(
            f"expert weight {name!r} has shape {tuple(tensor.shape)}, the engine expects {tuple(dest.shape)} (its "
            f"part of {ours!r}): "
            "the model config (num_experts, moe_intermediate_size) and the checkpoint's expert tensors disagree, or "
            "the checkpoint lays its experts out in a way hyflow does not read (per-expert "
            "`experts.N.gate_proj/up_proj/down_proj` or `w1/w3/w2`, or fused `experts.gate_up_proj` (X, 2I, E) and "
            "`experts.down_proj` (X, E, I))"
        )
    dest.copy_(tensor)
