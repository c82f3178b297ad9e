"""run_in_sandbox: files in the work dir, stdin in, stdout and stderr apart, output cap, unsafe relative names."""

import pytest

from hyflow.sandbox import PYTHON, SandboxConfig, SandboxUnavailableError, run_in_sandbox_sync, runner
from hyflow.sandbox.cgroup import create_call_cgroup, find_memory_cgroup

pytestmark = pytest.mark.timeout(60)

ECHO = "import sys\ndata = sys.stdin.read()\nprint(data.upper())\nprint('note', file=sys.stderr)"


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_stdin_goes_in_and_stdout_and_stderr_come_back_apart(sandbox):
    config = SandboxConfig(sandbox=sandbox)
    result = run_in_sandbox_sync([PYTHON, "-I", "main.py"], config, files={"main.py": ECHO}, stdin=b"abc")
    assert (result.stdout, result.stderr, result.exit_code) == (b"ABC\n", b"note\n", 0)


def test_a_stream_past_the_cap_stops_the_run():
    config = SandboxConfig(max_output_bytes=100)
    result = run_in_sandbox_sync([PYTHON, "-c", "import sys\nwhile True: sys.stderr.write('x' * 50)"], config)
    assert result.output_truncated and result.exit_code is None and len(result.stderr) == 100


def test_the_work_dir_is_capped_in_size():
    code = "open('big', 'wb').write(b'x' * 3 * 2**20)"
    result = run_in_sandbox_sync([PYTHON, "-c", code], SandboxConfig(work_dir_mb=2))
    assert result.exit_code == 1 and b"No space left on device" in result.stderr


@pytest.mark.parametrize("name", ["/etc/passwd", "../up.py", ""])
def test_file_names_must_stay_inside_the_work_dir(name):
    with pytest.raises(ValueError, match="must be a relative path inside the work directory"):
        run_in_sandbox_sync([PYTHON, "-c", "pass"], SandboxConfig(), files={name: "x"})


def test_a_bwrap_that_cannot_create_namespaces_is_reported_with_its_complaint(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match=r"cannot start a sandbox here \(bwrap: No permissions"):
        run_in_sandbox_sync([PYTHON, "-c", "pass"], SandboxConfig())


@pytest.mark.parametrize("code", ["print('done')", "import time\ntime.sleep(30)"], ids=["ends", "times-out"])
def test_a_call_gets_its_own_memory_cgroup_and_leaves_none_behind(code, monkeypatch):
    assert find_memory_cgroup() is not None, "no writable memory cgroup on this machine (see hyflow.sandbox.cgroup)"
    made = []

    def create_and_record(*args):
        made.append(create_call_cgroup(*args))
        return made[-1]

    monkeypatch.setattr(runner, "create_call_cgroup", create_and_record)
    result = run_in_sandbox_sync([PYTHON, "-c", f"print('started', flush=True)\n{code}"], SandboxConfig(time_limit=2))
    assert len(made) == 1 and not made[0].exists() and result.stdout.startswith(b"started")
