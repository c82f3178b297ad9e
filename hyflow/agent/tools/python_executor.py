"""`python`: runs model-written Python in the bubblewrap sandbox (`hyflow.sandbox`) and returns what it printed.

Each call runs `python -I main.py` in a fresh sandbox: no network, no other process or file of the host visible,
a read-only system, a private size-capped `/tmp` as the only writable path (its working directory), rlimits for
CPU time (`time_limit` rounded up, + 1 s), address space (`memory_limit_mb`), file size (`max_file_bytes`), open
files and processes (`max_processes`), one memory cap on the whole call where a memory cgroup can be made
(`memory_limit_mb + work_dir_mb`; else up to `max_processes x memory_limit_mb`), a seccomp filter, and a wall-clock
limit `time_limit` that kills every process the code started. stdout and stderr come back together, capped at
`max_output_bytes` (the run is stopped beyond it). See `hyflow.sandbox` for what this does and does not protect
against.

No working `bwrap` on the machine, or one in which this interpreter does not run (checked at start-up): the tool
refuses to start and says what is wrong and how to fix it. `sandbox: none` (unsafe: trusted code only) runs the code
as a plain limited subprocess with an audit hook (PEP 578) refusing sockets and child processes, which plain Python
can switch off.

    tools:
      - class_name: python
        config: {time_limit: 5, memory_limit_mb: 1024, max_output_bytes: 4096}     # sandbox: bwrap (default)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from hyflow.agent.tools.base import BaseTool, ToolConfig, ToolResponse
from hyflow.sandbox import PYTHON, SandboxConfig, SandboxKind, SandboxResult, require_sandbox, run_in_sandbox

logger = logging.getLogger(__name__)

# `sandbox: none` only: runs inside the child, installs the audit hook, then runs the user's file as __main__
# with clean globals.
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
    sandbox: SandboxKind = "bwrap"  # "none": no isolation (unsafe, trusted code only)
    time_limit: float = 5.0  # wall-clock seconds of one run (CPU seconds are limited to the same, rounded up, + 1)
    memory_limit_mb: int = 1024  # address-space limit of the program
    max_output_bytes: int = 4096  # stdout + stderr kept; the run is stopped once it prints more
    max_file_bytes: int = 16 * 2**20  # largest file the code may write in its working directory
    work_dir_mb: int = 64  # size of the private writable /tmp (bwrap)
    max_processes: int = 8  # processes and threads the code may run at once (bwrap)

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            sandbox=self.sandbox,
            time_limit=self.time_limit,
            memory_limit_mb=self.memory_limit_mb,
            max_output_bytes=self.max_output_bytes,
            max_file_bytes=self.max_file_bytes,
            work_dir_mb=self.work_dir_mb,
            max_processes=self.max_processes,
        )


async def run_python(code: str, config: PythonToolConfig) -> SandboxResult:
    """Run `code` as `main.py` in the sandbox the config names (see the module docstring); stderr is merged."""
    guard = ["-c", _BOOTSTRAP] if config.sandbox == "none" else []
    argv = [PYTHON, "-I", *guard, "main.py"]
    return await run_in_sandbox(argv, config.sandbox_config(), files={"main.py": code}, merge_stderr=True)


def describe_result(result: SandboxResult, config: PythonToolConfig) -> str:
    """The text the model sees: the output, plus a note when the run did not end normally."""
    notes = []
    if result.timed_out:
        notes.append(f"[stopped: time limit of {config.time_limit:g}s exceeded]")
    if result.output_truncated:
        notes.append(f"[stopped: output longer than {config.max_output_bytes} bytes]")
    if result.exit_code not in (0, None):
        notes.append(f"[exit code {result.exit_code}]")
    text = result.stdout.decode("utf-8", errors="replace").rstrip("\n")
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

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None) -> None:
        super().__init__(config, tool_schema)
        self.config.sandbox_config()  # the limits are checked now, not at the first call
        require_sandbox(self.config.sandbox)
        if self.config.sandbox == "none":
            logger.warning("tool %s runs code without a sandbox (sandbox: none): trusted code only", self.name)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        result = await run_python(str(parameters.get("code", "")), self.config)
        metrics = {"timed_out": result.timed_out, "exit_code": result.exit_code}
        return ToolResponse(text=describe_result(result, self.config)), 0.0, metrics
