"""Tensor parallelism for the engine: the process group of one model copy, its collectives, and how heads split.

    tp = TensorParallel.from_world(2)        # consecutive ranks of the torch.distributed world form a TP group
    engine = LLMEngine(model, EngineConfig(tensor_parallel_size=2), tp_group=tp.group)   # or let it build one

Megatron-style sharding (Shoeybi et al. 2019, "Megatron-LM"): each TP rank holds a column slice of `qkv_proj`
(its own query heads and the KV heads they read) and of `gate_up_proj`, and the matching row slice of `o_proj` and
`down_proj`, whose partial outputs are summed by one all-reduce each per layer:

    attention:  out = sum_r  attn(x W_qkv[r]) W_o[r]        (all_reduce)
    MLP:        out = sum_r  (silu(x W_gate[r]) * x W_up[r]) W_down[r]     (all_reduce)

The embedding and the LM head are split by vocabulary rows (each rank holds ceil(V / tp) rows, the last padded):

    embedding:  x = sum_r  [id in rows of r] * E[r][id - start_r]     (all_reduce)
    LM head:    logits = concat_r  h W_lm[r]^T,  cut to V              (all_gather)

The norms are replicated, so every rank ends a step with the same logits and samples the same tokens
(counter-based sampling, sampler.py): the ranks of a group run the same scheduler on the same requests in lockstep
(SPMD) and never disagree on a scheduling decision.

KV heads: with Hkv divisible by the TP size each rank holds Hkv / tp of them; with fewer KV heads than ranks
(tp divisible by Hkv) each KV head is replicated on tp / Hkv ranks, each rank holding the one its queries read.
Shapes: H query heads, Hkv KV heads, G = H / Hkv query heads per KV head, I the MLP's intermediate size.

Which part of a full Hugging Face tensor a TP rank holds is a `TensorSlice` (one range along one dimension);
the weight sync sends each rank only its slices (hyflow.workers.weight_sync). Data-parallel rollout places
`world / tp` engines on a worker group (`EnginePlacement`): engine e on the consecutive ranks e·tp .. e·tp + tp − 1,
one engine per device when tp is 1.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_KEY = "tensor_model_parallel_size"
# torch 2.13 renamed all_gather_into_tensor (deprecated there) to all_gather_single; same arguments.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class EnginePlacement:
    """How the `world_size` ranks of a worker group form engines of `tp_size` ranks each: engine e runs on the
    consecutive ranks e·tp .. e·tp + tp − 1 (one engine per device when tp is 1, one per TP group otherwise; the
    config check keeps a TP group within one node)."""

    world_size: int
    tp_size: int = 1

    def __post_init__(self) -> None:
        if self.tp_size < 1 or self.world_size % self.tp_size:
            raise ValueError(
                f"{_KEY}={self.tp_size} must divide the number of ranks {self.world_size}; pick one of "
                f"{_divisors(self.world_size)}"
            )

    @property
    def num_engines(self) -> int:
        return self.world_size // self.tp_size

    def engine_of(self, rank: int) -> int:
        return rank // self.tp_size

    def tp_rank_of(self, rank: int) -> int:
        return rank % self.tp_size

    def ranks_of(self, engine: int) -> list[int]:
        return list(range(engine * self.tp_size, (engine + 1) * self.tp_size))


@dataclass(frozen=True)
class TensorSlice:
    """The part of a full tensor that one TP rank holds: `length` indices from `start` along `dim`, of `full`."""

    dim: int
    start: int
    length: int
    full: int

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """This slice of a full tensor (a view)."""
        return tensor.narrow(self.dim, self.start, self.length)

    def shape(self, full_shape: Sequence[int]) -> tuple[int, ...]:
        """The shape of this slice of a tensor of `full_shape`."""
        shape = list(full_shape)
        shape[self.dim] = self.length
        return tuple(shape)


@dataclass(frozen=True)
class TensorParallel:
    """One TP group as seen from one rank: its size, this rank's index in it, and the process group."""

    size: int = 1
    rank: int = 0
    group: Any = None  # a torch.distributed ProcessGroup; None when size is 1

    @classmethod
    def from_group(cls, group: Any) -> TensorParallel:
        """The TP layout of an existing process group (which must contain this rank)."""
        return cls(size=dist.get_world_size(group), rank=dist.get_rank(group), group=group)

    @classmethod
    def build(cls, size: int, group: Any = None) -> TensorParallel:
        """The layout of `group` when given (its size must be `size`), else this rank's group of the world."""
        if group is None:
            return cls.from_world(size)
        tp = cls.from_group(group)
        if tp.size != size:
            raise ValueError(
                f"the process group given for tensor parallelism has {tp.size} ranks but {_KEY}={size}; "
                f"pass a group of {size} ranks, or set {_KEY}={tp.size}"
            )
        return tp

    @classmethod
    def from_world(cls, size: int) -> TensorParallel:
        """Splits the torch.distributed world into groups of `size` consecutive ranks; returns this rank's.

        Every rank of the world must call this (creating a group is a collective over the world)."""
        if size == 1:
            return cls()
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                f"{_KEY}={size} needs a torch.distributed process group (one process per device); initialise one "
                f"(torchrun, or a hyflow worker group) or set {_KEY}=1"
            )
        world, rank = dist.get_world_size(), dist.get_rank()
        placement = EnginePlacement(world, size)  # ValueError when size does not divide the world
        if size == world:
            return cls.from_group(dist.group.WORLD)
        mine = None
        for engine in range(placement.num_engines):
            ranks = placement.ranks_of(engine)
            group = dist.new_group(ranks)  # every rank creates every group, in the same order
            if rank in ranks:
                mine = group
        logger.info("tensor parallel: rank %d is rank %d of a group of %d", rank, rank % size, size)
        return cls.from_group(mine)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sums `x` over the group in place (capturable in a CUDA graph with NCCL); returns it."""
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N) from every rank, side by side: (B, size * N) in group-rank order (capturable with NCCL)."""
        if self.size == 1:
            return x
        out = torch.empty(self.size * x.shape[0], x.shape[1], dtype=x.dtype, device=x.device)
        all_gather_single(out, x.contiguous(), group=self.group)  # (size * B, N): rank r's rows r*B..
        return out.view(self.size, *x.shape).transpose(0, 1).flatten(1)

    def min(self, value: int, device: torch.device) -> int:
        """The smallest of each rank's `value` (e.g. KV blocks that fit), so that every rank uses the same."""
        if self.size == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.long, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=self.group)
        return int(tensor.item())

    def all_gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), in group-rank order."""
        if self.size == 1:
            return [obj]
        gathered: list[Any] = [None] * self.size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered


@dataclass(frozen=True)
class ShardLayout:
    """Which slice of the full model one TP rank holds: its query heads, KV heads and MLP columns."""

    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank
    head_start: int  # first query head (index in the full model)
    kv_head_start: int  # first KV head
    intermediate_size: int  # MLP columns on this rank
    intermediate_start: int
    vocab_rows: int  # embedding / LM-head rows on this rank: ceil(V / tp), padding included
    vocab_start: int
    vocab_real_rows: int  # of them, rows of real tokens (fewer on the last ranks when tp does not divide V)

    @classmethod
    def for_rank(
        cls, num_heads: int, num_kv_heads: int, intermediate_size: int, vocab_size: int, tp_size: int, tp_rank: int
    ) -> ShardLayout:
        """The slice of rank `tp_rank`; ValueError naming the fix when the model does not split `tp_size` ways."""
        _check_divisible("num_attention_heads", num_heads, tp_size)
        _check_divisible("intermediate_size", intermediate_size, tp_size)
        if num_kv_heads % tp_size and tp_size % num_kv_heads:
            raise ValueError(
                f"num_key_value_heads={num_kv_heads} and {_KEY}={tp_size}: the KV heads can be neither split nor "
                f"replicated evenly (one of the two must divide the other); set {_KEY} to one of "
                f"{[d for d in _divisors(num_heads) if num_kv_heads % d == 0 or d % num_kv_heads == 0]}"
            )
        local_heads = num_heads // tp_size
        group = num_heads // num_kv_heads  # query heads per KV head
        local_intermediate = intermediate_size // tp_size
        vocab_rows = -(-vocab_size // tp_size)
        return cls(
            num_heads=local_heads,
            num_kv_heads=max(num_kv_heads // tp_size, 1),
            head_start=tp_rank * local_heads,
            kv_head_start=tp_rank * local_heads // group,
            intermediate_size=local_intermediate,
            intermediate_start=tp_rank * local_intermediate,
            vocab_rows=vocab_rows,
            vocab_start=tp_rank * vocab_rows,
            vocab_real_rows=max(min(vocab_size - tp_rank * vocab_rows, vocab_rows), 0),
        )


def _check_divisible(key: str, value: int, tp_size: int) -> None:
    if value % tp_size:
        raise ValueError(
            f"the model's {key}={value} is not divisible by {_KEY}={tp_size}, so it cannot be split evenly across "
            f"the TP ranks; set {_KEY} to a divisor of {value}: one of {_divisors(value)}"
        )
