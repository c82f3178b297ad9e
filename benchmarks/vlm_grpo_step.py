"""One GRPO step of a vision-language model on image prompts: hyflow's `PPOTrainer` (local backend) on a
Qwen2.5-VL-3B-shaped model with random weights, actor (FSDP2) + reference + generation engine colocated in one
process (nothing downloaded).

    python benchmarks/vlm_grpo_step.py                          # CUDA: Qwen2.5-VL-3B shape, bf16 compute
    python benchmarks/vlm_grpo_step.py --freeze-vision-tower    # the same with the vision encoder frozen
    python benchmarks/vlm_grpo_step.py --tiny                   # CPU: the tiny Qwen2.5-VL shape (a smoke test)

Per step: `--prompts` prompts x `--n` samples; each prompt is one random-noise image of `--image-size` pixels a
side (448: 32 x 32 patches, 256 image tokens after the 2 x 2 merge) followed by `--prompt-length` random text
tokens; responses of `--response-length` tokens (`rollout.ignore_eos`; a sampled vision markup token still ends
a response, so the mean response length is reported too), temperature 1. GRPO advantages, the KL loss to the
reference policy (`use_kl_loss`, low_var_kl, coefficient 0.001; so the ref's forward runs every step), one
optimizer step per batch, AdamW at lr 1e-6, no gradient checkpointing, the generation on hyflow's engine (its
native image prefill: the vision tower on the engine, M-RoPE positions, the `n` samples sharing the image's KV).
The reward is `grpo_step.compute_score` (response characters / 1000).

The model folder holds the random model, a WordLevel tokenizer with one word `t<id>` per id (so random ids
decode; the vision tokens sit at Qwen2.5-VL's ids) and a Qwen2-VL image processor (Pillow backend). Steps 2..N
are measured after step 1's warm-up; printed: the table of `grpo_step.py` (step times, generated tokens/s, peak
memory, each stage's mean) and one JSON line, also written to `$OUT/vlm_grpo_step_<shape>.json` when `$OUT` is set.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers
from grpo_step_hyflow import timed_run_overrides, train_and_time
from grpo_step_measure import measured_side
from grpo_step_report import print_table
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForImageTextToText, PreTrainedTokenizerFast
from vlm_generate import MERGE, PATCH, QWEN25_VL_3B

# The special tokens by name and their ids in Qwen2.5-VL's vocabulary; the tiny shape puts them at its last ids.
SPECIAL_IDS = {
    "<|endoftext|>": 151643, "<|im_end|>": 151645, "<|vision_start|>": 151652, "<|vision_end|>": 151653,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
}  # fmt: skip
# The message's parts in order: an image part as Qwen2-VL's vision markup, a text part as it is.
CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- else %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endfor %}"
)
TINY_TEXT = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, mrope_section=[4, 2, 2]),
)  # fmt: skip
TINY_VISION = dict(
    depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=PATCH,
    spatial_merge_size=MERGE, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[0],
)  # fmt: skip

logger = logging.getLogger("vlm_grpo_step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the tiny Qwen2.5-VL shape and small sizes on the CPU")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps; step 1 is reported as warm-up")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    parser.add_argument("--prompt-length", type=int, default=64, help="text tokens per prompt, besides the image's")
    parser.add_argument("--image-size", type=int, default=448, help="pixels per side (a multiple of 28)")
    parser.add_argument("--response-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=8, help="sequences per update micro-batch")
    parser.add_argument("--log-prob-micro-batch-size", type=int, default=32, help="old / ref log-prob micro-batch")
    parser.add_argument(
        "--master-dtype", choices=["fp32", "bf16"], default="fp32", help="the actor's master weights (FSDP2)"
    )
    parser.add_argument("--freeze-vision-tower", action="store_true", help="actor.freeze_vision_tower=True")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="rollout.gpu_memory_utilization")
    args = parser.parse_args(argv)
    if args.tiny:
        args.prompts, args.n, args.prompt_length, args.image_size, args.response_length = 2, 2, 8, 56, 8
        args.micro_batch_size, args.log_prob_micro_batch_size = 4, 4
    if args.steps < 2:
        parser.error(f"--steps={args.steps}: need at least 2 (step 1 is warm-up, the mean is over steps 2..N)")
    if args.image_size % (PATCH * MERGE):
        parser.error(f"--image-size={args.image_size} must be a multiple of {PATCH * MERGE} (one merged patch)")
    args.backend, args.gpus = "local", 1  # what grpo_step's report reads
    return args


def special_ids(vocab_size: int) -> dict[str, int]:
    """Qwen2.5-VL's special-token ids in its vocabulary; in a smaller one, the last ids in the same order."""
    if vocab_size > max(SPECIAL_IDS.values()):
        return dict(SPECIAL_IDS)
    return {token: vocab_size - len(SPECIAL_IDS) + i for i, token in enumerate(SPECIAL_IDS)}


def model_config(tiny: bool) -> Any:
    """Qwen2.5-VL-3B's config (the tiny shape: two 64-wide layers, a one-block vision tower), its special tokens'
    ids as `special_ids` places them."""
    if tiny:
        sizes = dict(text_config=dict(TINY_TEXT), vision_config=TINY_VISION, tie_word_embeddings=True)
    else:
        sizes = {**QWEN25_VL_3B, "text_config": dict(QWEN25_VL_3B["text_config"])}
    ids = special_ids(sizes["text_config"]["vocab_size"])
    sizes["text_config"].update(pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=None)
    sizes.update(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    config = AutoConfig.for_model("qwen2_5_vl", **sizes)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return config


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer with one word `t<id>` per id and the special tokens at `special_ids`' ids, so any
    sequence of ids decodes and re-encodes exactly."""
    specials = special_ids(vocab_size)
    by_id = {i: token for token, i in specials.items()}
    vocab = {by_id.get(i, f"t{i}"): i for i in range(vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<|endoftext|>", eos_token="<|im_end|>", padding_side="left"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(specials)})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_model_folder(folder: Path, args: argparse.Namespace) -> int:
    """The random model (bf16 on the GPU, fp32 for `--tiny`), its tokenizer and its processor in `folder`; returns
    the number of parameters."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from hyflow.models.processor import image_text_processor_class, save_processor
    from hyflow.models.tiny import save_tokenizer

    config = model_config(args.tiny)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    with torch.device(device):  # a 3B model's random init on the host takes a minute
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32 if args.tiny else torch.bfloat16)
    model.save_pretrained(folder)
    num_params = sum(p.numel() for p in model.parameters())
    del model
    tokenizer = build_tokenizer(config.get_text_config().vocab_size)
    pixels = args.image_size**2  # every image keeps its size: exactly (size / 28)^2 image tokens
    image_processor = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels, patch_size=PATCH, merge_size=MERGE)
    save_processor(image_text_processor_class()(image_processor, tokenizer, chat_template=CHAT_TEMPLATE), folder)
    save_tokenizer(tokenizer, folder)
    return num_params


def noise_image(size: int, rng: random.Random) -> bytes:
    """A PNG of `size` x `size` random pixels."""
    buffer = io.BytesIO()
    Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3)).save(buffer, format="PNG")
    return buffer.getvalue()


def build_assets(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The model folder under `root/model` and `--steps` batches of image prompts (verl's multimodal schema:
    an `images` column, `<image>` in the prompt) in `root/train.parquet`."""
    model_dir = root / "model"
    num_params = save_model_folder(model_dir, args)
    vocab_size = model_config(args.tiny).get_text_config().vocab_size
    words = min(special_ids(vocab_size).values())  # the text tokens are t0 .. t<first special - 1>
    rng = random.Random(0)
    rows = []
    for index in range(args.prompts * args.steps):  # one epoch: no prompt is used twice
        text = " ".join(f"t{rng.randrange(words)}" for _ in range(args.prompt_length))
        rows.append({
            "data_source": "bench", "prompt": [{"role": "user", "content": "<image>" + text}], "ability": "bench",
            "images": [{"bytes": noise_image(args.image_size, rng), "path": None}],
            "reward_model": {"style": "rule", "ground_truth": ""}, "extra_info": {"index": index},
        })  # fmt: skip
    train_file = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(train_file)
    image_tokens = (args.image_size // (PATCH * MERGE)) ** 2
    prompt_tokens = args.prompt_length + image_tokens + 2  # text, the image's pads, vision start and end
    return {"model": str(model_dir), "train": str(train_file), "num_params": num_params, "prompt_tokens": prompt_tokens}


def hyflow_overrides(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> list[str]:
    """GRPO with the KL loss to the reference, one optimizer step per batch, image prompts on hyflow's engine."""
    reward_file = Path(__file__).resolve().parent / "grpo_step.py"
    return [
        f"data.train_files={assets['train']}",
        f"data.train_batch_size={args.prompts}",
        f"data.max_prompt_length={assets['prompt_tokens']}",
        f"data.max_response_length={args.response_length}",
        "data.image_key=images",
        "data.shuffle=False",
        f"actor_rollout_ref.model.path={assets['model']}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"actor_rollout_ref.actor.fsdp_config.model_dtype={args.master_dtype}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro_batch_size}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.actor.freeze_vision_tower={args.freeze_vision_tower}",
        "actor_rollout_ref.actor.checkpoint.save_contents=[]",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch_size}",
        "actor_rollout_ref.rollout.name=hyflow",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.log_prob_micro_batch_size}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"custom_reward_function.path={reward_file}",
        "custom_reward_function.name=compute_score",
        "trainer.backend=local",
        f"trainer.device={'cpu' if args.tiny else 'auto'}",
        *timed_run_overrides(args.steps, root, "vlm_grpo_step"),
    ]


def run_hyflow(args: argparse.Namespace, assets: dict[str, Any], root: Path) -> dict[str, Any]:
    """`--steps` GRPO steps; each step's seconds, stages and mean response length."""
    return train_and_time(hyflow_overrides(args, assets, root), root)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    device = "cpu" if args.tiny or not torch.cuda.is_available() else torch.cuda.get_device_name()
    result: dict[str, Any] = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__}
    result.update(backend=args.backend, gpus=args.gpus)
    with tempfile.TemporaryDirectory(prefix="hyflow_vlm_grpo_step_") as tmp:
        root = Path(tmp)
        assets = build_assets(root, args)
        result["shape"] = {
            "shape": "tiny" if args.tiny else "qwen2.5-vl-3b", "num_params": assets["num_params"],
            "prompts": args.prompts, "n": args.n, "steps": args.steps, "prompt_length": assets["prompt_tokens"],
            "image_size": args.image_size, "response_length": args.response_length,
            "micro_batch_size": args.micro_batch_size, "log_prob_micro_batch_size": args.log_prob_micro_batch_size,
            "master_dtype": args.master_dtype, "freeze_vision_tower": args.freeze_vision_tower,
        }  # fmt: skip
        result["hyflow"] = measured_side(run_hyflow, args, assets, root)
    print_table(result, {"hyflow": "hyflow"})
    line = json.dumps(result)
    print(line, flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"vlm_grpo_step_{result['shape']['shape']}.json").write_text(line + "\n")
    return result


if __name__ == "__main__":
    main()
