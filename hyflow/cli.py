"""The `hyflow` console command: one subcommand per common job.

    hyflow <command> [args...]        (same as `python -m hyflow <command> ...`)
    hyflow <command> --help

Each subcommand lives in the module that owns the job; this file only maps names to `module:function`
entry points (imported lazily, so `hyflow --help` stays fast). An entry point takes the argument list
after the command name and returns an exit code (or None for success).

A user's mistake that reaches here (a `ValueError`, a missing or existing file, a missing package) is printed as
one line, `hyflow <command>: <message>`, with exit code 2; `HYFLOW_TRACEBACK=1` shows the traceback instead. A module
that is also run as `python -m ...` (`hyflow.trainer.main_ppo`, `main_sft`) goes through `run_command` too, so both
spellings of a command answer alike.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence

# name -> (entry point "module:function", one-line help). Add a line here when a job lands.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("hyflow.demos.runner:main", "tiny model, SFT, then GRPO on a synthetic task: RL end to end in minutes"),
    "train": ("hyflow.trainer.main_ppo:main", "PPO/GRPO training: Hydra overrides with verl's keys (key=value ...)"),
    "prepare-data": ("hyflow.data.prepare:main", "write train/test parquet for a task (gsm8k, geo3k, shapes, ...)"),
    "generate": ("hyflow.rollout.generate:main", "batch generation over a parquet of chat prompts"),
    "serve": ("hyflow.serving.server:main", "OpenAI-compatible HTTP API on hyflow's generation engine (--model PATH)"),
    "serve-retrieval": ("hyflow.agent.retrieval_server:main", "BM25 search over a JSONL corpus, for the search tool"),
    "sft": ("hyflow.trainer.main_sft:main", "supervised fine-tuning on chat parquet, loss on assistant turns only"),
    "merge": ("hyflow.workers.merge:main", "turn a checkpoint (…/actor or …/critic) into a Hugging Face folder"),
}


# What a command raises for bad input (with a message that names the value and the fix), not for a bug.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, ImportError)
EXIT_USER_ERROR = 2


def _usage() -> str:
    lines = ["usage: hyflow <command> [args...]", "", "commands:"]
    width = max((len(name) for name in COMMANDS), default=0)
    for name, (_, summary) in sorted(COMMANDS.items()):
        lines.append(f"  {name.ljust(width)}  {summary}")
    lines += ["", "Run `hyflow <command> --help` for the options of one command."]
    return "\n".join(lines)


def _load(entry: str) -> Callable[[list[str]], int | None]:
    module_name, func_name = entry.split(":")
    return getattr(importlib.import_module(module_name), func_name)


def run_command(name: str, entry: Callable[[list[str]], int | None], args: Sequence[str]) -> int:
    """`entry(args)`'s exit code; a user's mistake (`USER_ERRORS`) becomes one line `hyflow <name>: <message>` and
    exit code 2, or its traceback when `HYFLOW_TRACEBACK` is set."""
    try:
        result = entry(list(args))
    except USER_ERRORS as error:
        if os.environ.get("HYFLOW_TRACEBACK"):
            raise
        print(f"hyflow {name}: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"hyflow: unknown command {name!r}.\n\n{_usage()}", file=sys.stderr)
        return 2
    return run_command(name, lambda command_args: _load(COMMANDS[name][0])(command_args), rest)


if __name__ == "__main__":
    sys.exit(main())
