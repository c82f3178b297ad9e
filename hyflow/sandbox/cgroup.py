"""The memory cap of one whole sandboxed call: a fresh memory cgroup that bwrap, and so every process of the call,
runs in.

`RLIMIT_AS` bounds each process alone; a cgroup bounds their sum (and the files the call writes to its tmpfs, whose
pages are charged to it). Found once per process, in this order:
- cgroup v2 (the unified hierarchy): hyflow's own cgroup, or its parent, already hands the `memory` controller to
  its children (`cgroup.subtree_control`) and is writable, as the root cgroup or a delegated systemd slice is;
  limits: `memory.max`, `memory.swap.max = 0`, `memory.oom.group = 1` (the OOM killer ends the whole call);
- cgroup v1's memory hierarchy, writable (root on a host or container with cgroups v1 or hybrid); limits:
  `memory.limit_in_bytes` and, where swap is accounted, `memory.memsw.limit_in_bytes`.
Neither (an ordinary user without delegation, a container with a read-only /sys/fs/cgroup): `find_memory_cgroup()`
is None and the call is bounded only by its rlimits (see `docs/howto/tools.md`). hyflow never moves itself or
enables controllers: it only creates, fills and removes cgroups named `hyflow-sandbox-*` there; a trial one at
start-up checks that this works, a shell moving itself in included.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)
_REMOVE_SECONDS = 5.0  # how long the dying processes of a call may take to leave its cgroup
# `sh -c JOIN_AND_EXEC CGROUP_PROCS PROGRAM ARGS...`: the shell moves itself into the cgroup, then becomes PROGRAM
JOIN_AND_EXEC = 'echo $$ > "$0" && exec "$@"'


@dataclass(frozen=True)
class MemoryCgroup:
    """Where the per-call cgroups are made: `parent` (a directory of the cgroup file system) and its version."""

    parent: Path
    version: int

    def limit_files(self, limit_bytes: int) -> dict[str, str]:
        """The files to write, in order, to cap a child's memory at `limit_bytes` (swap included)."""
        if self.version == 2:
            return {"memory.max": str(limit_bytes), "memory.swap.max": "0", "memory.oom.group": "1"}
        return {"memory.limit_in_bytes": str(limit_bytes), "memory.memsw.limit_in_bytes": str(limit_bytes)}


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root of the mount, file-system type, super options) of every cgroup mount (mountinfo)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        fs_type, _source, options = [*tail.split(), "", "", ""][:3]
        if fs_type in ("cgroup", "cgroup2"):
            found.append((fields.split()[4], fields.split()[3], fs_type, options))
    return found


def _under(mount_point: str, root: str, path: str) -> Path:
    """The directory of cgroup `path` in a mount of the hierarchy's `root` at `mount_point`."""
    relative = path[len(root) :] if root != "/" and path.startswith(root) else path
    return Path(mount_point + relative)


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per hierarchy: '' for v2, each controller name for v1 (/proc/self/cgroup)."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _candidates() -> Iterator[MemoryCgroup]:
    """Parents that could hold per-call memory cgroups: own v2 cgroup, or its parent, when it hands `memory` to its
    children; then own v1 memory cgroup."""
    own = _own_cgroups()
    for mount_point, root, fs_type, options in _mounts():
        if fs_type == "cgroup2" and "" in own:
            mine = _under(mount_point, root, own[""])
            for parent in dict.fromkeys([mine, mine.parent if mine != Path(mount_point) else mine]):
                with contextlib.suppress(OSError):
                    if "memory" in (parent / "cgroup.subtree_control").read_text().split():
                        yield MemoryCgroup(parent, 2)
        elif fs_type == "cgroup" and "memory" in options.split(",") and "memory" in own:
            yield MemoryCgroup(_under(mount_point, root, own["memory"]), 1)


def _works(candidate: MemoryCgroup) -> bool:
    """Whether a child cgroup can be made and capped under `candidate`, and a shell moved into it, as for a call
    (a trial child, removed again)."""
    trial = candidate.parent / f"hyflow-sandbox-probe-{uuid.uuid4().hex[:8]}"
    try:
        trial.mkdir()
    except OSError:
        return False
    try:
        _write_limits(trial, candidate, 64 * 2**20)
        command = ["/bin/sh", "-c", JOIN_AND_EXEC, str(trial / "cgroup.procs"), "/bin/true"]
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        remove_call_cgroup(trial)


@functools.cache
def find_memory_cgroup() -> MemoryCgroup | None:
    """The place for per-call memory cgroups (see the module docstring), or None; found once per process."""
    try:
        found = next((c for c in _candidates() if _works(c)), None)
    except OSError:  # no /proc/self/cgroup or mountinfo: not Linux as we know it
        found = None
    if found is None:
        logger.warning(
            "sandbox: no writable memory cgroup here, so a call's memory is bounded per process only (up to "
            "max_processes x memory_limit_mb + work_dir_mb); run as root or in a cgroup with the memory controller "
            "delegated to cap each call as a whole (docs/howto/tools.md)"
        )
    return found


def _write_limits(path: Path, cgroup: MemoryCgroup, limit_bytes: int) -> None:
    for name, value in cgroup.limit_files(limit_bytes).items():
        file = path / name
        if file.exists() or name in ("memory.max", "memory.limit_in_bytes"):  # the cap itself is required
            file.write_text(value)


def create_call_cgroup(cgroup: MemoryCgroup, limit_bytes: int) -> Path:
    """A fresh child cgroup capped at `limit_bytes`; the caller puts the call's first process in its cgroup.procs."""
    path = cgroup.parent / f"hyflow-sandbox-{uuid.uuid4().hex}"
    path.mkdir()
    try:
        _write_limits(path, cgroup, limit_bytes)
    except OSError:
        path.rmdir()
        raise
    return path


def oom_killed(path: Path) -> bool:
    """Whether the kernel's OOM killer ended a process of the call cgroup at `path` (its cap was reached)."""
    for name, key in (("memory.events", "oom_kill"), ("memory.oom_control", "oom_kill")):
        with contextlib.suppress(OSError):
            for line in (path / name).read_text().splitlines():
                if line.split()[0] == key:
                    return int(line.split()[1]) > 0
    return False


def remove_call_cgroup(path: Path) -> None:
    """Kill what is left in the call cgroup at `path`, then remove it (waiting up to a few seconds for the dying)."""
    deadline = time.monotonic() + _REMOVE_SECONDS
    while True:
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as error:
            if time.monotonic() > deadline:
                logger.warning("sandbox cgroup %s not removed: %s", path, error)
                return
            time.sleep(0.01)
