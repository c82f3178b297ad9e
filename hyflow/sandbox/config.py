"""`SandboxConfig`: the limits of one sandboxed run, checked when it is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Literal

SandboxKind = Literal["bwrap", "none"]
SANDBOX_KINDS: tuple[str, ...] = ("bwrap", "none")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits of one run. `sandbox="none"` runs the program as a plain subprocess with the rlimits only: unsafe,
    for trusted code (see `hyflow.sandbox`)."""

    sandbox: SandboxKind = "bwrap"
    time_limit: float = 5.0  # wall-clock seconds; then every process of the sandbox is killed
    cpu_time_limit: float | None = None  # RLIMIT_CPU seconds per process; None: time_limit rounded up, + 1
    # RLIMIT_AS of each process; where a memory cgroup is available, also the cap of the whole call (all its
    # processes together, plus work_dir_mb for its files). Without one a call may use up to
    # max_processes x memory_limit_mb (+ work_dir_mb): see docs/howto/tools.md.
    memory_limit_mb: int = 1024
    max_output_bytes: int = 4096  # kept of stdout (and of stderr); the run is stopped once a stream passes it
    work_dir_mb: int = 64  # size of the private writable work directory (a tmpfs), the only writable path
    max_file_bytes: int = 16 * 2**20  # RLIMIT_FSIZE: the largest file the code may write
    max_open_files: int = 64  # RLIMIT_NOFILE
    max_processes: int = 8  # RLIMIT_NPROC: processes and threads the sandboxed code may have at once

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_KINDS:
            raise ValueError(
                f"sandbox={self.sandbox!r} is not a sandbox kind; use 'bwrap' (isolated) or 'none' (unsafe: trusted "
                "code only)."
            )
        positive = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sandbox", "cpu_time_limit")}
        if self.cpu_time_limit is not None:
            positive["cpu_time_limit"] = self.cpu_time_limit
        for key, value in positive.items():
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"sandbox setting {key}={value!r} must be a positive number.")
        if self.max_processes < 2:
            raise ValueError(f"sandbox setting max_processes={self.max_processes} must be >= 2 (the launcher and the "
                             "program each count).")  # fmt: skip

    @property
    def cpu_seconds(self) -> int:
        """RLIMIT_CPU in whole seconds."""
        if self.cpu_time_limit is not None:
            return math.ceil(self.cpu_time_limit)
        return math.ceil(self.time_limit) + 1


def rlimits(config: SandboxConfig, with_nproc: bool) -> dict[str, int]:
    """The resource limits of a run, by `resource` constant name."""
    limits = {
        "RLIMIT_CPU": config.cpu_seconds,
        "RLIMIT_AS": config.memory_limit_mb * 2**20,
        "RLIMIT_FSIZE": config.max_file_bytes,
        "RLIMIT_NOFILE": config.max_open_files,
        "RLIMIT_CORE": 0,
    }
    if with_nproc:
        limits["RLIMIT_NPROC"] = config.max_processes
    return limits
