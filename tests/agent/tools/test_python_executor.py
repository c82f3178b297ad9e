"""The python tool: output, time / memory / output limits, the bubblewrap sandbox, and `sandbox: none`."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hyflow.agent.tools.python_executor import PythonTool, PythonToolConfig, describe_result, run_python
from hyflow.sandbox import SandboxUnavailableError

pytestmark = pytest.mark.timeout(60)


def run(code: str, **config) -> str:
    settings = PythonToolConfig(**config)
    return describe_result(asyncio.run(run_python(code, settings)), settings)


def test_the_tool_returns_what_the_program_prints():
    response, reward, metrics = asyncio.run(PythonTool().execute("i", {"code": "print(sum(range(10)))"}))
    assert response.text == "45" and reward == 0.0 and metrics == {"timed_out": False, "exit_code": 0}


def test_errors_come_back_as_the_traceback_and_exit_code():
    text = run("raise KeyError('missing')")
    assert "KeyError: 'missing'" in text and text.endswith("[exit code 1]")


@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_a_program_that_runs_too_long_is_stopped(sandbox):
    assert run("import time\nprint('start', flush=True)\ntime.sleep(30)", time_limit=2, sandbox=sandbox) == (
        "start\n[stopped: time limit of 2s exceeded]"
    )


def test_output_beyond_the_cap_is_cut_and_the_program_stopped():
    text = run("while True: print('x' * 100)", max_output_bytes=300, time_limit=10)
    assert text.endswith("[stopped: output longer than 300 bytes]") and text.count("x") <= 300


def test_memory_beyond_the_limit_fails_inside_the_program():
    assert "MemoryError" in run("block = bytearray(600 * 2**20)", memory_limit_mb=256)


def test_the_guard_reset_trick_does_not_reach_the_host(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret")
    code = f"import sys\nsys.modules['__main__']._BLOCKED = frozenset()\nprint(open('{secret}').read())"
    assert "FileNotFoundError" in run(code) and "the-secret" not in run(code)


def test_the_program_runs_in_the_private_work_dir_with_a_minimal_environment():
    text = run("import os; print(os.getcwd(), sorted(os.environ))")
    assert text.startswith("/tmp ") and "HOME" in text and "PYTHONPATH" not in text


def test_the_tool_refuses_to_start_without_bubblewrap(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxUnavailableError, match=r"`bwrap` \(bubblewrap\) is not on PATH.*apt-get install"):
        PythonTool()


def test_bad_limits_are_refused_when_the_tool_is_built():
    with pytest.raises(ValueError, match=r"memory_limit_mb=0 must be a positive number"):
        PythonTool({"memory_limit_mb": 0})


def test_sandbox_none_warns_and_keeps_the_audit_hook(caplog):
    with caplog.at_level(logging.WARNING):
        PythonTool({"sandbox": "none"})
    assert "without a sandbox" in caplog.text


@pytest.mark.parametrize(
    ("code", "event"),
    [
        ("import socket; socket.socket()", "socket.__new__"),
        ("import socket; socket.getaddrinfo('localhost', 80)", "socket.getaddrinfo"),
        ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
        ("import os; os.system('true')", "os.system"),
    ],
)
def test_sandbox_none_refuses_network_and_child_processes_through_the_audit_hook(code, event):
    assert f"PermissionError: {event} is not allowed" in run(code, sandbox="none")
