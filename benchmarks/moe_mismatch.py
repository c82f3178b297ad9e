"""Train–inference mismatch of a mixture-of-experts policy with routing replay off and on (R3), over a few GRPO steps.

    python benchmarks/moe_mismatch.py                 # GPU, bf16: a small Qwen3-MoE (64 experts, 8 per token)
    python benchmarks/moe_mismatch.py --tiny          # CPU smoke test: fp32, the tiny MoE, 2 steps

The same GRPO run twice — `actor_rollout_ref.actor.router_replay.mode=disabled`, then `R3` — with the old-log-prob
pass on (`recompute_old_log_prob=True`, so the trainer scores the engine's tokens before any update) and truncated
token IS on (`rollout_correction.rollout_is=token`, which reports the KL between the two). Per step it prints
`training/rollout_probs_diff_{mean,max}` (|p_engine − p_trainer| over response tokens) and `rollout_corr/kl_k3`
(mean of r − 1 − log r, r = p_trainer / p_engine). The model has random weights (transformers' init): its routers
are nearly flat, so top-k near-ties are everywhere — a harsh case for mismatch, which is what replay addresses.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch
from grpo_step_hyflow import timed_run_overrides  # this script's folder
from grpo_step_measure import isolated_process_state
from transformers import AutoConfig, AutoModelForCausalLM

from hyflow.data.prepare import prepare_task
from hyflow.models.tiny import build_tiny_tokenizer, save_tokenizer

# a small Qwen3-MoE: Qwen3-30B-A3B's routing (64 of its 128 experts' count halved, 8 per token) at 0.6B parameters
SMALL_MOE = dict(
    hidden_size=1024, intermediate_size=3072, moe_intermediate_size=512, num_hidden_layers=8, num_attention_heads=16,
    num_key_value_heads=4, head_dim=64, num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
)  # fmt: skip
TINY_MOE = dict(
    hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True,
)  # fmt: skip
METRICS = ("training/rollout_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/kl_k3")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: the tiny MoE in fp32, 2 steps")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps per mode")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--response-length", type=int, default=128, help="new tokens per sample (ignore_eos)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.steps, args.prompts, args.n, args.response_length = 2, 4, 2, 8
    if args.steps < 1 or args.prompts < 1 or args.n < 2:
        parser.error("--steps and --prompts must be at least 1 and --n at least 2 (GRPO groups)")
    return args


def build_model(path: Path, sizes: dict) -> str:
    """A random-weight Qwen3-MoE with hyflow's tiny tokenizer, saved as a Hugging Face folder."""
    tokenizer = build_tiny_tokenizer()
    config = AutoConfig.for_model(
        "qwen3_moe", vocab_size=((len(tokenizer) + 63) // 64) * 64, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, max_position_embeddings=2048, **sizes,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    save_tokenizer(tokenizer, path)
    return str(path)


def overrides(args: argparse.Namespace, model: str, data: dict, root: Path, mode: str) -> list[str]:
    return [
        f"data.train_files={data['train']}",
        f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.prompts * args.n}",
        "actor_rollout_ref.actor.recompute_old_log_prob=True",
        "actor_rollout_ref.actor.use_kl_loss=False",
        f"actor_rollout_ref.actor.router_replay.mode={mode}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[]",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.name=hyflow",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "algorithm.adv_estimator=grpo",
        "algorithm.rollout_correction.rollout_is=token",
        "trainer.backend=local",
        f"trainer.device={'cpu' if args.tiny else 'auto'}",
        *timed_run_overrides(args.steps, root / mode, f"moe_mismatch_{mode}"),
    ]


def run_mode(args: argparse.Namespace, model: str, data: dict, root: Path, mode: str) -> list[dict]:
    from hyflow.config import load_config
    from hyflow.trainer.ppo_trainer import PPOTrainer

    (root / mode).mkdir(parents=True, exist_ok=True)
    with isolated_process_state(root / mode):
        trainer = PPOTrainer(load_config(overrides(args, model, data, root, mode)))
        try:
            trainer.init_workers()
            trainer.fit()
        finally:
            trainer.close()
        with (trainer.tracking.log_dir / "metrics.jsonl").open() as f:
            return [{key: json.loads(line)["data"].get(key) for key in METRICS} for line in f]


def main() -> None:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="hyflow_moe_mismatch_") as tmp:
        root = Path(tmp)
        model = build_model(root / "model", TINY_MOE if args.tiny else SMALL_MOE)
        data = prepare_task("arith", root / "data", seed=0, train_size=args.prompts * args.steps, test_size=4)
        device = "cpu" if args.tiny or not torch.cuda.is_available() else torch.cuda.get_device_name()
        print(f"device {device}; {args.steps} steps of {args.prompts} prompts x {args.n} -> {args.response_length}")
        for mode in ("disabled", "R3"):
            steps = run_mode(args, model, data, root, mode)
            for step, metrics in enumerate(steps, 1):
                shown = ", ".join(
                    f"{key.split('/')[-1]} {value:.3g}" for key, value in metrics.items() if value is not None
                )
                print(f"router_replay={mode} step {step}: {shown}", flush=True)
            kl = [m["rollout_corr/kl_k3"] for m in steps if m["rollout_corr/kl_k3"] is not None]
            diff = [m["training/rollout_probs_diff_max"] for m in steps]
            if kl:
                print(f"router_replay={mode}: kl_k3 mean {statistics.mean(kl):.3g}, probs_diff_max max {max(diff):.3g}")


if __name__ == "__main__":
    main()
