"""Settings of the generation engine (`EngineConfig`) and of one request (`SamplingParams`), checked on creation."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any, Literal

MAX_TOP_LOG_PROBS = 20  # alternatives per token a request may ask for (OpenAI's limit)


def _unknown_key_error(kind: str, key: str, allowed: list[str]) -> ValueError:
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {kind} parameter {key!r}.{hint} Allowed: {sorted(allowed)}")


@dataclass
class SamplingParams:
    """How to sample one request. temperature=0 means greedy; top_k<=0 and top_p=1 switch those filters off.

    Generation stops at an EOS token (unless `ignore_eos`), at a token of `stop_token_ids`, or at the token that
    completes a string of `stop` (needs the engine's tokenizer); the output keeps that last token.
    `seed` makes the request reproducible on its own, whatever else is in the batch; the `n` samples of one request
    get seeds derived from it. `raw_log_probs=True` also returns the log-prob of each token under the model's
    unmodified distribution (log_softmax of the logits), next to the one of the distribution actually sampled from.
    `top_log_probs=k` also returns, for every sampled token, the k most likely tokens and their log-probs under the
    distribution sampled from (the one `log_probs` uses), most likely first (at most MAX_TOP_LOG_PROBS).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    raw_log_probs: bool = False
    top_log_probs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        checks = [
            ("n", self.n >= 1, "must be >= 1"),
            ("temperature", self.temperature >= 0, "must be >= 0 (0 = greedy)"),
            ("top_p", 0 < self.top_p <= 1, "must be in (0, 1] (1 = off)"),
            ("top_k", self.top_k == -1 or self.top_k >= 0, "must be -1 or 0 (off) or a positive count"),
            ("max_tokens", self.max_tokens >= 1, "must be >= 1"),
            ("top_log_probs", 0 <= self.top_log_probs <= MAX_TOP_LOG_PROBS, f"must be in [0, {MAX_TOP_LOG_PROBS}]"),
        ]
        for key, ok, rule in checks:
            if not ok:
                raise ValueError(f"sampling parameter {key}={getattr(self, key)!r} is invalid: it {rule}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        """SamplingParams from a dict, rejecting unknown keys with a suggestion."""
        allowed = [f.name for f in fields(cls)]
        for key in values:
            if key not in allowed:
                raise _unknown_key_error("sampling", key, allowed)
        return cls(**values)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class EngineConfig:
    """Sizes and switches of the engine.

    KV cache size: `num_kv_blocks` when given; else on CUDA `gpu_memory_utilization` of the device's memory minus
    what is in use after loading the model; else (CPU) `kv_cache_bytes`; in both cases at most what `max_num_seqs`
    sequences of `max_model_len` tokens fill. `max_model_len` defaults to the model's `max_position_embeddings`.

    `num_scheduler_steps` (multi-step decode): when a step is a pure decode, the engine runs up to this many decode
    steps back to back on the device and syncs with the host once, at the end of the window (see multi_step.py).
    Outputs are identical for any value; 1 is one host round trip per token. 8 hides most of the host's per-step
    work on CUDA and costs nothing on CPU. Requests that arrive or abort during a window wait for its end.

    `async_scheduling`: the engine queues the next decode window on the device before it reads the current one's
    tokens, so the host appends tokens, checks stops and prepares inputs while the device computes. Outputs are
    identical; a sequence that stops mid-window wastes its row of the next window. False: one window at a time.

    `partial_rollout_kv`: what a weight load does to the KV cache of the sequences still running (a partial rollout,
    see `LLMEngine.pause`): "recompute" re-prefills each one's prompt and tokens so far under the new weights, so
    every later token is exactly what the new policy gives for that context; "keep" continues on the cached K/V of
    the old weights (no re-prefill; later tokens attend to stale keys and values, so their log-probs match neither
    policy's re-score exactly). Cached prefixes are forgotten either way.

    `record_routing`: a mixture-of-experts model records the experts each MoE layer chose for every token it computes
    (routing_cache.py); each finished sample's `CompletionOutput.routed_experts` holds them. Off: no cost.

    `tensor_parallel_size` > 1 splits the model over that many processes (one per device) of a torch.distributed
    group (parallel.py); every process of the group must make the same calls with the same requests (SPMD).
    """

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: max(16384, max_model_len)
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    kv_cache_bytes: int = 256 * 2**20
    num_kv_blocks: int | None = None
    enable_prefix_caching: bool = True
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    enforce_eager: bool = False  # True: no CUDA graphs
    cuda_graph_max_batch: int = 512
    num_scheduler_steps: int = 8
    async_scheduling: bool = True
    tensor_parallel_size: int = 1
    seed: int = 0
    partial_rollout_kv: Literal["recompute", "keep"] = "recompute"
    record_routing: bool = False

    def __post_init__(self) -> None:
        positive = [
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "kv_cache_bytes",
            "num_scheduler_steps",
            "tensor_parallel_size",
        ]
        for key in positive:
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"engine setting {key}={getattr(self, key)!r} must be >= 1")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={self.gpu_memory_utilization!r} must be in (0, 1]")
        dtypes = ["auto", "float32", "bfloat16", "float16"]
        if self.dtype not in dtypes:
            raise ValueError(f"engine dtype={self.dtype!r} is not one of {dtypes}")
        if self.partial_rollout_kv not in ("recompute", "keep"):
            raise ValueError(
                f"engine partial_rollout_kv={self.partial_rollout_kv!r} is not one of ['recompute', 'keep'] "
                "(what a weight load does to the KV cache of running sequences)"
            )

    def check_model_len(self, model_max_positions: int) -> int:
        """The effective max_model_len, checked against the token budget; sets and returns it."""
        if self.max_model_len is None:
            self.max_model_len = model_max_positions
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = max(16384, self.max_model_len)
        if self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is smaller than max_model_len="
                f"{self.max_model_len}: a full-length prompt could never be prefilled. Raise max_num_batched_tokens "
                "or lower max_model_len."
            )
        return self.max_model_len
