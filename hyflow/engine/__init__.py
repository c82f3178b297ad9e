"""hyflow's generation engine: continuous batching over a paged KV cache with prefix sharing, per-request sampling
with seeds and log-probs, a batch API and an async API, in-place weight updates, and sleep/wake. It takes token ids
and returns token ids; it knows nothing of the trainer (no `DataProto`, no field names), so it can be used and read
on its own.

    from hyflow.engine import LLMEngine, AsyncLLMEngine, EngineConfig, SamplingParams
    engine = LLMEngine("path/to/hf_folder", EngineConfig(gpu_memory_utilization=0.5))
    outputs = engine.generate([[1, 5, 9]], SamplingParams(n=4, temperature=1.0, max_tokens=256))

Files, one noun each: config (EngineConfig, SamplingParams), sequence, block_manager, kv_cache, scheduler, sampler,
attention, model_runner, decode_window (the in-flight window of the async hand-off), multi_step (a decode window's
steps), routing_cache (a MoE model's routing record), cuda_graphs, triton_kernels / triton_rope / triton_step,
models/ (Llama, Mistral, Qwen2, Qwen3), parallel (tensor parallelism), engine, async_engine. The trainer's
adapters live in `hyflow.rollout`; the HTTP server in `hyflow.serving`.
"""

from hyflow.engine.async_engine import AsyncLLMEngine
from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine
from hyflow.engine.sequence import CompletionOutput, RequestOutput

__all__ = ["AsyncLLMEngine", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
