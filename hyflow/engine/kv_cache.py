"""The paged KV cache tensors and how many blocks fit in the memory the engine may use.

Layout per layer: k and v of shape (num_blocks + 1, block_size, Hkv, D), Hkv being the KV heads this tensor-parallel
rank holds (all of them without TP). The extra last block is scratch: padded
rows of a CUDA-graph batch write there, so no real block is touched. `free()` drops the tensors (sleep) and
`allocate()` makes them again (wake); block ids stay valid across the two.
"""

from __future__ import annotations

import logging

import torch

from hyflow.engine.config import EngineConfig
from hyflow.engine.models.llama import DecoderArgs

logger = logging.getLogger(__name__)


def block_bytes(args: DecoderArgs, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of one block over all layers: 2 (k, v) * layers * block_size * Hkv * D * itemsize (Hkv on this rank)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * args.num_layers * block_size * args.layout.num_kv_heads * args.head_dim * itemsize


def activation_reserve_bytes(args: DecoderArgs, config: EngineConfig, dtype: torch.dtype) -> int:
    """A generous estimate of the peak activations of one step (kept free of KV cache on CUDA)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    tokens = config.max_num_batched_tokens
    layout = args.layout  # this TP rank's share of the heads and MLP columns
    per_token = (4 * args.hidden_size + 3 * layout.intermediate_size + 2 * layout.num_heads * args.head_dim) * itemsize
    logits = config.max_num_seqs * args.vocab_size * 4 * 4  # fp32 logits, log-softmax, noise, sort
    return tokens * per_token + logits + 2**30


def num_blocks_for_memory(args: DecoderArgs, config: EngineConfig, dtype: torch.dtype, device: torch.device) -> int:
    """KV blocks that fit: `num_kv_blocks` if set; CUDA: `gpu_memory_utilization`; CPU: `kv_cache_bytes`."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = block_bytes(args, config.block_size, dtype)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = int(total * config.gpu_memory_utilization) - (total - free)
        budget -= activation_reserve_bytes(args, config, dtype)
    else:
        budget = config.kv_cache_bytes
    # More blocks than `max_num_seqs` full-length sequences can hold at once are never needed together (beyond
    # prefixes kept for reuse); capping saves allocating and zeroing tens of GiB at every wake in RL training.
    most_needed = config.max_num_seqs * -(-config.max_model_len // config.block_size)
    num_blocks = min(budget // per_block, most_needed)
    if num_blocks < 1:
        raise ValueError(
            f"no room for the KV cache: budget {budget / 2**20:.0f} MiB, one block needs {per_block / 2**20:.2f} "
            "MiB. Raise gpu_memory_utilization (CUDA) or kv_cache_bytes (CPU), or lower max_num_batched_tokens."
        )
    logger.info(
        "KV cache: %d blocks of %d tokens (%.1f MiB)", num_blocks, config.block_size, num_blocks * per_block / 2**20
    )
    return int(num_blocks)


class KVCache:
    def __init__(
        self, args: DecoderArgs, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.shape = (2, args.num_layers, num_blocks + 1, block_size, args.layout.num_kv_heads, args.head_dim)
        self.dtype, self.device = dtype, device
        self.scratch_block = num_blocks
        self.data: torch.Tensor | None = None
        self.layers: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.allocate()

    @property
    def allocated(self) -> bool:
        return self.data is not None

    def allocate(self) -> None:
        if self.data is None:
            if self.device.type == "cuda":
                # Hand training's cached (free) segments back first, so that the cache is a fresh allocation of
                # the same size after the same history every step: it then tends to land where it was, and the
                # CUDA graphs, which hold its address, are kept instead of captured again.
                torch.cuda.empty_cache()
            self.data = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
            self.layers = [(self.data[0, i], self.data[1, i]) for i in range(self.shape[1])]

    def free(self) -> None:
        self.data, self.layers = None, []
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
