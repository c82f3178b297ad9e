"""`python`: runs model-written Python in a fresh, limited subprocess and returns what it printed.

What is enforced, per call:
- a fresh interpreter in isolated mode (`python -I`: no user site, no PYTHON* variables), a minimal environment,
  stdin closed, a new temporary working directory that is deleted afterwards;
- wall-clock limit `time_limit` (the process group is killed) and CPU-time limit (`RLIMIT_CPU`);
- memory limit `memory_limit_mb` (`RLIMIT_AS`), file-size limit (`RLIMIT_FSIZE`), no core dumps;
- output cap `max_output_bytes` (stdout and stderr together; the process is killed once it is exceeded);
- no network and no child processes: an audit hook (PEP 578) installed before the code runs rejects socket
  creation, connect, bind, name lookups, `subprocess`, `os.system`, `exec*`, `spawn*` and `fork`; and when
  `unshare -rn` works on the host, the process also runs in its own empty network namespace.
This stops mistakes and casual misuse by a policy being trained; it is not a security boundary against code written
to escape (native code through `ctypes` can bypass audit hooks). Run untrusted workloads in a container.

    tools:
      - class_name: python
        config: {time_limit: 5, memory_limit_mb: 1024, max_output_bytes: 4096}
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse

logger = logging.getLogger(__name__)

# Runs inside the child: install the audit hook, then run the user's file as __main__ with clean globals.
_BOOTSTRAP = """
import sys
_BLOCKED = frozenset({
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.gethostbyaddr", "socket.sendto", "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
    "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
})
def _hyflow_guard(event, args):
    if event in _BLOCKED:
        raise PermissionError(f"{event} is not allowed in the hyflow python tool (no network, no processes)")
sys.addaudithook(_hyflow_guard)
_path = sys.argv[1]
sys.argv = sys.argv[1:]
with open(_path) as _file:
    _code = compile(_file.read(), "<code>", "exec")
exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@dataclass
class PythonToolConfig(ToolConfig):
    time_limit: float = 5.0  # wall-clock seconds of one run (CPU seconds are limited to the same, rounded up)
    memory_limit_mb: int = 1024  # address-space limit of the child process
    max_output_bytes: int = 4096  # stdout + stderr kept; the run is stopped once it prints more
    max_file_bytes: int = 16 * 2**20  # largest file the code may write in its working directory
    use_network_namespace: bool = True  # also isolate the network with `unshare -rn` when the host allows it


@dataclass
class ExecutionResult:
    """How one run ended. `exit_code` is None when the run was stopped (time limit or output cap)."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False


@functools.cache
def network_namespace_available() -> bool:
    """Whether `unshare -rn` (a user + network namespace without privileges) works here; checked once."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        return subprocess.run([unshare, "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _set_limits(config: PythonToolConfig) -> None:
    """preexec_fn of the child (runs after fork, before exec): resource limits."""
    import resource

    cpu_seconds = math.ceil(config.time_limit) + 1
    memory = config.memory_limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (config.max_file_bytes, config.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def _read_capped(stream: asyncio.StreamReader, chunks: list[bytes], max_bytes: int) -> bool:
    """Append what arrives to `chunks` (kept when the read is cancelled) until EOF or until more than `max_bytes`
    arrived; returns whether the output went over the cap."""
    size = 0
    while chunk := await stream.read(65536):
        chunks.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            return True
    return False


def _kill_group(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


async def run_python(code: str, config: PythonToolConfig) -> ExecutionResult:
    """Run `code` in a limited subprocess (see the module docstring) and collect its output."""
    prefix = ["unshare", "-rn"] if config.use_network_namespace and network_namespace_available() else []
    with tempfile.TemporaryDirectory(prefix="hyflow-python-") as workdir:
        script = Path(workdir, "main.py")
        script.write_text(code)
        env = {"PATH": os.defpath, "HOME": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        process = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-I", "-c", _BOOTSTRAP, str(script),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            cwd=workdir, env=env, start_new_session=True, preexec_fn=functools.partial(_set_limits, config),
        )  # fmt: skip
        chunks: list[bytes] = []
        truncated, timed_out = False, False
        try:
            truncated = await asyncio.wait_for(
                _read_capped(process.stdout, chunks, config.max_output_bytes), config.time_limit
            )
            if truncated:
                _kill_group(process)
            await asyncio.wait_for(process.wait(), config.time_limit)
        except TimeoutError:
            timed_out = True
        finally:
            _kill_group(process)
            await process.wait()
    stopped = timed_out or truncated
    output = b"".join(chunks)[: config.max_output_bytes]
    return ExecutionResult(
        output=output.decode("utf-8", errors="replace"),
        exit_code=None if stopped else process.returncode,
        timed_out=timed_out,
        output_truncated=truncated,
    )


def describe_result(result: ExecutionResult, config: PythonToolConfig) -> str:
    """The text the model sees: the output, plus a note when the run did not end normally."""
    notes = []
    if result.timed_out:
        notes.append(f"[stopped: time limit of {config.time_limit:g}s exceeded]")
    if result.output_truncated:
        notes.append(f"[stopped: output longer than {config.max_output_bytes} bytes]")
    if result.exit_code not in (0, None):
        notes.append(f"[exit code {result.exit_code}]")
    text = result.output.rstrip("\n")
    return "\n".join([text, *notes]) if text else ("\n".join(notes) or "[no output]")


class PythonTool(BaseTool):
    """Run Python code and return its printed output (see the module docstring for the limits)."""

    config_class = PythonToolConfig
    default_schema = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run a Python program and return what it prints. No network access.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "the program; print() the result"}},
                "required": ["code"],
            },
        },
    }

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        result = await run_python(str(parameters.get("code", "")), self.config)
        metrics = {"timed_out": result.timed_out, "exit_code": result.exit_code}
        return ToolResponse(text=describe_result(result, self.config)), 0.0, metrics
