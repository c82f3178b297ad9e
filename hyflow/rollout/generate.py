"""`hyflow generate`: offline batch generation over a parquet file of chat prompts (verl's main_generation).

    hyflow generate --model PATH --input data/test.parquet --output out.parquet [--n 4] [--temperature 1.0]
                    [--top-p 1.0] [--top-k -1] [--max-tokens 256] [--prompt-key prompt] [--seed 0]

Each row's `prompt` (a list of chat messages, the verl data schema) goes through the tokenizer's chat template; the
output parquet is the input plus a `responses` column holding the row's `n` generated texts. The output path is
checked (a writable file, not a folder) before the model loads, so that nothing generated is lost; an existing
file there is replaced. A progress bar on stderr counts the finished prompts.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

logger = logging.getLogger(__name__)


class _HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every optional option's help ends with its default; required ones have none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.required else super()._get_help_string(action)


def parser() -> argparse.ArgumentParser:
    """The options of `hyflow generate`, each with its help and default."""
    parser = argparse.ArgumentParser(
        prog="hyflow generate", description=(__doc__ or "").split("\n\n")[0], formatter_class=_HelpWithDefaults
    )
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder (with its tokenizer)")
    parser.add_argument("--input", required=True, help="parquet file with a column of chat messages")
    parser.add_argument("--output", required=True, help="parquet file to write (its folder is created; replaced)")
    parser.add_argument("--prompt-key", default="prompt", help="the column of chat messages (lists of role/content)")
    parser.add_argument("--n", type=int, default=1, help="responses per prompt")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep this much probability")
    parser.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest tokens (-1: all)")
    parser.add_argument("--max-tokens", type=int, default=256, help="new tokens per response, at most")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (the same seed gives the same texts)")
    parser.add_argument(
        "--max-model-len", type=int, default=None, help="prompt + response tokens, at most (None: the model's)"
    )
    parser.add_argument(
        "--gpu-memory-utilization", type=float, default=0.8, help="share of GPU memory for weights and KV cache"
    )
    return parser


def check_output_path(path: str) -> None:
    """Raise a ValueError now, before any generation, when `path` cannot take the output parquet."""
    target = Path(path)
    if target.is_dir():
        raise ValueError(f"--output {path!r} is a folder; pass a file name such as {str(target / 'out.parquet')!r}.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(f"--output {path!r}: cannot create its folder ({error}); pass a writable path.") from error
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"--output {path!r} is not writable; pass a path you can write to.")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import pandas as pd
    from transformers import AutoTokenizer

    check_output_path(args.output)
    if not Path(args.model).is_dir():
        raise FileNotFoundError(f"--model {args.model!r} is not a folder; pass a local Hugging Face model folder.")
    if not Path(args.input).is_file():
        raise FileNotFoundError(f"--input {args.input!r} does not exist; pass a parquet file of chat prompts.")
    frame = pd.read_parquet(args.input)
    if args.prompt_key not in frame.columns:
        raise ValueError(
            f"--prompt-key {args.prompt_key!r} is not a column of {args.input}; columns: {list(frame.columns)}"
        )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [
        list(
            tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, return_dict=False)
        )
        for messages in frame[args.prompt_key]
    ]
    config = EngineConfig(
        max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed
    )
    engine = LLMEngine(args.model, config, tokenizer)
    params = SamplingParams(
        n=args.n, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens
    )
    outputs = engine.generate(prompts, params, progress=True)
    frame["responses"] = [[completion.text for completion in out.outputs] for out in outputs]
    frame.to_parquet(args.output)
    logger.info("wrote %d rows x %d responses to %s", len(frame), args.n, args.output)
    return 0
