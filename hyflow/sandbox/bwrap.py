"""The bubblewrap command line of one sandboxed run, and the check that bubblewrap works here.

The sandbox sees, read-only: `/usr` (with the `/bin`, `/lib*` links or folders of the host), the dynamic linker's
cache, and the Python installation that runs hyflow (so programs can use the same interpreter and packages):
its prefixes, site-packages and the folder of the executable, at their own paths and at their resolved ones,
wherever they are. It gets its own `/proc` and a minimal `/dev` (read-only), and one writable directory, `/tmp`: a
tmpfs of `work_dir_mb`, the work directory. The Python folders are bound after that tmpfs, so an installation under
`/tmp` (a CI virtual environment) shows through it, read-only. Nothing else of the host's file system exists inside.

As an ordinary user, bwrap puts the run in new user, PID, network, IPC, UTS and cgroup namespaces
(`--unshare-all`). As root, a user namespace could only map the sandbox to root outside, which the kernel exempts
from `RLIMIT_NPROC`; so bwrap runs in its privileged mode with every capability dropped except CAP_SETUID/SETGID, and
the launcher uses them once to become a fresh unprivileged uid (all capabilities are gone after that), before the
program starts. Both modes: `--die-with-parent`, `--new-session`, no network but a loopback of its own, and the
seccomp filter of `hyflow.sandbox.seccomp` (no nested namespaces, no keyrings, bpf, io_uring, ...). As an ordinary
user, where the installed bwrap has it (0.8+), also `--disable-userns`: the sandbox's user namespace allows no
nested one.

The start-up check (`find_bwrap`) runs the interpreter the programs will use, through the same launcher and
limits, and refuses to start when it does not print what it should.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shutil
import site
import stat
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from hyflow.sandbox.config import SandboxConfig, rlimits
from hyflow.sandbox.seccomp import seccomp_filter

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`; Fedora: `dnf install bubblewrap`), or set "
    "`sandbox: none` to run the code without isolation (unsafe: trusted code only)"
)
PYTHON = sys.executable  # the interpreter programs run with; the sandbox sees its installation read-only
WORK_DIR = "/tmp"
_HOST_TOP_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.py").read_text()


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or does not work on this machine."""


@functools.cache
def bwrap_options(bwrap: str) -> frozenset[str]:
    """The options this `bwrap` knows (from its --help), so that newer ones are used only where they exist. A setuid
    bwrap (privileged mode) is not offered `--disable-userns`: the seccomp filter denies nested namespaces there."""
    try:
        text = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=30).stdout
        setuid = bool(os.stat(bwrap).st_mode & stat.S_ISUID)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(word for word in text.split() if word.startswith("--") and not (setuid and "userns" in word))


def namespace_args(as_root: bool, options: frozenset[str] = frozenset()) -> list[str]:
    """The namespaces and process options (see the module docstring for the two modes)."""
    common = ["--die-with-parent", "--new-session"]
    if not as_root:
        no_nested = ["--disable-userns"] if "--disable-userns" in options else []
        return ["--unshare-all", "--unshare-user", *no_nested, "--uid", "65534", "--gid", "65534", *common]
    unshare = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    return [*unshare, "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", *common]


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def python_dirs(python: str = PYTHON) -> list[tuple[str, str]]:
    """(host folder, path inside) of what the interpreter `python` needs: the prefixes, the site-packages and the
    executable's folder, each at the path Python reports and at its resolved one, minus what `/usr` and the host's
    top folders already show and folders inside another one kept."""
    wanted = [sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix, *site.getsitepackages(),
              os.path.dirname(python), os.path.dirname(os.path.realpath(python))]  # fmt: skip
    paths = {os.path.abspath(p) for p in wanted if p} | {os.path.realpath(p) for p in wanted if p}
    shown = ("/usr", *_HOST_TOP_DIRS)
    kept: list[str] = []
    for path in sorted(paths, key=len):
        if path != "/" and os.path.isdir(path) and not any(_within(path, top) for top in (*shown, *kept)):
            kept.append(path)
    return [(os.path.realpath(path), path) for path in kept]


def _bind_with_parents(source: str, dest: str, made: set[str]) -> list[str]:
    """--ro-bind `source` at `dest`, creating its parent folders world-traversable (bwrap would copy their
    modes, e.g. /root's 0700, which the unprivileged uid could not cross)."""
    args: list[str] = []
    parent = Path(dest).parent
    for folder in reversed([parent, *parent.parents]):
        if str(folder) not in ("/", *made):
            made.add(str(folder))
            args += ["--perms", "0755", "--dir", str(folder)]
    return [*args, "--ro-bind", source, dest]


def filesystem_args(work_dir_mb: int, python: str = PYTHON) -> list[str]:
    """Read-only system folders, own /proc and /dev, the size-capped writable work dir, and then (so that one under
    /tmp shows through the work dir) the Python installation of `python`, read-only."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in _HOST_TOP_DIRS:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += [arg for etc in _ETC_FILES if os.path.exists(etc) for arg in ("--ro-bind", etc, etc)]
    args += ["--proc", "/proc", "--dev", "/dev"]
    args += ["--perms", "1777", "--size", str(work_dir_mb * 2**20), "--tmpfs", WORK_DIR]
    made = {"/usr", "/etc", WORK_DIR}
    for source, dest in python_dirs(python):
        args += _bind_with_parents(source, dest, made)
    return [*args, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORK_DIR]


def sandbox_uid() -> int:
    """A fresh uid for one run as root, so that runs do not share an RLIMIT_NPROC count."""
    return random.randrange(1 << 20, 1 << 30)


@contextlib.contextmanager
def seccomp_args(options: frozenset[str]) -> Iterator[tuple[list[str], list[int]]]:
    """(bwrap arguments, fds to pass) that load the seccomp filter from an in-memory file; none where this machine
    has no filter or bwrap no `--seccomp`. The fd is closed afterwards."""
    program = seccomp_filter()
    if program is None or "--seccomp" not in options:
        yield [], []
        return
    fd = os.memfd_create("hyflow-sandbox-seccomp", 0)
    try:
        os.write(fd, program)
        os.lseek(fd, 0, os.SEEK_SET)
        yield ["--seccomp", str(fd)], [fd]
    finally:
        os.close(fd)


def sandbox_command(bwrap: str, config: SandboxConfig, argv: Sequence[str], extra: Sequence[str] = (),
                    python: str = PYTHON) -> list[str]:  # fmt: skip
    """The bwrap command line of one run: namespaces, file system, `extra` options (files, fds), then the launcher
    (run by `python`), which drops to the run's uid, sets the rlimits and execs `argv`."""
    as_root = os.geteuid() == 0
    spec = json.dumps({"uid": sandbox_uid() if as_root else None, "rlimits": rlimits(config, with_nproc=True)})
    namespaces = namespace_args(as_root, bwrap_options(bwrap))
    launcher = [python, "-I", "-S", "-c", LAUNCHER_SOURCE, spec]
    return [bwrap, *namespaces, *filesystem_args(config.work_dir_mb, python), *extra, "--", *launcher, *argv]


def _run(command: list[str], fds: list[int]) -> subprocess.CompletedProcess | str:
    """The finished probe `command`, or the error that kept it from running."""
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30, pass_fds=fds)
    except (OSError, subprocess.SubprocessError) as error:
        return str(error)


def _complaint(result: subprocess.CompletedProcess | str) -> str:
    if isinstance(result, str):
        return result
    return result.stderr.strip()[-500:] or f"exit code {result.returncode}, output {result.stdout.strip()[:100]!r}"


@functools.cache
def _probe(bwrap: str, python: str) -> str:
    """'' when `python -I -c 'print(1)'` prints 1 in a sandbox set up as for a run (launcher, limits, seccomp),
    else what went wrong and the fix; checked once per bwrap and interpreter."""
    options = bwrap_options(bwrap)
    with seccomp_args(options) as (extra, fds):
        argv = [python, "-I", "-c", "print(1)"]
        result = _run(sandbox_command(bwrap, SandboxConfig(time_limit=30, work_dir_mb=1), argv, extra, python), fds)
    if not isinstance(result, str) and result.returncode == 0 and result.stdout.strip() == "1":
        return ""
    as_root = os.geteuid() == 0
    bare = _run([bwrap, *namespace_args(as_root, options), *filesystem_args(1, python), "--", "/bin/true"], [])
    if isinstance(bare, str) or bare.returncode != 0:
        return (
            f"`{bwrap}` cannot start a sandbox here ({_complaint(bare)}); user namespaces may be disabled "
            f"(sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0), or {INSTALL_HINT}."
        )
    shown = ", ".join(dest for _, dest in python_dirs(python))
    return (
        f"the sandbox cannot run the interpreter its programs use, {python}: `{python} -I -c 'print(1)'` inside it "
        f"gave: {_complaint(result)}. The sandbox shows /usr and, read-only, {shown}; fix: run hyflow with a Python "
        "whose files all lie in those folders and are readable by every user (a system Python, or a virtual "
        "environment of one, anywhere, /tmp included), or set `sandbox: none` (unsafe: trusted code only)."
    )


def find_bwrap(python: str = PYTHON) -> str:
    """The path of a `bwrap` that runs `python` in a sandbox; SandboxUnavailableError naming the problem and the
    fix otherwise."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailableError(f"the sandbox program `bwrap` (bubblewrap) is not on PATH: {INSTALL_HINT}.")
    problem = _probe(bwrap, python)
    if problem:
        raise SandboxUnavailableError(problem)
    return bwrap
