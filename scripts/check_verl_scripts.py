"""Load verl's PPO/GRPO example launch scripts through hyflow's config checker, one line per script.

    python scripts/check_verl_scripts.py /path/to/verl            # a verl checkout (only examples/ is read)
    python scripts/check_verl_scripts.py /path/to/verl --verbose  # also the notices of scripts that load

Each `examples/{grpo,ppo}_trainer/*.sh` runs under bash with stand-ins for the commands it calls: `python3 -m
...main_ppo` records its arguments instead of training, any other `python`/`python3` call fails (so probes such
as `python3 -c 'import torch_npu'` take their "not installed" branch), `ray job submit ... -- CMD` and
`uv run ... python3 ...` run their command, and
commands that would reach the network or a GPU (`pip`, `wget`, `curl`, `git`, `hf`, `nvidia-smi`, ...) do nothing.
`HOME` is an empty temporary folder. The recorded overrides then go through `hyflow.config.load_config`, the same
check `hyflow train` runs before any worker starts, from the checkout's root as verl's scripts expect (so a
relative `custom_reward_function.path` resolves; data and model paths are not opened).

Scripts outside hyflow's scope are reported as skipped, with the reason: verl's Megatron-LM or VeOmni backends
(a `ppo_megatron_trainer` config, `model_engine=` or `strategy=` other than FSDP, `*.megatron.*` keys, a
Hydra config-group choice such as `actor@actor_rollout_ref.actor=...`), Ascend NPUs (`trainer.device=npu`) and
image/video data (`data.image_key`,
`data.video_key`, or a vision-language model). Every other script must load: the exit status is 1 when one fails.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT_GLOBS = ("examples/grpo_trainer/*.sh", "examples/ppo_trainer/*.sh")

_RECORD = """#!/usr/bin/env bash
for arg in "$@"; do
  case "$arg" in
    *main_ppo*) printf '%s\\0' "$@" > "$(mktemp "$HYFLOW_CAPTURE_DIR/launch.XXXXXX")"; exit 0 ;;
  esac
done
exit 1
"""
_RAY = """#!/usr/bin/env bash
if [ "$1" = job ] && [ "$2" = submit ]; then
  while [ "$#" -gt 0 ] && [ "$1" != -- ]; do shift; done
  shift; exec "$@"
fi
exit 0
"""
_UV = """#!/usr/bin/env bash
while [ "$#" -gt 0 ]; do
  case "$1" in python|python3) exec "$@" ;; esac
  shift
done
exit 0
"""
_NOTHING = "#!/usr/bin/env bash\nexit 0\n"
_SILENT_COMMANDS = (
    "pip",
    "pip3",
    "wget",
    "curl",
    "git",
    "hf",
    "huggingface-cli",
    "modelscope",
    "nvidia-smi",
    "npu-smi",
)
_VISION_MODEL = re.compile(r"vl\b|-vl|_vl|vision|glm-?4\.?1v|minicpm-?o|omni|llava|internvl", re.IGNORECASE)


@dataclass
class ScriptResult:
    """One script's outcome. status: loads | fails | skipped | no-launch."""

    name: str
    status: str
    reason: str = ""
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def _write_stand_ins(folder: Path) -> None:
    for name, text in [("python", _RECORD), ("python3", _RECORD), ("ray", _RAY), ("uv", _UV)]:
        (folder / name).write_text(text)
    for name in _SILENT_COMMANDS:
        (folder / name).write_text(_NOTHING)
    for path in folder.iterdir():
        path.chmod(0o755)


def capture_launches(script: Path, timeout_s: float = 60.0) -> list[list[str]]:
    """The argument lists of every `python -m ...main_ppo` the script would run (empty when it runs none)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        bin_dir, home, capture = root / "bin", root / "home", root / "capture"
        for folder in (bin_dir, home, capture):
            folder.mkdir()
        _write_stand_ins(bin_dir)
        env = {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": str(home),
            "HYFLOW_CAPTURE_DIR": str(capture),
        }
        # a script that waits (a Ray cluster loop, a sleep) is stopped; whatever it launched so far is kept
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ["bash", str(script.resolve())],
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout_s,
                check=False,
            )
        files = sorted(capture.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        return [p.read_bytes().decode().split("\0")[:-1] for p in files]


def split_launch(argv: list[str]) -> tuple[str, list[str]]:
    """(the Hydra config name, the `key=value` overrides) of one recorded `python -m ...main_ppo ...` call."""
    module_at = next(i for i, arg in enumerate(argv) if "main_ppo" in arg)
    config_name, overrides = "ppo_trainer", []
    rest = iter(argv[module_at + 1 :])
    for arg in rest:
        if arg.startswith("--config-name") or arg == "-cn":
            config_name = arg.split("=", 1)[1] if "=" in arg else next(rest, "")
        elif arg.startswith("--config-path") or arg == "-cp":
            if "=" not in arg:
                next(rest, None)
        elif arg.startswith("-"):
            continue  # other Hydra flags (--multirun, ...)
        elif arg.strip():  # a blank argument is a broken line continuation in the script itself
            overrides.append(arg)
    return config_name.strip("'\""), overrides


def out_of_scope(config_name: str, overrides: list[str]) -> str | None:
    """Why a launch is outside hyflow's scope (another training backend, image/video data), or None."""
    if "megatron" in config_name:
        return f"Megatron-LM backend (--config-name={config_name})"
    values = {}
    for line in overrides:
        key, _, value = line.lstrip("+~").partition("=")
        values[key] = value.strip("'\"")
    for key, value in values.items():
        if (key.endswith(".strategy") or key == "model_engine") and value not in ("dp", "fsdp", "fsdp2"):
            return f"{value} backend ({key}={value})"
        if "@" in key or ".megatron." in key:
            return f"another training engine ({key}={value})"
    if values.get("trainer.device") == "npu":
        return "Ascend NPU (trainer.device=npu)"
    for key in ("data.image_key", "data.video_key"):
        if values.get(key):
            return f"image/video data ({key}={values[key]})"
    model = values.get("actor_rollout_ref.model.path", "")
    if _VISION_MODEL.search(Path(model).name):
        return f"vision-language model ({model})"
    return None


class _Notices(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_overrides(overrides: list[str], checkout: Path | None = None) -> tuple[list[str], list[str]]:
    """(problems, notices) of loading `overrides` with hyflow's config checker, from `checkout` (default: here)."""
    from hyflow.config import ConfigError, load_config

    handler = _Notices()
    config_logger = logging.getLogger("hyflow.config")
    config_logger.addHandler(handler)
    propagate, config_logger.propagate = config_logger.propagate, False  # collected per script, not printed
    here = Path.cwd()
    try:
        os.chdir(checkout or here)
        load_config(overrides, check_files=False)  # the scripts' models and data are on their cluster
        problems: list[str] = []
    except ConfigError as err:
        problems = list(err.problems)
    finally:
        os.chdir(here)
        config_logger.removeHandler(handler)
        config_logger.propagate = propagate
    return problems, handler.messages


def check_script(script: Path, checkout: Path | None = None) -> ScriptResult:
    launches = capture_launches(script)
    if not launches:
        return ScriptResult(script.name, "no-launch", "runs no `python -m ...main_ppo` (or stops before it)")
    result = ScriptResult(script.name, "loads")
    for argv in launches:
        config_name, overrides = split_launch(argv)
        reason = out_of_scope(config_name, overrides)
        if reason is not None:
            return ScriptResult(script.name, "skipped", reason)
        problems, notices = check_overrides(overrides, checkout)
        result.problems += problems
        result.notices += notices
    if result.problems:
        result.status = "fails"
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verl_checkout", type=Path, help="a checkout of verl (its examples/ folder is read)")
    parser.add_argument("--verbose", action="store_true", help="print the notices of scripts that load")
    args = parser.parse_args(argv)
    scripts = sorted(p for pattern in SCRIPT_GLOBS for p in args.verl_checkout.glob(pattern))
    if not scripts:
        print(f"no scripts under {args.verl_checkout} matching {', '.join(SCRIPT_GLOBS)}", file=sys.stderr)
        return 2
    counts: dict[str, int] = {}
    for script in scripts:
        result = check_script(script, args.verl_checkout)
        counts[result.status] = counts.get(result.status, 0) + 1
        detail = result.reason or (f"{len(result.notices)} notices" if result.status == "loads" else "")
        print(f"{result.status:9} {script.parent.name}/{result.name}  {detail}")
        for problem in result.problems:
            print(f"          - {problem}")
        if args.verbose:
            for notice in dict.fromkeys(result.notices):
                print(f"          . {notice}")
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    print(f"{len(scripts)} scripts: {summary}")
    return 1 if counts.get("fails") else 0


if __name__ == "__main__":
    sys.exit(main())
