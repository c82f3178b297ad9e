"""The Hydra entry of PPO/GRPO training, with verl's key names.

    python -m hyflow.trainer.main_ppo data.train_files=train.parquet actor_rollout_ref.rollout.n=5 ...
    hyflow train data.train_files=train.parquet ...                  (the same)
    python -m hyflow.trainer.main_ppo --cfg job [key=value ...]      print the composed config
    python -m hyflow.trainer.main_ppo --help                         Hydra's help, with every key and default

The config (Hydra name `ppo_trainer`) is made from the dataclasses in `hyflow.config`. The overrides are checked
before Hydra composes them (unknown keys get the closest valid key), and the composed config is checked in full
(types, choices, cross-field rules) before any worker starts; a broken config prints every problem and exits 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import hydra
from omegaconf import DictConfig

from hyflow.config import ConfigError, PPOTrainerConfig, load_config
from hyflow.config.loading import CONFIG_NAME, prepare_overrides, register_with_hydra

logger = logging.getLogger(__name__)

EXIT_BAD_CONFIG = 2

register_with_hydra()


def run_ppo(config: PPOTrainerConfig) -> None:
    """Train with a checked config (`hyflow.trainer.ppo_trainer.run`)."""
    from hyflow.trainer.ppo_trainer import run

    run(config)


@hydra.main(config_path=None, config_name=CONFIG_NAME, version_base=None)
def _hydra_main(cfg: DictConfig) -> None:
    try:
        config = load_config(cfg)
    except ConfigError as err:
        print(f"hyflow: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_CONFIG)
    logger.info("config is valid: %s", config.trainer.experiment_name)
    run_ppo(config)


def _check_command_line(args: list[str]) -> list[str]:
    """Hydra's flags unchanged, and the overrides after `prepare_overrides` (raises ConfigError)."""
    from hydra._internal.utils import get_args_parser

    try:
        overrides = get_args_parser().parse_args(args).overrides
    except SystemExit:  # a malformed Hydra flag: let Hydra itself report it
        return args
    flags = [arg for arg in args if arg not in overrides]
    return [*flags, *prepare_overrides(overrides)]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the Hydra app on `argv` (default: the process's arguments); the entry of `hyflow train`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _check_command_line(args)
    except ConfigError as err:
        print(f"hyflow: {err}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    program = sys.argv[0] if sys.argv and sys.argv[0] else "hyflow.trainer.main_ppo"
    sys.argv = [program, *args]  # Hydra reads its arguments from sys.argv
    _hydra_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
