"""`hyflow generate`: offline batch generation over a parquet file of chat prompts (verl's main_generation).

    hyflow generate --model PATH --input data/test.parquet --output out.parquet [--n 4] [--temperature 1.0]
                    [--top-p 1.0] [--top-k -1] [--max-tokens 256] [--prompt-key prompt] [--seed 0]

Each row's `prompt` (a list of chat messages, the verl data schema) goes through the tokenizer's chat template; the
output parquet is the input plus a `responses` column holding the row's `n` generated texts.
"""

from __future__ import annotations

import argparse
import logging

from hyflow.engine.config import EngineConfig, SamplingParams
from hyflow.engine.engine import LLMEngine

logger = logging.getLogger(__name__)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hyflow generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face model folder (with its tokenizer)")
    parser.add_argument("--input", required=True, help="parquet file with a column of chat messages")
    parser.add_argument("--output", required=True, help="parquet file to write")
    parser.add_argument("--prompt-key", default="prompt")
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import pandas as pd
    from transformers import AutoTokenizer

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
    outputs = engine.generate(prompts, params)
    frame["responses"] = [[completion.text for completion in out.outputs] for out in outputs]
    frame.to_parquet(args.output)
    logger.info("wrote %d rows x %d responses to %s", len(frame), args.n, args.output)
    return 0
