"""The command-line entry of PPO/GRPO training, with verl's key names and Hydra's override syntax.

    python -m hyflow.trainer.main_ppo data.train_files=train.parquet actor_rollout_ref.rollout.n=5 ...
    hyflow train data.train_files=train.parquet ...                  (the same)
    hyflow train                                                     the embedded default (no model, no data)
    python -m hyflow.trainer.main_ppo --cfg job [key=value ...]      check and print the config, run nothing
    python -m hyflow.trainer.main_ppo --help

One straight line: the overrides are parsed once (`hyflow.config.parse_overrides`, Hydra's grammar), applied to
the dataclass defaults, converted and finalized (`load_config`); the typed config goes to the trainer. A broken
command line or config prints every problem at once and exits 2; a mistake found later (a bad data file, a reward
function that cannot load) is one line `hyflow train: ...` and exit 2 under both spellings (`hyflow.cli.run_command`;
`HYFLOW_TRACEBACK=1` shows the stack). Without `actor_rollout_ref.model.path` and `data.train_files` the run is the
embedded default (`hyflow.trainer.embedded_default`). SIGTERM stops a run: every process it started ends, one line
says where the last complete checkpoint is (or that none was saved), and the exit status is 143
(`hyflow.trainer.shutdown`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from hyflow.config import ConfigError, PPOTrainerConfig, load_config
from hyflow.config.loading import parse_overrides
from hyflow.trainer.shutdown import TrainingStopped, exit_code, stop_on_sigterm, stopped_message

logger = logging.getLogger(__name__)

EXIT_BAD_CONFIG = 2

USAGE = """\
hyflow train (same as python -m hyflow.trainer.main_ppo): PPO/GRPO post-training with verl's config keys.

usage: hyflow train [--cfg job] [key=value ...]

  hyflow train data.train_files=train.parquet data.val_files=test.parquet \\
      actor_rollout_ref.model.path=/models/qwen algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=5
  hyflow train                      no model and no data: the embedded default (tiny model, synthetic task)

  key=value      Hydra's override syntax: lists as key=[a,b], a new mapping entry as +key=value, quote a value
                 holding spaces, = or brackets (key='a b'); ~ starts a path in the home folder
  --cfg job      check the whole config and print it as the run would use it, then exit
  -h, --help     this text

Checkpoints: trainer.save_freq=N saves every N steps and after the last one. The default, -1 (as verl), saves
none at all: the run leaves nothing to resume or `hyflow merge` (in `hyflow sft`, -1 saves at the end).

Every key, its type, default and meaning: docs/configuration.md (or `--cfg job` for the values of one launch line).
"""


def run_ppo(config: PPOTrainerConfig) -> None:
    """Train with a checked config (`hyflow.trainer.ppo_trainer.run`)."""
    from hyflow.trainer.ppo_trainer import run

    run(config)


def _parser() -> argparse.ArgumentParser:
    usage = "hyflow train [--cfg job] [key=value ...]   (--help for more)"
    parser = argparse.ArgumentParser(prog="hyflow train", usage=usage, add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--cfg", choices=["job"], help="print the checked config and exit")
    parser.add_argument("--resolve", action="store_true", help="accepted for Hydra's habit: values are resolved")
    parser.add_argument("overrides", nargs="*")
    return parser


def load_command_line(overrides: Sequence[str], build: bool = True) -> PPOTrainerConfig:
    """The checked config of a command line's overrides; the embedded default's settings go first when the line
    names neither a model nor training data (its model and data are built first when `build`; without, and before
    they exist, the file checks are left out). Raises one ConfigError with every problem."""
    from hyflow.trainer import embedded_default

    problems: list[str] = []
    parsed = parse_overrides(overrides, problems)
    check_files = True
    if not problems and embedded_default.is_wanted(parsed):
        parsed = [*parse_overrides(embedded_default.overrides(build=build)), *parsed]
        check_files = build or embedded_default.is_built()
        if not check_files:
            logger.warning(
                "config: the embedded default's model and data are built by the first run, under %s; "
                "the file checks wait for it.",
                embedded_default.home(),
            )
    try:
        config = load_config(parsed, check_files=check_files)
    except ConfigError as err:
        raise ConfigError([*problems, *err.problems]) from err
    if problems:
        raise ConfigError(problems)
    return config


def _print_config(config: PPOTrainerConfig) -> None:
    from omegaconf import OmegaConf

    from hyflow.config.convert import to_plain_dict

    print(OmegaConf.to_yaml(to_plain_dict(config)), end="")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, check and run (or print) the config of `argv` (default: the process's arguments); the entry of
    `hyflow train`."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.help:
        print(USAGE, end="")
        return 0
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    try:
        config = load_command_line(args.overrides, build=not args.cfg)
    except ConfigError as err:
        print(f"hyflow: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    if args.cfg:
        _print_config(config)
        return 0
    logger.info("config is valid: %s", config.trainer.experiment_name)
    try:
        with stop_on_sigterm():
            run_ppo(config)
    except TrainingStopped as stopped:  # run_ppo's way out has ended the workers, the reward processes and Ray
        print(f"hyflow train: {stopped_message(stopped.signum, config.trainer.default_local_dir)}", file=sys.stderr)
        return exit_code(stopped.signum)
    return 0


if __name__ == "__main__":
    from hyflow.cli import run_command

    sys.exit(run_command("train", main, sys.argv[1:]))  # a user's mistake in one line, as `hyflow train` prints it
