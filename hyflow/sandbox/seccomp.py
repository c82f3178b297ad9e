"""The seccomp filter of the sandbox: a classic-BPF program, built here without libseccomp, for bwrap's `--seccomp FD`.

It refuses (EPERM) the system calls a program in the sandbox never needs and kernel exploits often start from:
new namespaces (`unshare`, `setns`, `clone` with a `CLONE_NEW*` flag: no nested user or mount namespace), the
mount API, the keyrings (not namespaced), `bpf`, `perf_event_open`, `userfaultfd`, io_uring, `ptrace`, module and
kexec loading, `open_by_handle_at` (the classic container escape), swap, reboot, accounting, quotas and the
kernel log. `clone3` gets ENOSYS (its flags sit in memory a filter cannot read), so the C library falls back to
`clone`, whose flags it checks. Every other call is allowed. A call from another ABI (32-bit or x32 on x86-64)
is refused, so that no second syscall table bypasses the list.

Machines other than x86-64 and AArch64 get no filter (`seccomp_filter()` returns None; the sandbox still runs).
"""

from __future__ import annotations

import errno
import platform
import struct

# syscall numbers, from the kernel's unistd_64.h (x86-64) and asm-generic/unistd.h (AArch64)
_DENIED = {  # name: (x86-64, AArch64)
    "unshare": (272, 97), "setns": (308, 268), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "open_tree": (428, 428), "move_mount": (429, 429), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "ptrace": (101, 117), "kexec_load": (246, 104),
    "kexec_file_load": (320, 294), "init_module": (175, 105), "finit_module": (313, 273),
    "delete_module": (176, 106), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "quotactl": (179, 60),
    "syslog": (103, 116), "lookup_dcookie": (212, 18),
}  # fmt: skip
_CLONE, _CLONE3 = (56, 220), (435, 435)
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # machine: (column above, AUDIT_ARCH_*)
_X32_BIT = 0x40000000  # x86-64: the x32 ABI's calls carry this bit
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
_LD_ABS_W, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16  # struct seccomp_data (args[0]'s low word: little-endian)


def denied_syscalls(machine: str | None = None) -> dict[str, int]:
    """The refused calls and their numbers on `machine` (default: this one); {} where no filter is built."""
    column = _ARCHES.get(machine or platform.machine(), (None, 0))[0]
    return {} if column is None else {name: numbers[column] for name, numbers in _DENIED.items()}


def _assemble(program: list[tuple]) -> bytes:
    """Encode (opcode, k) and (opcode, k, true_label, false_label) rows and ("label", name) markers into
    `struct sock_filter` records, turning labels into the forward jump offsets BPF wants."""
    positions, index = {}, 0
    for row in program:
        if row[0] == "label":
            positions[row[1]] = index
        else:
            index += 1
    out, index = [], 0
    for row in program:
        if row[0] == "label":
            continue
        code, k, *targets = row
        jt, jf = (positions[t] - index - 1 if isinstance(t, str) else t for t in (targets or (0, 0)))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a BPF jump only goes forward, at most 255 rows"
        out.append(struct.pack("=HBBI", code, jt, jf, k))
        index += 1
    return b"".join(out)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter (see the module docstring) for `machine` (default: this one), or None where there is none."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    column, audit_arch = _ARCHES[machine]
    program: list[tuple] = [(_LD_ABS_W, _OFFSET_ARCH), (_JEQ_K, audit_arch, 0, "deny"), (_LD_ABS_W, _OFFSET_NR)]
    if machine == "x86_64":
        program.append((_JGE_K, _X32_BIT, "deny", 0))
    program += [(_JEQ_K, numbers[column], "deny", 0) for numbers in _DENIED.values()]
    program += [
        (_JEQ_K, _CLONE[column], "clone", 0),
        (_JEQ_K, _CLONE3[column], "enosys", 0),
        (_RET_K, _RET_ALLOW),
        ("label", "clone"),
        (_LD_ABS_W, _OFFSET_ARG0),
        (_JSET_K, CLONE_NAMESPACE_FLAGS, "deny", 0),
        (_RET_K, _RET_ALLOW),
        ("label", "enosys"),
        (_RET_K, _RET_ERRNO | errno.ENOSYS),
        ("label", "deny"),
        (_RET_K, _RET_ERRNO | errno.EPERM),
    ]
    return _assemble(program)
