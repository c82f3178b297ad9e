"""The entry of supervised fine-tuning: `python -m hyflow.trainer.main_sft key=value ...` (also `hyflow sft`).

    hyflow sft data.train_files=data/chat/train.parquet data.val_files=data/chat/test.parquet
               model.path=/models/Qwen2.5-0.5B-Instruct optim.lr=1e-5 trainer.total_epochs=2
    hyflow sft data.train_files=data/arith/train.parquet data.response_key=extra_info.answer model.path=...
    torchrun --nproc_per_node=4 -m hyflow.trainer.main_sft ...        data-parallel, FSDP2 over 4 devices
    hyflow sft --cfg [key=value ...]                                  print the resolved config and exit
    hyflow sft --help                                                 every key with its default

Overrides use Hydra's syntax (`trainer.logger=[console,file]`). The config (`hyflow.config.sft.SFTConfig`) is
checked in full before any model is loaded; a broken one prints every problem and exits 2. The trained model is
written to `{trainer.default_local_dir}/huggingface`, ready for `actor_rollout_ref.model.path=...` in PPO.
Checkpoints: `trainer.save_freq=N` saves every N steps and at the end; the default, -1 (as verl's SFT), saves only at
the end, and 0 saves none (in `hyflow train`, -1 saves none). SIGTERM stops a run with one line saying where the last
complete checkpoint is, and exit status 143.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import yaml

from hyflow.config import ConfigError, load_sft_config
from hyflow.config.sft import SFTConfig, sft_default_dict
from hyflow.trainer.shutdown import TrainingStopped, exit_code, stop_on_sigterm, stopped_message

logger = logging.getLogger(__name__)

EXIT_BAD_INPUT = 2


def run_sft(config: SFTConfig) -> list[dict[str, float]]:
    """Train with a checked config; returns the metrics of every step."""
    from hyflow.trainer.sft_trainer import SFTTrainer

    if config.trainer.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before anything initialises CUDA: train on the CPU
    return SFTTrainer(config).fit()


def _usage() -> str:
    defaults = yaml.safe_dump(sft_default_dict(), sort_keys=False, default_flow_style=None, width=110)
    return f"{(__doc__ or '').strip()}\n\nKeys and defaults:\n\n{defaults}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `hyflow sft`: parse `key=value` overrides, check them, train."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in args):
        print(_usage())
        return 0
    print_config = "--cfg" in args
    overrides = [arg for arg in args if arg != "--cfg"]
    try:
        config = load_sft_config(overrides)
    except ConfigError as err:
        print(f"hyflow sft: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if print_config:
        import dataclasses

        print(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False, default_flow_style=None, width=110))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    try:
        with stop_on_sigterm():
            run_sft(config)
    except ValueError as err:
        print(f"hyflow sft: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingStopped as stopped:  # SIGTERM: say where to resume from (rank 0 only, under torchrun)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"hyflow sft: {stopped_message(stopped.signum, config.trainer.default_local_dir)}", file=sys.stderr)
        return exit_code(stopped.signum)
    return 0


if __name__ == "__main__":
    from hyflow.cli import run_command

    sys.exit(run_command("sft", main, sys.argv[1:]))  # a user's mistake in one line, as `hyflow sft` prints it
