"""`run_in_sandbox`: run one program in the sandbox with its files, its stdin, and the limits of a `SandboxConfig`.

    result = await run_in_sandbox([PYTHON, "-I", "main.py"], config, files={"main.py": code}, stdin=b"3 4\\n")
    result.stdout, result.exit_code, result.timed_out

`files` are written into the work directory before the program starts (it runs there). Where a memory cgroup can be
made (`hyflow.sandbox.cgroup`), each call gets a fresh one capped at `memory_limit_mb + work_dir_mb` for all its
processes together, removed after the call; `result.out_of_memory` says the cap was hit. With `sandbox="none"` the
program runs as a plain subprocess in a temporary directory, with the same rlimits except RLIMIT_NPROC (which
would count every process of the user) and inside `unshare -rn` when the host allows it: no isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hyflow.sandbox.bwrap import WORK_DIR, bwrap_options, find_bwrap, sandbox_command, seccomp_args
from hyflow.sandbox.cgroup import JOIN_AND_EXEC, create_call_cgroup, find_memory_cgroup, oom_killed, remove_call_cgroup
from hyflow.sandbox.config import SandboxConfig, rlimits

_DRAIN_SECONDS = 5.0  # after the kill: how long the pipes may take to report their end
# One thread per math library: a pool of one thread per host core would run into RLIMIT_NPROC.
_THREADS = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8", "PYTHONHASHSEED": "0",
        **_THREADS}  # fmt: skip


@dataclass
class SandboxResult:
    """How one run ended. `exit_code` is None when the run was stopped (time limit or output cap); a negative code
    is the signal that ended the program (e.g. -9 for SIGKILL after RLIMIT_CPU)."""

    stdout: bytes
    stderr: bytes
    exit_code: int | None
    timed_out: bool = False
    output_truncated: bool = False
    out_of_memory: bool = False  # the whole-call memory cap (a cgroup, where there is one) was reached


def call_memory_cap_bytes(config: SandboxConfig) -> int:
    """The cap on the memory of all processes of one call together, with the files of its work dir, where a memory
    cgroup is available: one process's limit plus the work dir."""
    return (config.memory_limit_mb + config.work_dir_mb) * 2**20


def _set_rlimits(limits: dict[str, int]) -> None:
    """preexec_fn of an unsandboxed run (after fork, before exec)."""
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


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


@contextlib.contextmanager
def _memfds(files: Mapping[str, str | bytes]) -> Iterator[list[tuple[int, str]]]:
    """(fd, name) of an in-memory file per entry, for bwrap's `--file FD DEST`; closed afterwards."""
    opened: list[tuple[int, str]] = []
    try:
        for name, content in files.items():
            fd = os.memfd_create(f"hyflow-sandbox-{Path(name).name}", 0)
            opened.append((fd, name))
            os.write(fd, content.encode() if isinstance(content, str) else content)
            os.lseek(fd, 0, os.SEEK_SET)
        yield opened
    finally:
        for fd, _ in opened:
            os.close(fd)


def _check_names(files: Mapping[str, str | bytes]) -> None:
    for name in files:
        if not name or name.startswith("/") or ".." in Path(name).parts:
            raise ValueError(f"sandbox file name {name!r} must be a relative path inside the work directory.")


async def run_in_sandbox(
    argv: Sequence[str],
    config: SandboxConfig,
    files: Mapping[str, str | bytes] | None = None,
    stdin: bytes = b"",
    merge_stderr: bool = False,
) -> SandboxResult:
    """Run `argv` (its program an absolute path) in the work directory holding `files`, feeding `stdin`.
    `merge_stderr` sends stderr into stdout (in order), as a terminal would show them."""
    files = dict(files or {})
    _check_names(files)
    if config.sandbox == "none":
        return await _run_unsandboxed(argv, config, files, stdin, merge_stderr)
    bwrap = find_bwrap()
    cgroup = find_memory_cgroup()
    call_cgroup = create_call_cgroup(cgroup, call_memory_cap_bytes(config)) if cgroup else None
    try:
        result = await _run_bwrap(bwrap, argv, config, files, stdin, merge_stderr, call_cgroup)
        result.out_of_memory = call_cgroup is not None and oom_killed(call_cgroup)
        return result
    finally:
        if call_cgroup is not None:
            await asyncio.to_thread(remove_call_cgroup, call_cgroup)


async def _run_bwrap(
    bwrap: str,
    argv: Sequence[str],
    config: SandboxConfig,
    files: dict[str, str | bytes],
    stdin: bytes,
    merge_stderr: bool,
    call_cgroup: Path | None,
) -> SandboxResult:
    """One bwrap run; with `call_cgroup`, bwrap starts in it (a shell writes its own pid there, then execs bwrap),
    so every process of the call is counted against its cap."""
    with _memfds(files) as staged, seccomp_args(bwrap_options(bwrap)) as (seccomp, seccomp_fds):
        read_info, write_info = os.pipe()
        file_args = [a for fd, name in staged for a in ("--perms", "0644", "--file", str(fd), f"{WORK_DIR}/{name}")]
        command = sandbox_command(bwrap, config, argv, [*file_args, *seccomp, "--info-fd", str(write_info)])
        if call_cgroup is not None:
            command = ["/bin/sh", "-c", JOIN_AND_EXEC, str(call_cgroup / "cgroup.procs"), *command]
        fds = [fd for fd, _ in staged] + seccomp_fds + [write_info]
        try:
            try:
                process = await _spawn(command, merge_stderr, pass_fds=fds)
            finally:
                os.close(write_info)
            info = asyncio.ensure_future(asyncio.to_thread(_read_child_pid, read_info))
            try:
                return await _communicate(process, config, stdin, functools.partial(_kill_sandbox, process, info))
            finally:
                await asyncio.gather(info, return_exceptions=True)
        finally:
            os.close(read_info)


def _read_child_pid(fd: int) -> int | None:
    """The host pid of the sandbox's PID-namespace init, from bwrap's `--info-fd` JSON (written once it started;
    None when bwrap ended first)."""
    data = b""
    while chunk := os.read(fd, 4096):
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])
    return None


def _kill_sandbox(process: asyncio.subprocess.Process, info: asyncio.Future) -> None:
    """Kill the sandbox's PID-namespace init (the kernel then kills every process in the namespace), and bwrap."""
    if process.returncode is not None:
        return
    child_pid = info.result() if info.done() and info.exception() is None else None
    if child_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


async def _run_unsandboxed(
    argv: Sequence[str], config: SandboxConfig, files: dict[str, str | bytes], stdin: bytes, merge_stderr: bool
) -> SandboxResult:
    prefix = ["unshare", "-rn"] if network_namespace_available() else []
    with tempfile.TemporaryDirectory(prefix="hyflow-sandbox-none-") as workdir:
        for name, content in files.items():
            path = Path(workdir, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        limits = rlimits(config, with_nproc=False)
        process = await _spawn(
            [*prefix, *argv], merge_stderr, cwd=workdir, env={**_ENV, "HOME": workdir},
            preexec_fn=functools.partial(_set_rlimits, limits),
        )  # fmt: skip

        def kill() -> None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

        return await _communicate(process, config, stdin, kill)


async def _spawn(command: list[str], merge_stderr: bool, **kwargs) -> asyncio.subprocess.Process:
    kwargs.setdefault("env", {**_ENV, "HOME": WORK_DIR})
    return await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        start_new_session=True,
        **kwargs,
    )


async def _read_capped(stream: asyncio.StreamReader | None, chunks: list[bytes], cap: int, over: asyncio.Event):
    """Keep the first `cap` bytes of `stream` in `chunks` and set `over` past them; read on to EOF, so that the
    pipe never fills up and the end of the process is always seen."""
    size = 0
    while stream is not None and (chunk := await stream.read(65536)):
        if size <= cap:
            chunks.append(chunk)
        size += len(chunk)
        if size > cap:
            over.set()


async def _feed(process: asyncio.subprocess.Process, data: bytes) -> None:
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            process.stdin.write(data)
            await process.stdin.drain()
        process.stdin.close()


async def _communicate(process: asyncio.subprocess.Process, config: SandboxConfig, stdin: bytes, kill) -> SandboxResult:
    """Feed stdin, collect capped stdout/stderr, and stop everything at the time limit or the output cap."""
    out: list[bytes] = []
    err: list[bytes] = []
    cap, over = config.max_output_bytes, asyncio.Event()
    readers = [asyncio.ensure_future(_read_capped(stream, chunks, cap, over)) for stream, chunks in
               ((process.stdout, out), (process.stderr, err))]  # fmt: skip
    feeder = asyncio.ensure_future(_feed(process, stdin))
    exited, over_cap = asyncio.ensure_future(process.wait()), asyncio.ensure_future(over.wait())
    timed_out = False
    try:
        async with asyncio.timeout(config.time_limit):
            await asyncio.wait([exited, over_cap], return_when=asyncio.FIRST_COMPLETED)
            if not over.is_set():
                await asyncio.gather(*readers)
    except TimeoutError:
        timed_out = True
    finally:
        kill()
        _, pending = await asyncio.wait([*readers, exited], timeout=_DRAIN_SECONDS)
        if pending:  # `sandbox="none"`: an escaped process still holds the pipes; asyncio has no public close
            process._transport.close()  # type: ignore[attr-defined]
        await asyncio.gather(*readers, feeder, exited, return_exceptions=True)
        over_cap.cancel()
    truncated = over.is_set()
    stopped = timed_out or truncated
    return SandboxResult(
        stdout=b"".join(out)[:cap],
        stderr=b"".join(err)[:cap],
        exit_code=None if stopped else process.returncode,
        timed_out=timed_out and not truncated,
        output_truncated=truncated,
    )
