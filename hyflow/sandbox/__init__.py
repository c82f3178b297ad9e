"""The sandbox for code from the model: one owner for every tool or reward that runs such code.

    from hyflow.sandbox import PYTHON, SandboxConfig, run_in_sandbox, run_in_sandbox_sync
    result = run_in_sandbox_sync([PYTHON, "-I", "main.py"], SandboxConfig(time_limit=2), files={"main.py": code})

A run happens inside bubblewrap (`bwrap`, see `hyflow.sandbox.bwrap` for the exact set-up):
- its own PID, network, IPC, UTS (and, as an ordinary user, user) namespaces: it sees no other process and no
  network (only a loopback of its own, so nothing on the host's 127.0.0.1 is reachable), it cannot signal anything
  outside; it runs as an unprivileged uid with no capabilities;
- a read-only view of `/usr`, the system libraries and the Python installation (wherever it is, `/tmp` included),
  and nothing else of the host: no home folders, no project files, no `/etc` beyond the linker's cache; `/tmp` is
  the work directory, a private tmpfs of `work_dir_mb` and the only writable path, gone after the run;
- no nested namespaces and no keyrings, bpf, io_uring, ptrace, mount or module calls (a seccomp filter,
  `hyflow.sandbox.seccomp`; as an ordinary user also bwrap's `--disable-userns`);
- rlimits: CPU seconds, address space, file size, open files, processes (`SandboxConfig`), and, where a memory
  cgroup can be made (`hyflow.sandbox.cgroup`), one memory cap on the whole call;
- a wall-clock limit that kills the PID namespace's init, and with it every process the code started (`setsid`,
  double forks and daemons included): nothing outlives the call; `--die-with-parent` also ends it when hyflow dies;
- stdin in, stdout and stderr out, each capped at `max_output_bytes` (the run is stopped when one passes it).

What it does not protect against: kernel exploits (the namespaces and the kernel are the boundary; for hostile code
at scale add a VM or gVisor), CPU contention and page-cache pressure on the host within the limits, reading what
the read-only Python installation holds, and side channels. `sandbox="none"` (trusted code only) runs the program as
a plain subprocess with the rlimits: no isolation at all.

No working bwrap, or one in which the interpreter (`PYTHON`) does not run, is a `SandboxUnavailableError` naming
the problem and the fix, raised by `require_sandbox` at start-up and by the first run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from hyflow.sandbox.bwrap import INSTALL_HINT, PYTHON, SandboxUnavailableError, find_bwrap
from hyflow.sandbox.cgroup import find_memory_cgroup
from hyflow.sandbox.config import SANDBOX_KINDS, SandboxConfig, SandboxKind
from hyflow.sandbox.runner import SandboxResult, run_in_sandbox

__all__ = [
    "INSTALL_HINT",
    "PYTHON",
    "SANDBOX_KINDS",
    "SandboxConfig",
    "SandboxKind",
    "SandboxResult",
    "SandboxUnavailableError",
    "require_sandbox",
    "run_in_sandbox",
    "run_in_sandbox_sync",
]


def require_sandbox(kind: SandboxKind, python: str = PYTHON) -> None:
    """SandboxUnavailableError now (at start-up) unless `kind` can run the interpreter `python` here (bwrap: it must
    print in a sandbox set up as for a run); 'none' always can."""
    if kind == "bwrap":
        find_bwrap(python)
        find_memory_cgroup()  # logs, once, when a call's memory can only be bounded per process


def run_in_sandbox_sync(
    argv: Sequence[str],
    config: SandboxConfig,
    files: Mapping[str, str | bytes] | None = None,
    stdin: bytes = b"",
    merge_stderr: bool = False,
) -> SandboxResult:
    """`run_in_sandbox` for synchronous callers (reward functions); not from inside a running event loop."""
    return asyncio.run(run_in_sandbox(argv, config, files, stdin, merge_stderr))
