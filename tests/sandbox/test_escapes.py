"""Code written to escape the bubblewrap sandbox does not: every test runs an attack and checks the host."""

from __future__ import annotations

import socket
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hyflow.sandbox import PYTHON, SandboxConfig, run_in_sandbox_sync
from hyflow.sandbox.cgroup import find_memory_cgroup
from hyflow.sandbox.seccomp import denied_syscalls

pytestmark = pytest.mark.timeout(60)


def run(code: str, **limits) -> str:
    """stdout + stderr of `code` run as main.py in the sandbox."""
    config = SandboxConfig(**{"time_limit": 10, **limits})
    files = {"main.py": textwrap.dedent(code)}
    result = run_in_sandbox_sync([PYTHON, "-I", "main.py"], config, files=files, merge_stderr=True)
    return result.stdout.decode(errors="replace")


def test_the_guard_reset_trick_gives_nothing_to_switch_off(tmp_path):
    target = tmp_path / "pwned"
    output = run(f"""
        import os, sys
        sys.modules['__main__']._BLOCKED = frozenset()
        print('exit', os.system('echo pwned > {target}'))
    """)
    assert "exit" in output and not target.exists()


def test_posixsubprocess_fork_exec_runs_only_inside(tmp_path):
    target = tmp_path / "pwned"
    output = run(f"""
        import _posixsubprocess, os, sys
        args = [b'/bin/sh', b'-c', b'echo pwned > {target}']
        call = [args, args[:1], True, (), None, None, -1, -1, -1, -1, -1, -1, *os.pipe(), False, False, -1,
                None, None, None, -1, None] + ([False] if sys.version_info < (3, 14) else [])
        print('status', os.waitpid(_posixsubprocess.fork_exec(*call), 0)[1])
    """)
    assert "status" in output and not target.exists(), output


def test_ctypes_system_runs_only_inside(tmp_path):
    target = tmp_path / "pwned"
    output = run(f"""
        import ctypes
        print('status', ctypes.CDLL(None).system(b'touch {target}'))
    """)
    assert "status" in output and not target.exists(), output


def test_a_process_of_the_host_cannot_be_killed():
    victim = subprocess.Popen(["sleep", "60"])
    try:
        output = run(f"""
            import os, signal
            try:
                os.kill({victim.pid}, signal.SIGKILL)
                print('killed')
            except ProcessLookupError:
                print('no such process')
        """)
        assert victim.poll() is None and "no such process" in output
    finally:
        victim.kill()
        victim.wait()


def test_a_write_outside_the_work_dir_fails(tmp_path):
    output = run(f"""
        for path in ['{tmp_path}/x', '/usr/x', '/x', '/dev/x', '/proc/x']:
            try:
                open(path, 'w').write('x')
                print('wrote', path)
            except OSError as error:
                print('refused', path, type(error).__name__)
        open('/tmp/inside', 'w').write('fine')
        print('work dir ok')
    """)
    assert "wrote" not in output and output.count("refused") == 5 and "work dir ok" in output
    assert list(tmp_path.iterdir()) == []


def test_a_file_of_the_host_cannot_be_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the-secret-" + uuid.uuid4().hex)
    output = run(f"""
        import os
        for path in ['{secret}', '/etc/shadow', '/root', os.path.expanduser('~')]:
            try:
                print(open(path).read() if os.path.isfile(path) else os.listdir(path))
            except OSError as error:
                print(type(error).__name__)
    """)
    assert "the-secret-" not in output and "root:" not in output and "FileNotFoundError" in output


def test_a_port_listening_on_the_host_loopback_is_unreachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        output = run(f"""
            import socket
            try:
                socket.create_connection(('127.0.0.1', {port}), timeout=2)
                print('connected')
            except OSError as error:
                print('refused', type(error).__name__)
        """)
        with pytest.raises(TimeoutError):
            server.accept()
    assert "refused ConnectionRefusedError" in output


def test_a_fork_bomb_is_bounded_by_the_process_limit():
    output = run(
        """
        import os, time
        children = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as error:
            print('stopped after', children, type(error).__name__)
        """,
        max_processes=16,
    )
    started = int(output.split("stopped after")[1].split()[0])
    assert started < 16 and "BlockingIOError" in output


def test_a_10_gib_allocation_fails():
    output = run("block = bytearray(10 * 2**30)\nprint('allocated')", memory_limit_mb=512)
    assert "MemoryError" in output and "allocated" not in output


FORK_FOUR_CHILDREN_OF_80_MB = """
    import os, select
    children, (ready_r, ready_w), (go_r, go_w) = [], os.pipe(), os.pipe()
    for _ in range(4):
        if (pid := os.fork()) == 0:  # each child holds 80 MB, under its own 128 MB address-space limit
            os.close(go_w)
            block = b"x" * (80 * 2**20)
            os.write(ready_w, b"r")
            os.read(go_r, 1)
            os._exit(0)
        children.append(pid)
    os.close(go_r)
    ready, ended = 0, {}
    while ready + len(ended) < len(children):  # until each child holds its block or has died
        if select.select([ready_r], [], [], 0.05)[0]:
            ready += len(os.read(ready_r, 64))
        ended.update((pid, status) for pid in children if pid not in ended
                     for done, status in [os.waitpid(pid, os.WNOHANG)] if done)
    os.close(go_w)
    ended.update((pid, os.waitpid(pid, 0)[1]) for pid in children if pid not in ended)
    print("killed", sum(os.WIFSIGNALED(status) for status in ended.values()), "of 4")
"""


def test_children_each_under_the_memory_limit_are_stopped_by_the_cap_on_the_whole_call():
    assert find_memory_cgroup() is not None, (
        "this machine gives hyflow no writable memory cgroup (see hyflow.sandbox.cgroup): run the tests as root, or "
        "in a cgroup whose memory controller is delegated"
    )
    config = SandboxConfig(time_limit=20, memory_limit_mb=128, work_dir_mb=1)
    code = textwrap.dedent(FORK_FOUR_CHILDREN_OF_80_MB)
    result = run_in_sandbox_sync([PYTHON, "-I", "-c", code], config, merge_stderr=True)
    killed = int(result.stdout.decode().split("killed")[1].split()[0])
    assert killed >= 2 and result.out_of_memory, result  # 4 x 80 MB held at once cannot fit in 128 + 1 MB


def test_a_nested_user_or_mount_namespace_cannot_be_made():
    output = run("""
        import subprocess
        for flags in ['-U', '-Urm', '-Urn']:
            done = subprocess.run(['unshare', flags, 'true'], capture_output=True, text=True)
            print(flags, done.returncode, done.stderr.strip())
    """)
    lines = output.splitlines()
    assert len(lines) == 3 and all(line.split()[1] == "1" and "unshare failed" in line for line in lines), output


def test_the_kernel_keyring_is_refused_by_the_seccomp_filter():
    keyctl = denied_syscalls()["keyctl"]
    output = run(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.syscall({keyctl}, 0, -3, 0), os.strerror(ctypes.get_errno()))  # KEYCTL_GET_KEYRING_ID, session
    """)
    assert output == "-1 Operation not permitted\n", output


def test_threads_forks_and_subprocesses_still_work_under_the_seccomp_filter():
    output = run("""
        import os, subprocess, threading
        thread = threading.Thread(target=print, args=('thread',))
        thread.start()
        thread.join()
        if os.fork() == 0:
            os._exit(7)
        print('fork', os.WEXITSTATUS(os.wait()[1]))
        print(subprocess.run(['echo', 'subprocess'], capture_output=True, text=True).stdout.strip())
    """)
    assert output.split() == ["thread", "fork", "7", "subprocess"], output


def _processes_with(marker: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                found.append(cmdline.parent.name)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("main_waits", [False, True], ids=["program-exits", "program-times-out"])
def test_a_setsid_grandchild_is_gone_when_the_call_returns(main_waits):
    marker = f"hyflow-escape-{uuid.uuid4().hex}"
    started = time.monotonic()
    run(
        f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv('/bin/sleep', ['{marker}', '120'])
            os._exit(0)
        time.sleep(0.5)
        print('parent leaves', flush=True)
        if {main_waits}:
            time.sleep(120)
        """,
        time_limit=3,
    )
    assert time.monotonic() - started < 60
    assert _processes_with(marker) == []
