"""What every side of `grpo_step.py` trains on: one random-weight Qwen2 model, a WordLevel tokenizer over its whole
vocabulary (so random token ids decode to text and back), and `--steps` batches of random prompts as verl-schema
parquet, saved once to a temp folder.

    assets = build_assets(root, args)   # {"model", "tokenizer", "train": paths, "prompts": texts, "num_params"}
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from shapes import SHAPES
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

SPECIAL_TOKENS = ["<pad>", "<unk>", "<bos>", "<eos>"]  # the last four ids of the vocabulary
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"  # the prompt text, as is


def model_config(shape: str) -> Qwen2Config:
    """A shape of `shapes.SHAPES` (Qwen2-0.5B's by default; `tiny`: ~100K parameters); specials are the last ids."""
    sizes = {"rope_theta": 1000000.0, **SHAPES[shape]}
    vocab_size = int(sizes["vocab_size"])
    config = Qwen2Config(
        **sizes, max_position_embeddings=4096,
        pad_token_id=vocab_size - 4, bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1,
    )  # fmt: skip
    config.architectures = ["Qwen2ForCausalLM"]
    return config


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A WordLevel tokenizer with one word `t<id>` per id, so any id sequence decodes and re-encodes exactly."""
    vocab = {f"t{i}": i for i in range(vocab_size - len(SPECIAL_TOKENS))}
    vocab.update({token: vocab_size - len(SPECIAL_TOKENS) + j for j, token in enumerate(SPECIAL_TOKENS)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    pad, unk, bos, eos = SPECIAL_TOKENS
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=pad, unk_token=unk, bos_token=bos, eos_token=eos, padding_side="left"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_assets(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Save the random model (bf16 on the GPU run, fp32 for `--tiny`) under `root/model`, its tokenizer under
    `root/tokenizer`, and `--steps` batches of random prompts as verl-schema parquet; returns the paths and the
    prompt texts.

    The tokenizer has a folder of its own because transformers 5 loads a tokenizer that sits next to a qwen2
    config.json as `Qwen2Tokenizer` (a BPE), whatever class tokenizer_config.json names, and a WordLevel vocabulary
    read as BPE encodes every prompt to nothing."""
    from hyflow.models.tiny import save_tokenizer

    config = model_config("tiny" if args.tiny else args.shape)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    with torch.device(device):  # a 7B model's random init on the host takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32 if args.tiny else torch.bfloat16)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tokenizer_dir = root / "tokenizer"
    tokenizer = build_tokenizer(config.vocab_size)
    save_tokenizer(tokenizer, tokenizer_dir)
    # A copy beside the weights for TRL's colocated vLLM, which loads its tokenizer from the model folder: it reads
    # it as Qwen2Tokenizer too, which still turns ids into text, all vLLM does with it (prompts go in as ids).
    save_tokenizer(tokenizer, model_dir)
    num_params = sum(p.numel() for p in model.parameters())
    del model
    rng = random.Random(0)
    words = config.vocab_size - len(SPECIAL_TOKENS)
    num_prompts = args.prompts * args.steps  # one epoch: no prompt is used twice
    prompts = [" ".join(f"t{rng.randrange(words)}" for _ in range(args.prompt_length)) for _ in range(num_prompts)]
    rows = [
        {
            "data_source": "bench",
            "prompt": [{"role": "user", "content": text}],
            "ability": "bench",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"index": index},
        }
        for index, text in enumerate(prompts)
    ]
    train_file = root / "train.parquet"
    pd.DataFrame(rows).to_parquet(train_file)
    return {
        "model": str(model_dir), "tokenizer": str(tokenizer_dir), "train": str(train_file), "prompts": prompts,
        "num_params": num_params,
    }  # fmt: skip
