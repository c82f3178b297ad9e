"""Generation throughput on image prompts: hyflow's engine (native image prefill) next to `transformers.generate`,
on a random-weight Qwen2.5-VL-3B-shaped model built from its config (nothing downloaded).

    python benchmarks/vlm_generate.py                                  # GPU: Qwen2.5-VL-3B shape, bf16
    python benchmarks/vlm_generate.py --num-prompts 16 --n 8           # GRPO-like: 8 samples share each image
    python benchmarks/vlm_generate.py --shape tiny --num-prompts 2 --new-tokens 4 --repeats 1   # CPU smoke test

Each prompt: `--text-tokens` random text tokens around one image of `--image-size` x `--image-size` pixels (random
patches; 448 px is 32 x 32 patches, 256 image tokens after the 2 x 2 merge), then `--new-tokens` new tokens per
sample (temperature 1, EOS ignored). Both sides get the same prompts and images; `transformers.generate` runs the
`num_prompts x n` rows as one batch (each row with its image). One warm-up run per side, then `--repeats` timed
runs of the engine and one of transformers. Prints new tokens per second of each and their ratio; with `$OUT` set,
the numbers also go to `$OUT/vlm_generate_<shape>.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

PATCH, MERGE, TEMPORAL = 14, 2, 2
QWEN25_VL_3B = dict(  # Qwen2.5-VL-3B-Instruct's config.json
    text_config=dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, max_position_embeddings=128000, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0, mrope_section=[16, 24, 24]),
    ),
    vision_config=dict(
        depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
        hidden_act="silu", in_channels=3,
    ),
    image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653,
    tie_word_embeddings=True,
)  # fmt: skip


def build_config(shape: str) -> Any:
    if shape == "3b":
        return AutoConfig.for_model("qwen2_5_vl", **QWEN25_VL_3B)
    from hyflow.models.tiny_vlm import build_tiny_vlm_tokenizer, tiny_vlm_config

    return tiny_vlm_config(build_tiny_vlm_tokenizer(), arch="qwen2_5_vl")


def image_prompts(config: Any, num_prompts: int, text_tokens: int, image_size: int, seed: int) -> list[tuple]:
    """(prompt ids, {"pixel_values", "image_grid_thw"}) per prompt: text, <vision_start>, the image's pads,
    <vision_end>, text; random text tokens and random patches."""
    generator = torch.Generator().manual_seed(seed)
    side = image_size // PATCH
    grid = torch.tensor([[1, side, side]])
    num_pads = side * side // MERGE**2
    vocab = min(config.get_text_config().vocab_size, config.vision_start_token_id)  # below the special tokens
    prompts = []
    for _ in range(num_prompts):
        text = torch.randint(0, vocab, (text_tokens,), generator=generator).tolist()
        half = text_tokens // 2
        ids = [*text[:half], config.vision_start_token_id, *[config.image_token_id] * num_pads]
        ids += [config.vision_end_token_id, *text[half:]]
        pixels = torch.randn(side * side, 3 * TEMPORAL * PATCH * PATCH, generator=generator)
        prompts.append((ids, {"pixel_values": pixels, "image_grid_thw": grid}))
    return prompts


def time_engine(engine: LLMEngine, prompts: list[tuple], n: int, new_tokens: int, seed: int) -> float:
    params = SamplingParams(n=n, temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=seed)
    _sync()
    start = time.perf_counter()
    outputs = engine.generate([p for p, _ in prompts], params, multi_modal_inputs=[i for _, i in prompts])
    _sync()
    elapsed = time.perf_counter() - start
    assert all(len(o.token_ids) == new_tokens for out in outputs for o in out.outputs)
    return len(prompts) * n * new_tokens / elapsed


def time_hf(model: Any, prompts: list[tuple], n: int, new_tokens: int, device: str) -> float:
    rows = [prompt for prompt in prompts for _ in range(n)]  # all prompts have one length: no padding
    input_ids = torch.tensor([ids for ids, _ in rows], device=device)
    image_token_id = model.config.image_token_id
    _sync()
    start = time.perf_counter()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        pixel_values=torch.cat([i["pixel_values"] for _, i in rows]).to(device, model.dtype),
        image_grid_thw=torch.cat([i["image_grid_thw"] for _, i in rows]).to(device),
        mm_token_type_ids=(input_ids == image_token_id).long(),
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    _sync()
    elapsed = time.perf_counter() - start
    assert out.shape[1] == input_ids.shape[1] + new_tokens
    return len(rows) * new_tokens / elapsed


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=["3b", "tiny"], default="3b")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=1, help="samples per prompt (they share the prompt's image KV)")
    parser.add_argument("--text-tokens", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=448, help="pixels per side (a multiple of 28)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-hf", action="store_true", help="skip transformers.generate")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    config = build_config(args.shape)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype).eval()
    prompt_len = len(image_prompts(config, 1, args.text_tokens, args.image_size, 0)[0][0])
    max_len = prompt_len + args.new_tokens
    engine_config = EngineConfig(max_model_len=max_len, max_num_seqs=max(args.num_prompts * args.n, 1), device=device)
    engine = LLMEngine(model, engine_config)
    warm = image_prompts(config, min(args.num_prompts, 8), args.text_tokens, args.image_size, seed=99)
    time_engine(engine, warm, args.n, min(args.new_tokens, 32), seed=99)
    prompts = [image_prompts(config, args.num_prompts, args.text_tokens, args.image_size, r) for r in range(2)]
    engine_runs = [time_engine(engine, prompts[r % 2], args.n, args.new_tokens, seed=r) for r in range(args.repeats)]
    result: dict[str, Any] = {"shape": args.shape, "prompt_len": prompt_len, **vars(args), "engine": engine_runs}
    print(
        f"prompt {prompt_len} tokens (image {args.image_size}px), {args.num_prompts} x n={args.n} -> {args.new_tokens}"
    )
    print("hyflow engine:        " + ", ".join(f"{r:,.0f}" for r in engine_runs) + " tok/s")
    if not args.no_hf:
        del engine
        with torch.inference_mode():
            time_hf(model, warm, args.n, min(args.new_tokens, 8), device)
            hf = time_hf(model, prompts[0], args.n, args.new_tokens, device)
        result["hf"] = hf
        print(f"transformers.generate: {hf:,.0f} tok/s  (engine / hf: {max(engine_runs) / hf:.2f}x)")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], f"vlm_generate_{args.shape}.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
