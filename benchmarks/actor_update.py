"""Actor-update throughput: hyflow's training engine against a plain Hugging Face training loop, same data.

    python benchmarks/actor_update.py             # Qwen2-0.5B-shaped model, random weights, CUDA, response 1024
    python benchmarks/actor_update.py --tiny      # a tiny model on CPU: a smoke test that runs anywhere
    torchrun --nproc-per-node 2 benchmarks/actor_update.py   # hyflow data-parallel over 2 GPUs (NCCL)
    torchrun --nproc-per-node 8 benchmarks/actor_update.py --shape 7b --micro-batch-size 4 --gradient-checkpointing
    python benchmarks/actor_update.py --only hyflow --one-rank-fsdp2   # one GPU through FSDP2's root wrapping

Both sides run the same PPO step (vanilla clipped policy loss, token-mean over the mini-batch, micro-batch
gradient accumulation, grad-norm clipping, AdamW) on the same batch, from the same fp32 master weights:

- hyflow: `DataParallelPPOActor` over a `PolicyModel` sharded with FSDP2 (on one rank: without FSDP2, bf16 compute
  copies of the fp32 weights cast once per step, workers/mixed_precision.py; `--one-rank-fsdp2` for FSDP2's root
  wrapping, the path before), bf16 compute with fp32 gradient reduction (`MixedPrecisionPolicy`), padding removed
  (packed rows, varlen flash attention; off with `--no-remove-padding`), its fused Triton kernels (RMSNorm,
  SiLU-and-mul, rotary, the LM head's log-probs; off with `--no-fused-kernels`), LM head only on real response
  tokens;
- plain: `AutoModelForCausalLM` under `torch.autocast(bfloat16)`, full logits, `log_softmax(logits.float())`.

Printed: tokens/s (prompt + response tokens per second of update), the ratio, and MFU against 790 TFLOP/s (the
H200's measured dense bf16 peak), with FLOPs from `hyflow.trainer.flops.estimate_flops` (6·N per token plus
attention) for both sides. On CPU the MFU line is skipped.

Under torchrun with N > 1 processes only hyflow runs (the plain loop has no data parallelism): each rank updates
its own `--batch-size` rows (a global batch N times as large) with FSDP2 sharding over NCCL, and rank 0 prints the
tokens/s per GPU — the number to set beside the one-GPU run's to read the scaling.
"""

from __future__ import annotations

import argparse
import copy
import os
import socket
import time

import torch
import torch.distributed as dist
from shapes import SHAPES
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoModelForCausalLM, Qwen2Config

from hyflow import fields as F
from hyflow.algorithms import compute_policy_loss_vanilla
from hyflow.config.actor_rollout_ref import ActorConfig
from hyflow.config.common import FSDPConfig
from hyflow.models.kernels import apply_fused_kernels
from hyflow.models.policy import PolicyModel
from hyflow.protocol import DataProto
from hyflow.trainer.flops import estimate_flops
from hyflow.workers.actor import DataParallelPPOActor
from hyflow.workers.builders import enable_gradient_checkpointing
from hyflow.workers.fsdp import apply_fsdp2, build_device_mesh, training_device
from hyflow.workers.optim import build_optimizer

H200_PEAK_FLOPS = 790e12


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (smoke test)")
    parser.add_argument("--shape", choices=sorted(set(SHAPES) - {"tiny"}), default="0.5b", help="the model's shape")
    parser.add_argument("--batch-size", type=int, default=32, help="sequences per mini-batch (one optimizer step)")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after --warmup untimed ones)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--ragged", action="store_true", help="variable prompt / response lengths (padded)")
    parser.add_argument("--only", choices=["hyflow", "plain"], default=None, help="time one side only")
    parser.add_argument("--no-fused-kernels", action="store_true", help="hyflow without its Triton kernels")
    parser.add_argument("--no-remove-padding", action="store_true", help="hyflow runs the padded batch")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of one step of each side")
    parser.add_argument(
        "--one-rank-fsdp2",
        action="store_true",
        help="on one rank, wrap the root with FSDP2 (the path before workers/mixed_precision.py) instead of its "
        "bf16 compute copies cast once per step",
    )
    args = parser.parse_args(argv)
    if args.tiny:
        args.batch_size, args.micro_batch_size = 4, 2
        args.prompt_length, args.response_length = 8, 16
        args.steps, args.warmup = 2, 1
    return args


def model_config(shape: str) -> Qwen2Config:
    """A shape of `shapes.SHAPES` (random weights), e.g. Qwen2-0.5B's: 24 layers, hidden 896, 14 / 2 heads."""
    return Qwen2Config(**{"rope_theta": 1000000.0, **SHAPES[shape]}, max_position_embeddings=32768)


def make_batch(args: argparse.Namespace, vocab_size: int, rank: int = 0) -> DataProto:
    """Random tokens, advantages and old log-probs (drawn per rank); full-length rows, or with `--ragged`
    left-padded prompts of P/2..P tokens and right-padded responses of 1..R tokens (uniform), as RL batches are."""
    g = torch.Generator().manual_seed(rank)
    rows, prompt_length, response_length = args.batch_size, args.prompt_length, args.response_length
    input_ids = torch.randint(0, vocab_size, (rows, prompt_length + response_length), generator=g)
    if args.ragged:
        prompt_lens = torch.randint(prompt_length // 2, prompt_length + 1, (rows, 1), generator=g)
        response_lens = torch.randint(1, response_length + 1, (rows, 1), generator=g)
    else:
        prompt_lens, response_lens = torch.full((rows, 1), prompt_length), torch.full((rows, 1), response_length)
    prompt_mask = torch.arange(prompt_length) >= prompt_length - prompt_lens
    response_mask = (torch.arange(response_length) < response_lens).long()
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    return DataProto.from_dict(
        {
            F.INPUT_IDS: input_ids,
            F.ATTENTION_MASK: attention_mask,
            F.POSITION_IDS: (attention_mask.cumsum(-1) - 1).clamp_min(0),
            F.RESPONSES: input_ids[:, prompt_length:].clone(),
            F.RESPONSE_MASK: response_mask,
            F.OLD_LOG_PROBS: -torch.rand(rows, response_length, generator=g) - 11.0,
            F.ADVANTAGES: torch.randn(rows, response_length, generator=g),
        },
        meta_info={F.TEMPERATURE: 1.0},
    )


def init_process_group() -> int:
    """FSDP2 needs a process group: torchrun's (rank r on GPU r), else a world of one on this machine; returns the
    world size."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return dist.get_world_size()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    return 1


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if dist.get_world_size() > 1:
        dist.barrier()  # a data-parallel step ends when the slowest rank ends


def timed(step, args: argparse.Namespace) -> float:
    """Seconds per step, after warmup."""
    for _ in range(args.warmup):
        step()
    synchronize()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    synchronize()
    return (time.perf_counter() - start) / args.steps


def print_profile(step, name: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
        synchronize()
    if dist.get_rank() != 0:
        return
    sort_by = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(f"--- {name}: top ops of one step ---")
    print(prof.key_averages().table(sort_by=sort_by, row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


def hyflow_step_fn(args, lm, data):
    config = ActorConfig(ppo_micro_batch_size_per_gpu=args.micro_batch_size, ppo_epochs=1)
    config.optim.lr = 1e-6
    fused = not args.no_fused_kernels
    if fused:
        apply_fused_kernels(lm)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(lm)
    policy = PolicyModel(lm, use_fused_kernels=fused, remove_padding=not args.no_remove_padding)
    mesh = build_device_mesh()
    if args.one_rank_fsdp2 and mesh.size() == 1 and torch.cuda.is_available():
        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        policy = fully_shard(policy.to(training_device()), mesh=mesh, reshard_after_forward=False, mp_policy=bf16)
    else:
        policy = apply_fsdp2(policy, FSDPConfig(), mesh)
    actor = DataParallelPPOActor(config, policy, build_optimizer(policy.parameters(), config.optim), args.batch_size)
    return lambda: actor.update_policy(data)


def plain_step_fn(args, lm, data):
    """The loop a user would write: autocast bf16, full logits, fp32 log-softmax, accumulate, clip, AdamW."""
    device = next(lm.parameters()).device
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(lm)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-6, weight_decay=0.01)
    config = ActorConfig()
    batch = data.batch.to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    response_length = args.response_length

    def step() -> None:
        num_tokens = batch[F.RESPONSE_MASK].sum()
        for micro in batch.split(args.micro_batch_size):
            with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
                logits = lm(
                    input_ids=micro[F.INPUT_IDS],
                    attention_mask=micro[F.ATTENTION_MASK],
                    position_ids=micro[F.POSITION_IDS],
                ).logits
            log_softmax = torch.log_softmax(logits[:, -response_length - 1 : -1].float(), dim=-1)
            log_probs = log_softmax.gather(-1, micro[F.RESPONSES].unsqueeze(-1)).squeeze(-1)
            loss, _ = compute_policy_loss_vanilla(
                micro[F.OLD_LOG_PROBS], log_probs, micro[F.ADVANTAGES], micro[F.RESPONSE_MASK].float(),
                "token-mean", config, batch_num_tokens=num_tokens,
            )  # fmt: skip
            loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    args = parse_args()
    world_size = init_process_group()
    if world_size > 1:
        args.only = "hyflow"
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    config = model_config("tiny" if args.tiny else args.shape)
    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config)  # fp32 master weights
    data = make_batch(args, config.vocab_size, dist.get_rank())
    seq_lens = data.batch[F.ATTENTION_MASK].sum(-1).tolist()  # real (non-padding) tokens: the useful work
    tokens = sum(seq_lens)
    flops = estimate_flops(config, seq_lens, training=True)
    params = sum(p.numel() for p in base.parameters()) / 1e6
    padded = data.batch[F.INPUT_IDS].numel()
    log = print if dist.get_rank() == 0 else (lambda *a, **k: None)
    log(f"model: {params:.1f}M params on {device}; {tokens} real tokens/step per rank ({padded} with padding)")
    if world_size > 1:
        log(f"data-parallel over {world_size} ranks: tokens/s and MFU below are per GPU")
    results = {}
    for name, build in (("plain", plain_step_fn), ("hyflow", hyflow_step_fn)):
        if args.only not in (None, name):
            continue
        lm = copy.deepcopy(base)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        step = build(args, lm, copy.deepcopy(data))
        seconds = timed(step, args)
        if args.profile:
            print_profile(step, name)
        results[name] = seconds
        memory = f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else ""
        mfu = f", MFU {flops / seconds / H200_PEAK_FLOPS:.1%}" if device.type == "cuda" else ""
        log(f"{name:>6}: {seconds * 1000:8.1f} ms/step, {tokens / seconds:10.0f} tokens/s{mfu}{memory}")
        del lm
    if len(results) == 2:
        log(f"ratio hyflow / plain: {results['plain'] / results['hyflow']:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
