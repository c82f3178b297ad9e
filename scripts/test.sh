#!/usr/bin/env bash
# Install everything the tests need on a fresh machine, then lint and run the whole suite.
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first, pinned. Which build this gives depends on pip's index: on a stock Linux machine PyPI's wheel is the
# multi-GB CUDA build, so a CPU-only machine installs the CPU wheel before running this script (README):
#   pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[ray,dev]"
# bubblewrap: the sandbox of the python tool and the code reward (hyflow.sandbox); root on Debian installs it.
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap; else sudo apt-get install -y -qq bubblewrap; fi
fi
ruff check hyflow tests benchmarks
ruff format --check hyflow tests benchmarks
rc=0
python -m pytest "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: the suite is broken, not green." >&2
  exit 1
fi
exit "$rc"
