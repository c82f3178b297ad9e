"""The bubblewrap command line of one sandboxed run, and the check that bubblewrap works here.

The sandbox sees, read-only: `/usr` (with the `/bin`, `/lib*` links or folders of the host), the dynamic linker's
cache, and the Python installation that runs hyflow (so programs can use the same interpreter and packages). It
gets its own `/proc` and a minimal `/dev` (read-only), and one writable directory, `/tmp`: a tmpfs of
`work_dir_mb`, the work directory. Nothing else of the host's file system exists inside.

As an ordinary user, bwrap puts the run in new user, PID, network, IPC, UTS and cgroup namespaces
(`--unshare-all`). As root, a user namespace could only map the sandbox to root outside, which the kernel exempts
from `RLIMIT_NPROC`; so bwrap runs in its privileged mode with every capability dropped except CAP_SETUID/SETGID, and
the launcher uses them once to become a fresh unprivileged uid (all capabilities are gone after that), before the
program starts. Both modes: `--die-with-parent`, `--new-session`, no network but a loopback of its own.
"""

from __future__ import annotations

import functools
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), or set "
    "`sandbox: none` to run the code without isolation (unsafe: trusted code only)"
)
WORK_DIR = "/tmp"
_HOST_TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.py").read_text()


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or does not work on this machine."""


@functools.cache
def _probe(bwrap: str, as_root: bool) -> str:
    """'' when a trivial sandbox runs, else bwrap's complaint (checked once per program and mode)."""
    command = [bwrap, *namespace_args(as_root), *filesystem_args(work_dir_mb=1), "--", "/bin/true"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)
    return "" if result.returncode == 0 else (result.stderr.strip() or f"exit code {result.returncode}")


def find_bwrap() -> str:
    """The path of a working `bwrap`; SandboxUnavailableError naming the program and the fix otherwise."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(f"the sandbox program `bwrap` (bubblewrap) is not on PATH: {INSTALL_HINT}.")
    problem = _probe(bwrap, os.geteuid() == 0)
    if problem:
        raise SandboxUnavailableError(
            f"`{bwrap}` cannot start a sandbox here ({problem}); user namespaces may be disabled "
            f"(sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0), or {INSTALL_HINT}."
        )
    return bwrap


def namespace_args(as_root: bool) -> list[str]:
    """The namespaces and process options (see the module docstring for the two modes)."""
    common = ["--die-with-parent", "--new-session"]
    if not as_root:
        return ["--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", *common]
    unshare = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    return [*unshare, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", *common]


def _python_dirs() -> list[str]:
    """The installation(s) of the running interpreter: the base prefix, a virtual environment's prefix, and the
    folder of the executable when it lives elsewhere."""
    dirs = [os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(sys.executable))]
    unique: list[str] = []
    for path in sorted(set(dirs), key=len):
        if not any(path == u or path.startswith(u + os.sep) for u in unique) and not path.startswith("/usr/"):
            unique.append(path)
    return unique


def _bind_with_parents(path: str, made: set[str]) -> list[str]:
    """--ro-bind `path` at the same place, creating its parent folders world-traversable (bwrap would copy their
    modes, e.g. /root's 0700, which the unprivileged uid could not cross)."""
    args: list[str] = []
    parent = Path(path).parent
    for folder in reversed([parent, *parent.parents]):
        if str(folder) not in ("/", *made):
            made.add(str(folder))
            args += ["--perms", "0755", "--dir", str(folder)]
    return [*args, "--ro-bind", path, path]


def filesystem_args(work_dir_mb: int) -> list[str]:
    """Read-only system folders and Python, own /proc and /dev, and the size-capped writable work dir."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in _HOST_TOP_DIRS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += [arg for etc in _ETC_FILES if os.path.exists(etc) for arg in ("--ro-bind", etc, etc)]
    made = {"/usr", "/etc"}
    for path in _python_dirs():
        args += _bind_with_parents(path, made)
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(work_dir_mb * 2**20), "--tmpfs", WORK_DIR]
    return [*args, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK_DIR]


def sandbox_uid() -> int:
    """A fresh uid for one run as root, so that runs do not share an RLIMIT_NPROC count."""
    return random.randrange(1 << 20, 1 << 30)
