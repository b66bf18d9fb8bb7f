"""A seccomp filter that denies a sandbox new user namespaces (bubblewrap loads it: ``--seccomp FD``).

Why: inside a user namespace of its own a process holds every capability over the namespaces it then
creates (``unshare -Ur`` gives uid 0 there): mount, network and the like, a much larger kernel surface
than a plain unprivileged UID, and the door to most container-escape bugs of recent years. A gateway
running as root gives each sandbox a plain UID and no user namespace (confine.py); this closes the way
back in. bubblewrap's ``--disable-userns`` would need the sandbox to run in a user namespace of ours,
which the root mode avoids on purpose, so the filter is ours, the same in both modes.

What it denies: ``unshare`` and ``clone`` with ``CLONE_NEWUSER`` (EPERM), ``clone3`` (ENOSYS: its flags
are in memory a filter cannot read; glibc then falls back to ``clone``, so threads and processes start
as before), every syscall of another ABI (x32, 32-bit compat: EPERM). Everything else is allowed.

The program is classic BPF, built here from its instructions (no libseccomp needed): a list of
``struct sock_filter`` as the kernel and bubblewrap read it.
"""

from __future__ import annotations

import errno
import platform
import struct

CLONE_NEWUSER = 0x10000000

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_LD_ABS_W = 0x20   # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15        # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35        # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45       # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06        # BPF_RET | BPF_K
_X32_BIT = 0x40000000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian here)
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

# machine: (AUDIT_ARCH_*, unshare, clone, clone3)
_ARCHES = {
    "x86_64": (0xC000003E, 272, 56, 435),
    "aarch64": (0xC00000B7, 97, 220, 435),
}


class Unsupported(RuntimeError):
    """No filter for this machine's architecture."""


def no_new_userns(machine: str | None = None) -> bytes:
    """The compiled filter for ``machine`` (default: this one's)."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise Unsupported(f"no seccomp filter for {machine} (x86_64 and aarch64 have one)")
    arch, unshare, clone, clone3 = _ARCHES[machine]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    # (code, jump-if-true label, jump-if-false label, k); labels are resolved to relative offsets below
    program: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS_W, None, None, _ARCH),
        (_JEQ, None, "deny", arch),
        (_LD_ABS_W, None, None, _NR),
        (_JGE, "deny", None, _X32_BIT),
        (_JEQ, "nosys", None, clone3),
        (_JEQ, "flags", None, unshare),
        (_JEQ, "flags", "allow", clone),
    ]
    labels = {"flags": len(program)}
    program += [(_LD_ABS_W, None, None, _ARG0_LOW), (_JSET, "deny", "allow", CLONE_NEWUSER)]
    labels["allow"] = len(program)
    program.append((_RET, None, None, _RET_ALLOW))
    labels["deny"] = len(program)
    program.append((_RET, None, None, eperm))
    labels["nosys"] = len(program)
    program.append((_RET, None, None, enosys))

    def offset(at: int, label: str | None) -> int:
        return 0 if label is None else labels[label] - at - 1

    return b"".join(struct.pack("=HBBI", code, offset(i, jt), offset(i, jf), k)
                    for i, (code, jt, jf, k) in enumerate(program))
