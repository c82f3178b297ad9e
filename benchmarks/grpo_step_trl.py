"""TRL's sides of `grpo_step.py`: the same GRPO step in TRL's `GRPOTrainer`, timed per optimizer step, generating
with `transformers.generate` or with vLLM colocated (`use_vllm=True, vllm_mode="colocate"`: a vLLM engine in the
training process on the same GPU, TRL's own defaults otherwise, e.g. `vllm_gpu_memory_utilization=0.3`, the weights
pushed into vLLM after every optimizer step, and the importance-sampling correction, which asks vLLM for the
sampled tokens' log-probs and runs a forward pass for the old log-probs).

One generation batch = one optimizer step (`per_device_train_batch_size` × `gradient_accumulation_steps` = prompts ×
n, micro-batches of `--micro-batch-size` as hyflow's), β = 0, responses of
exactly `--response-length` tokens (`min_new_tokens`; vLLM: `min_tokens`), bf16 weights as loaded, AdamW with
hyflow's defaults.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def trl_missing(use_vllm: bool = False) -> str | None:
    """Why the TRL side (with vLLM: that side) cannot run, or None."""
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed: pip install trl==1.16.0 datasets==5.2.0 dill multiprocess "
            "(on the device machine: from the wheels in .whl/, see benchmarks/README.md)"
        )
    if use_vllm and not torch.cuda.is_available():
        return "TRL's colocated vLLM needs a CUDA device"
    if use_vllm and importlib.util.find_spec("vllm") is None:
        return "vllm not importable (on the device machine: unpack ../shared/peers' parts, see benchmarks/README.md)"
    return None


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step (TRL generates inside it), the device synchronised at both ends."""

    def __init__(self) -> None:
        self.step_s: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        synchronize()
        self._started = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        synchronize()
        self.step_s.append(time.perf_counter() - self._started)
        print(f"TRL step {len(self.step_s)}: {self.step_s[-1]:.2f} s", flush=True)


def trl_config(args: argparse.Namespace, root: Path, hyperparameters: dict[str, float], use_vllm: bool) -> Any:
    """The same step as hyflow's: one generation batch = one optimizer step, beta = 0, fixed response length."""
    from trl import GRPOConfig

    # never stop early, like hyflow's ignore_eos (vLLM's SamplingParams and transformers' generate name it apart)
    min_length = {"min_tokens" if use_vllm else "min_new_tokens": args.response_length}
    vllm = {"vllm_mode": "colocate"} if use_vllm else {}
    return GRPOConfig(
        output_dir=str(root / "trl"),
        per_device_train_batch_size=args.micro_batch_size,  # micro-batches of one generation batch (prompts x n),
        gradient_accumulation_steps=args.prompts * args.n // args.micro_batch_size,  # all in one optimizer step
        num_generations=args.n,
        max_completion_length=args.response_length,
        generation_kwargs=min_length,
        temperature=1.0,
        beta=0.0,
        learning_rate=hyperparameters["learning_rate"],
        weight_decay=hyperparameters["weight_decay"],
        lr_scheduler_type="constant",  # as hyflow's default
        max_steps=args.steps,
        use_vllm=use_vllm,
        **vllm,
        gradient_checkpointing=False,
        bf16=not args.tiny,
        use_cpu=args.tiny,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )


def run_trl(
    args: argparse.Namespace,
    assets: dict[str, Any],
    root: Path,
    reward_fn: Callable[..., list[float]],
    hyperparameters: dict[str, float],
    use_vllm: bool = False,
) -> dict[str, Any]:
    """Train `--steps` steps of TRL's `GRPOTrainer` on the same model folder and prompts with `reward_fn`
    (generating with colocated vLLM when `use_vllm`); each step's seconds."""
    from datasets import Dataset
    from trl import GRPOTrainer

    dtype = torch.float32 if args.tiny else torch.bfloat16
    dtype_key = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(assets["model"], **{dtype_key: dtype})
    tokenizer = AutoTokenizer.from_pretrained(assets["tokenizer"])
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_fn,
        args=trl_config(args, root, hyperparameters, use_vllm),
        train_dataset=Dataset.from_dict({"prompt": assets["prompts"]}),
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.train()
    return {"step_s": timer.step_s}
