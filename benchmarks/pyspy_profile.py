"""Where the gateway's CPU per request goes: py-spy's raw folded stacks split by function (``proxy_bench --profile``).

py-spy samples wall clock, so the split divides the *measured* user CPU per request (total minus
stime, from ``harness.CpuMeter``) in proportion to the samples outside syscalls; the kernel part is
the measured stime, not py-spy's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.harness import Cpu

_SYSCALLS = ("write (", "writev (", "read (", "readv (", "epoll_", "sendmsg (", "recvmsg (", "send (", "recv (",
             "accept", "close (", "__libc_write", "__libc_read")
_PARSER = ("llhttp", "httptools", "parser.c", "http_parser")
_LOOP = ("loop.c", "core.c", "stream.c", "linux.c", "uv__", "uv_")


def breakdown(path: Path, user_us: float, top: int = 25) -> list[tuple[str, float]]:
    """Where a gateway's user-space CPU per request goes, from py-spy's raw folded stacks at ``path``.

    py-spy samples wall clock; a process preempted inside a syscall (waking a peer on a loaded
    machine) shows as running there, so syscall samples are left out and the kernel's share is the
    measured stime instead. The other samples divide ``user_us`` (measured, total - stime): by the
    innermost Python function (with the interpreter and C builtins it calls), unless the innermost
    frames are the parser (llhttp, httptools) or the event loop (uvloop, libuv).
    """
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        if frames[-1].startswith(_SYSCALLS):
            continue
        last_py = max((i for i, frame in enumerate(frames) if ".py:" in frame), default=-1)
        below = frames[last_py + 1:]
        if any(mark in frame for frame in below for mark in _PARSER):
            key = "[parser: llhttp/httptools]"
        elif any(mark in frame for frame in below for mark in _LOOP) or last_py < 0:
            key = "[event loop: uvloop/libuv]"
        else:
            frame = frames[last_py]
            name, _, where = frame.partition(" (")
            module = where.split(":")[0]
            key = f"{name} ({module})"
        counts[key] = counts.get(key, 0) + int(n)
    total = sum(counts.values()) or 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    rows = [(key, user_us * n / total) for key, n in ranked[:top]]
    rest = sum(n for _, n in ranked[top:])
    if rest:
        rows.append(("(everything else)", user_us * rest / total))
    return rows


def py_spy(pid: int, out: Path, duration: float) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid``'s tree (native frames too) for ``duration`` seconds, raw folded stacks to ``out``."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.path.exists(exe):
        print("  --profile: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return None
    return subprocess.Popen([exe, "record", "--native", "--subprocesses", "--format", "raw", "--rate", "250",
                             "--pid", str(pid), "--duration", str(max(1, round(duration))), "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_breakdowns(directory: Path, measured: dict[tuple[int, int], dict[str, Cpu]]) -> None:
    """For each (workers, concurrency) profiled into ``directory``, the gateway's measured CPU per request split."""
    for (workers, c), cpus in measured.items():
        path = directory / f"gateway-w{workers}-c{c}.txt"
        cpu = cpus.get("gateway")
        if not path.exists() or cpu is None:
            continue
        user = cpu.us - cpu.sys_us
        print(f"\ngateway CPU per request, {workers} worker(s), c={c}: {cpu.us:.1f} us = "
              f"{cpu.sys_us:.1f} kernel (syscalls, loopback TCP) + {user:.1f} user, of which (py-spy, {path.name}):")
        for key, us in breakdown(path, user):
            print(f"  {us:6.2f} us  {key}")
