"""`hyflow demo`: RL post-training end to end on whatever this machine has, with nothing downloaded.

    hyflow demo                                  # arith task, tiny model, CPU or GPU: a few minutes
    hyflow demo --task countdown --model-size small --grpo-steps 60 --output runs/demo
    hyflow demo --sft-steps 0                    # GRPO straight from the random model (it will not learn)
    hyflow demo --task tools                     # tool calling: SFT on calculator traces, GRPO through the agent loop
    hyflow demo --task openai_agent              # the same, the tool run by an openai-client agent program
    hyflow demo --task vision                    # a tiny vision-language model reads pictures (hyflow/demos/vision.py)

What it does, in order (everything lands under `--output`, by default `hyflow-demo/<task>/`, so that each task
keeps its own model and data):
1. builds hyflow's tiny tokenizer and a randomly initialised Qwen2-shaped model (`hyflow.models.tiny`);
2. writes the synthetic task (`hyflow.data.prepare`): prompts such as `Compute 7 + 5. Put the answer in
   <answer></answer>.`, a rule-based reward, and a reference answer per row;
3. SFT (`hyflow.trainer.sft_trainer`) on the reference answers, stopped early, so the model knows the answer
   format and is *partly* right;
4. GRPO (`hyflow.trainer.ppo_trainer`) on the same prompts with the task reward: per step it samples a group of
   answers per prompt, scores them, and pushes the policy towards the better ones;
5. prints one row per step (SFT loss; GRPO mean reward, validation accuracy, calculator calls per episode for the
   agent tasks) and a summary under the names README quotes, and saves the curves as
   `curves.png` (with matplotlib) or `curves.csv`;
6. leaves the models as Hugging Face folders, which `hyflow train`, `hyflow serve` and `from_pretrained` load:
   `sft/huggingface` (after SFT) and `grpo/huggingface` (after GRPO).

Validation samples four answers per test prompt at temperature 1, as training does (`val_kwargs`), and reports
their mean accuracy (`val-core/<task>/acc/mean@4`): the accuracy of the policy as it is, which is what GRPO
improves. Everything is seeded; on a 2-core CPU the default run takes a few minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyflow.demos import openai_agent, tools, vision

logger = logging.getLogger(__name__)

# Model shapes (hidden size, layers, heads, KV heads, MLP width); all use the tiny tokenizer (~520 tokens).
MODEL_SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=192),
    "small": dict(hidden_size=128, num_layers=4, num_attention_heads=4, num_key_value_heads=2, intermediate_size=384),
    "base": dict(hidden_size=256, num_layers=6, num_attention_heads=8, num_key_value_heads=4, intermediate_size=768),
}
# Difficulty per task: hard enough that a short SFT leaves the model partly right, so GRPO has room to improve.
TASK_OPTIONS: dict[str, dict[str, Any]] = {
    "arith": dict(num_digits=1, num_operands=2, operators="+-"),
    "countdown": dict(num_numbers=3, max_number=9),
    tools.TASK: dict(num_digits=tools.NUM_DIGITS),  # calculator traces; see hyflow/demos/tools.py
    vision.TASK: vision.TASK_OPTIONS,  # pictures of shapes; see hyflow/demos/vision.py
    openai_agent.TASK: dict(num_digits=tools.NUM_DIGITS),  # see hyflow/demos/openai_agent.py
}
DEFAULT_OUTPUT_ROOT = "hyflow-demo"  # each task writes into DEFAULT_OUTPUT_ROOT/<task> unless --output says otherwise
MAX_PROMPT_LENGTH = 64
SFT_WINDOW = 10  # steps over which the SFT loss is averaged for the early stop
VAL_SAMPLES = 4  # answers per validation prompt: accuracy is their mean (mean@4), less noisy than one sample
MAX_RESPONSE_LENGTH = {
    "arith": 12,
    "countdown": 24,
    tools.TASK: tools.MAX_RESPONSE_LENGTH,
    vision.TASK: vision.MAX_RESPONSE_LENGTH,
    openai_agent.TASK: tools.MAX_RESPONSE_LENGTH,
}


@dataclass
class DemoPlan:
    """The sizes of one demo run (from the command line)."""

    task: str = "arith"
    model_size: str = "tiny"
    sft_steps: int = 400  # at most; SFT stops earlier once the loss reaches sft_target_loss
    sft_target_loss: float = 0.17  # mean SFT loss over the last SFT_WINDOW steps that counts as "partly right"
    grpo_steps: int = 80
    output: str = ""  # "" means hyflow-demo/<task> (`default_output`)
    device: str = "auto"
    seed: int = 0
    train_size: int = 4000
    test_size: int = 200
    sft_batch_size: int = 64
    sft_lr: float = 3e-3
    grpo_prompts: int = 64  # prompts per GRPO step
    grpo_samples: int = 8  # answers per prompt (the group)
    grpo_lr: float = 1e-3
    test_freq: int = 5
    threads: int = 0  # 0: one CPU thread per 2 cores (tiny models gain nothing from more)

    def __post_init__(self) -> None:
        self.output = self.output or default_output(self.task)


def default_output(task: str) -> str:
    """The folder a task writes into when `--output` is not given: one per task, so that no run reuses another
    task's model (README's `hyflow train` line reads the arith task's)."""
    return f"{DEFAULT_OUTPUT_ROOT}/{task}"


def resolve_device(device: str) -> str:
    """The device to use: `auto` picks CUDA when a GPU is visible; `cpu` also hides the GPUs from this process."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything initialises CUDA
        return "cpu"
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device auto or cpu.")
    return "cuda" if torch.cuda.is_available() else "cpu"


def build_assets(plan: DemoPlan, out: Path) -> tuple[str, dict[str, str]]:
    """The untrained model folder and the task's train/test parquet files."""
    from hyflow.data.prepare import prepare_task
    from hyflow.models.tiny import build_tiny_model

    if plan.task == tools.TASK:
        return tools.build_assets(plan, out, MODEL_SIZES[plan.model_size], **TASK_OPTIONS[plan.task])
    if plan.task == vision.TASK:
        return vision.build_assets(plan, out)
    if plan.task == openai_agent.TASK:
        return openai_agent.build_assets(plan, out, MODEL_SIZES[plan.model_size], **TASK_OPTIONS[plan.task])
    model = build_tiny_model(out / "base_model", arch="qwen2", seed=plan.seed, **MODEL_SIZES[plan.model_size])
    options = dict(train_size=plan.train_size, test_size=plan.test_size, **TASK_OPTIONS[plan.task])
    data = prepare_task(plan.task, out / "data", seed=plan.seed, **options)
    return model, data


def sft_overrides(plan: DemoPlan, model: str, data: dict[str, str], out: Path) -> list[str]:
    return [
        f"data.train_files={data['train']}",
        "data.response_key=extra_info.answer",
        f"data.train_batch_size={plan.sft_batch_size}",
        f"data.micro_batch_size_per_gpu={plan.sft_batch_size}",
        f"data.max_length={MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH[plan.task]}",
        f"model.path={model}",
        f"optim.lr={plan.sft_lr}",
        "optim.lr_warmup_steps_ratio=0.1",
        "optim.lr_scheduler_type=constant",
        "optim.weight_decay=0.0",
        f"trainer.total_training_steps={plan.sft_steps}",
        "trainer.logger=[]",
        "trainer.save_freq=0",
        "trainer.resume_mode=disable",
        f"trainer.seed={plan.seed}",
        f"trainer.default_local_dir={out / 'sft'}",
    ]


def grpo_overrides(plan: DemoPlan, model: str, data: dict[str, str], out: Path, device: str) -> list[str]:
    response_length = MAX_RESPONSE_LENGTH[plan.task]
    return [
        f"data.train_files={data['train']}",
        f"data.val_files={data['test']}",
        f"data.train_batch_size={plan.grpo_prompts}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={response_length}",
        f"data.seed={plan.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, plan.grpo_prompts // 2)}",  # two updates per step
        f"actor_rollout_ref.actor.optim.lr={plan.grpo_lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.betas=[0.9,0.99]",  # a shorter second-moment memory: steadier RL steps
        "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.rollout.n={plan.grpo_samples}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=True",
        "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        f"actor_rollout_ref.rollout.val_kwargs.n={VAL_SAMPLES}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "trainer.backend=local",
        f"trainer.device={device}",
        f"trainer.total_training_steps={plan.grpo_steps}",
        "trainer.val_before_train=True",
        f"trainer.test_freq={plan.test_freq}",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[]",
        "trainer.project_name=hyflow-demo",
        f"trainer.experiment_name=grpo-{plan.task}",
        f"trainer.seed={plan.seed}",
        f"trainer.default_local_dir={out / 'grpo'}",
    ]


def run_sft_phase(plan: DemoPlan, model: str, data: dict[str, str], out: Path, table: Any) -> str:
    """Supervised warm-up on the reference answers; returns the Hugging Face folder of the SFT model."""
    from hyflow.config.sft import load_sft_config
    from hyflow.demos.plot import CurvePoint
    from hyflow.trainer.sft_trainer import HF_DIR, SFTTrainer

    overrides = sft_overrides(plan, model, data, out)
    if plan.task in (tools.TASK, openai_agent.TASK):  # the same traces
        overrides = tools.sft_overrides(overrides)
    if plan.task == vision.TASK:
        overrides = vision.sft_overrides(overrides)
    trainer = SFTTrainer(load_sft_config(overrides))
    every = max(1, plan.sft_steps // 10)
    losses: list[float] = []

    def report(step: int, metrics: dict[str, float]) -> bool:
        """Add a table row now and then; stop once the recent mean loss reaches the target (partly right)."""
        losses.append(metrics["train/loss"])
        recent = losses[-SFT_WINDOW:]
        done = len(recent) == SFT_WINDOW and sum(recent) / SFT_WINDOW <= plan.sft_target_loss
        if step % every == 0 or done or step == plan.sft_steps:
            table.add(CurvePoint("sft", step, train_loss=metrics["train/loss"], seconds=metrics["timing_s/step"]))
        return done

    trainer.fit(on_step=report)
    return str(out / "sft" / HF_DIR)


def final_save_overrides(base: list[str], plan: DemoPlan) -> list[str]:
    """`base` with one checkpoint, of the policy's weights only, at the end of the run (`trainer.save_freq` = the
    step count: `is_save_step` saves then and at the last step)."""
    save = {"trainer.save_freq": plan.grpo_steps, "actor_rollout_ref.actor.checkpoint.save_contents": "[model]"}
    return tools.with_overrides(base, save)


def export_policy(checkpoints: Path, step: int) -> str:
    """The policy of the checkpoint `checkpoints/global_step_<step>` written as a Hugging Face folder,
    `checkpoints/huggingface` (replacing one an earlier run left); returns its path."""
    import shutil

    from hyflow.trainer.checkpoint_manager import ACTOR_DIR, is_complete
    from hyflow.trainer.sft_trainer import HF_DIR
    from hyflow.workers.merge import merge_checkpoint

    saved = checkpoints / f"global_step_{step}"
    if not is_complete(saved):
        raise RuntimeError(f"GRPO ended at step {step} without a complete checkpoint {saved}; nothing to export.")
    folder = checkpoints / HF_DIR
    shutil.rmtree(folder, ignore_errors=True)
    return merge_checkpoint(str(saved / ACTOR_DIR), str(folder))


def run_grpo_phase(plan: DemoPlan, model: str, data: dict[str, str], out: Path, device: str, table: Any) -> str:
    """GRPO with the task reward, from the SFT model; the table receives every step's metrics. Returns the Hugging
    Face folder of the trained policy (`grpo/huggingface`)."""
    from hyflow.config import load_config
    from hyflow.trainer.ppo_trainer import PPOTrainer

    overrides = final_save_overrides(grpo_overrides(plan, model, data, out, device), plan)
    if plan.task == tools.TASK:
        overrides = tools.grpo_overrides(overrides)
    if plan.task == vision.TASK:
        overrides = vision.grpo_overrides(overrides)
    if plan.task == openai_agent.TASK:
        overrides = openai_agent.grpo_overrides(overrides)
    config = load_config(overrides)
    trainer = PPOTrainer(config)
    try:
        trainer.init_workers()
        trainer.tracking.loggers["demo"] = table  # the demo's compact table is one more tracking backend
        trainer.fit()
    finally:
        trainer.close()
    return export_policy(out / "grpo", trainer.global_step)


def run_demo(plan: DemoPlan) -> list[Any]:
    """The whole demo; returns the table's rows (one per reported step)."""
    import torch

    from hyflow.demos.plot import DemoTable, save_curves, summary

    started = time.perf_counter()
    device = resolve_device(plan.device)
    if device == "cpu":
        torch.set_num_threads(plan.threads or max(1, (os.cpu_count() or 2) // 2))
    out = Path(plan.output).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"hyflow demo: task={plan.task} model={plan.model_size} device={device} output={out}", flush=True)
    model, data = build_assets(plan, out)
    table = DemoTable(phase="sft")
    if plan.sft_steps > 0:
        model = run_sft_phase(plan, model, data, out, table)
    table.phase = "grpo"
    if plan.grpo_steps > 0:
        model = run_grpo_phase(plan, model, data, out, device, table)
    curves = save_curves(table.rows, out, title=f"hyflow demo: GRPO on {plan.task}")
    print(summary(table.rows, time.perf_counter() - started))
    print(f"curves: {curves}")
    print(f"model: {model}")
    return table.rows


# Tasks whose run sizes differ from DemoPlan's (a flag given on the command line still wins).
TASK_PLAN_DEFAULTS: dict[str, dict[str, Any]] = {
    tools.TASK: tools.PLAN_DEFAULTS,
    vision.TASK: vision.PLAN_DEFAULTS,
    openai_agent.TASK: openai_agent.PLAN_DEFAULTS,
}


def task_defaults(task: str) -> dict[str, Any]:
    """DemoPlan's defaults, with the task's own sizes where it has them (`TASK_PLAN_DEFAULTS`)."""
    defaults = dataclasses.asdict(DemoPlan(task=task))
    return {**defaults, **TASK_PLAN_DEFAULTS.get(task, {})}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hyflow demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    arith, with_tools = task_defaults("arith"), task_defaults(tools.TASK)

    def sized(flag: str, kind: type, text: str) -> None:
        """A flag whose default depends on --task (None here: filled in by `plan_from_args`)."""
        name = flag.removeprefix("--").replace("-", "_")
        default = f"{arith[name]}"
        if arith[name] != with_tools[name]:
            default += f"; --task tools: {with_tools[name]}"
        parser.add_argument(flag, type=kind, default=None, help=f"{text} (default: {default})")

    parser.add_argument("--task", choices=sorted(TASK_OPTIONS), default=arith["task"])
    parser.add_argument("--model-size", choices=list(MODEL_SIZES), default=arith["model_size"])
    sized("--sft-steps", int, "at most this many; 0 skips SFT")
    sized("--sft-target-loss", float, f"stop SFT once its mean loss over {SFT_WINDOW} steps is this low (0: never)")
    sized("--grpo-steps", int, "0 skips GRPO")
    parser.add_argument(
        "--output",
        default=None,
        help=f"folder for the models, data, checkpoints, curves (default: {DEFAULT_OUTPUT_ROOT}/<task>)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=arith["device"])
    parser.add_argument("--seed", type=int, default=arith["seed"])
    sized("--train-size", int, "training prompts")
    sized("--test-size", int, "validation prompts")
    sized("--sft-batch-size", int, "examples per SFT step")
    sized("--grpo-prompts", int, "prompts per GRPO step")
    sized("--grpo-samples", int, "answers per prompt")
    sized("--grpo-lr", float, "GRPO learning rate")
    sized("--test-freq", int, "validate every N GRPO steps")
    parser.add_argument("--threads", type=int, default=arith["threads"], help="CPU threads (0: cores / 2)")
    return parser


def plan_from_args(args: argparse.Namespace) -> DemoPlan:
    """The flags given, and the task's defaults for the rest; raises ValueError for a size out of range."""
    plan = DemoPlan(**{**task_defaults(args.task), **{k: v for k, v in vars(args).items() if v is not None}})
    sizes = ("train_size", "test_size", "sft_batch_size", "grpo_prompts", "grpo_samples")
    for name in ("sft_steps", "grpo_steps", *sizes):
        minimum = 0 if name.endswith("steps") else 1
        if getattr(plan, name) < minimum:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(plan, name)} must be >= {minimum}.")
    return plan


def main(argv: list[str] | None = None) -> int:
    """Entry point of `hyflow demo`."""
    args = _parser().parse_args(argv)
    try:
        plan = plan_from_args(args)
    except ValueError as error:
        print(f"hyflow demo: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_demo(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
