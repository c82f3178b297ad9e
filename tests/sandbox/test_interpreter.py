"""The interpreter in the sandbox: one installed under /tmp (a CI virtual environment) runs there, and one that cannot
run there stops hyflow at start-up with the problem and the fix named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hyflow.sandbox import SandboxUnavailableError, require_sandbox

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]

IN_THE_VENV = textwrap.dedent("""
    import json, sys
    from hyflow.reward.scorers.code import compute_score
    from hyflow.sandbox import PYTHON, SandboxConfig, require_sandbox, run_in_sandbox_sync
    require_sandbox("bwrap")
    run = run_in_sandbox_sync([PYTHON, "-I", "-c", "import sys; print(sys.prefix)"], SandboxConfig(time_limit=10))
    tests = {"inputs": ["1 2"], "outputs": ["3"]}
    score = compute_score("codecontests", "print(sum(map(int, input().split())))", tests)
    print(json.dumps({"python": PYTHON, "stdout": run.stdout.decode(), "stderr": run.stderr.decode(),
                      "score": score["score"]}))
""")


def test_a_python_call_and_the_code_scorer_run_when_the_interpreter_is_a_venv_under_tmp(tmp_path):
    venv = tmp_path / "venv"  # pytest's tmp_path lies under /tmp, which the sandbox mounts as its private tmpfs
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)], check=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(venv / "bin/python"), "-c", IN_THE_VENV], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["python"] == str(venv / "bin/python") and str(venv).startswith("/tmp/")
    assert (seen["stdout"], seen["stderr"], seen["score"]) == (f"{venv}\n", "", 1.0)


def test_an_interpreter_that_cannot_run_in_the_sandbox_stops_the_start_up_naming_it_and_the_fix(tmp_path):
    broken = tmp_path / "python3"
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: libpython3.so' >&2\nexit 127\n")
    broken.chmod(0o755)
    with pytest.raises(SandboxUnavailableError) as raised:
        require_sandbox("bwrap", python=str(broken))
    message = str(raised.value)
    assert f"the sandbox cannot run the interpreter its programs use, {broken}" in message
    assert "error while loading shared libraries: libpython3.so" in message
    assert "fix: run hyflow with a Python whose files all lie in those folders" in message
    assert "`sandbox: none` (unsafe" in message
