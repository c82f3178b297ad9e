"""vLLM's side of `rollout_throughput.py`: the same cases, prompts and sampling settings in vLLM's offline `LLM`.

The settings of ../shared/peers/README.md (vLLM 0.25.0 on one H200): `LLM(..., skip_tokenizer_init=True,
enable_prefix_caching=True, max_num_seqs=512)` with vLLM's defaults otherwise (the V2 model runner, FlashAttention 3,
torch.compile with full CUDA graphs), `VLLM_USE_FLASHINFER_SAMPLER=0` (flashinfer is not in the packed build);
prompts as token ids, temperature 1, `ignore_eos`, `logprobs=0` (the sampled token's log-prob, which RL needs and
hyflow's engine always returns). tok/s = generated tokens over the wall time of one `llm.generate`.

The weights are vLLM's own random ones (`load_format="dummy"`: only config.json is written), so a 7B shape needs no
15 GB folder on disk; decoding with `ignore_eos` does the same work whatever the weights are. The engine core runs
in its own process (vLLM's default), so `close()` gives all of its GPU memory back before hyflow's side starts.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import os
import tempfile
import time
from typing import Any

logger = logging.getLogger(__name__)


def vllm_missing() -> str | None:
    """Why the vLLM side cannot run here, or None."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return (
            "vllm not importable: on the GPU machine unpack ../shared/peers' two parts "
            "(bash unpack_vllm.sh P1 P2 /tmp/vsite) and put /tmp/vsite on PYTHONPATH (see benchmarks/README.md)"
        )
    return None


class VLLMGenerator:
    """One vLLM engine for one model shape; `run` generates one case's prompts and returns generated tokens/s."""

    def __init__(self, hf_config: Any, max_model_len: int, gpu_memory_utilization: float = 0.85) -> None:
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # this process may have touched CUDA already
        from vllm import LLM

        self._folder = tempfile.TemporaryDirectory(prefix="hyflow_bench_vllm_")
        hf_config.save_pretrained(self._folder.name)  # config.json only: vLLM draws the weights (dummy)
        self.llm = LLM(
            model=self._folder.name,
            skip_tokenizer_init=True,
            enable_prefix_caching=True,
            max_num_seqs=512,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            load_format="dummy",
            dtype="bfloat16",
            seed=0,
        )
        import vllm

        self.version = vllm.__version__

    def run(self, prompts: list[list[int]], n: int, new_tokens: int) -> float:
        """Generated tokens/s of one `generate` over `prompts` (token ids), `n` samples each, exactly `new_tokens`."""
        from vllm import SamplingParams

        params = SamplingParams(
            n=n, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, logprobs=0, detokenize=False
        )
        requests = [{"prompt_token_ids": prompt} for prompt in prompts]
        start = time.perf_counter()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        generated = sum(len(sample.token_ids) for output in outputs for sample in output.outputs)
        expected = len(prompts) * n * new_tokens
        if generated != expected:  # ignore_eos: anything else means the runs are not the same work
            raise RuntimeError(f"vLLM generated {generated} tokens, expected {expected}")
        return generated / elapsed

    def close(self) -> None:
        """Stop the engine core process (its GPU memory goes with it) and remove the config folder."""
        try:
            self.llm.llm_engine.engine_core.shutdown()
        except Exception:  # an engine that died already has nothing left to stop
            logger.warning("vLLM's engine core did not shut down cleanly", exc_info=True)
        del self.llm
        gc.collect()
        self._folder.cleanup()
