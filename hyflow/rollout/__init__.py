"""hyflow's generation engine: continuous batching over a paged KV cache with prefix sharing, per-request sampling
with seeds and log-probs, a batch API and an async API, in-place weight updates, and sleep/wake.

    from hyflow.rollout import LLMEngine, AsyncLLMEngine, EngineConfig, SamplingParams
    engine = LLMEngine("path/to/hf_folder", EngineConfig(gpu_memory_utilization=0.5))
    outputs = engine.generate([[1, 5, 9]], SamplingParams(n=4, temperature=1.0, max_tokens=256))

Files, one noun each: config (EngineConfig, SamplingParams), sequence, block_manager, kv_cache, scheduler, sampler,
attention, model_runner, multi_step (decode windows), cuda_graphs, triton_kernels, models/ (Llama, Mistral, Qwen2,
Qwen3), parallel (tensor parallelism), engine, async_engine, worker_rollout + hf_rollout + batch (the trainer's
rollout), server (`hyflow serve`), generate (`hyflow generate`).
"""

from hyflow.rollout.async_engine import AsyncLLMEngine
from hyflow.rollout.config import EngineConfig, SamplingParams
from hyflow.rollout.engine import LLMEngine
from hyflow.rollout.sequence import CompletionOutput, RequestOutput

__all__ = ["AsyncLLMEngine", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams"]
