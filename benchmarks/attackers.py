"""The attackers of benchmarks/neighbours.py: processes that hold thousands of idle or slowloris connections from
several loopback source addresses against one port, for as long as they run.

A process may hold 20,000 descriptors here, so an attack of 20,000 connections runs in several processes
(:class:`Attack` starts them and reads their stats). Each slot reconnects when the gateway closes it: at once
if the gateway had held it (a deadline, a shed), after ``reopen`` seconds if it was refused at a bound, so
the port stays as full as the attackers can keep it without turning the attack into a flood of connects.

    python benchmarks/attackers.py TARGET idle|slowloris SOURCES PER_SOURCE REOPEN   (run by Attack)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import resource
import signal
import socket
import struct
import sys
from collections.abc import Callable

SLOW_HEAD = b"GET /hello HTTP/1.1\r\nHost: 127.0.0.1\r\nX-User-Id: attacker\r\n"


def drop(sock: socket.socket) -> None:
    """Close with a reset: tens of thousands of closes leave no TIME_WAIT behind on the attacker's side."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@dataclasses.dataclass
class AttackStats:
    connects: int = 0       # connections made
    failed: int = 0         # connects that failed (the backlog full, a timeout)
    held: int = 0           # open now (connected, not closed by the gateway)
    closed: int = 0         # closed by the gateway (refused, shed, or a deadline)


async def hold(target: tuple[str, int], source: str, mode: str, reopen: float, stats: AttackStats,
               first: asyncio.Event, stop: asyncio.Event) -> None:
    """One attacker slot: connect from ``source``, say nothing (idle) or dribble a head (slowloris) until the
    gateway closes, until ``stop``. A connection the gateway held (closed at a deadline, or shed) is reopened at
    once, so the port stays as full as the attacker can keep it; one refused at a bound (:func:`refusal`) is
    retried after ``reopen`` seconds (jittered): a tighter loop is a flood of connects, a different attack
    (``--reopen 5`` shows it)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
            await asyncio.wait_for(loop.sock_connect(sock, target), 10)
        except (OSError, TimeoutError):
            drop(sock)
            stats.failed += 1
            first.set()
            await asyncio.sleep(reopen * random.uniform(0.5, 1.5))
            continue
        stats.connects += 1
        stats.held += 1
        first.set()
        said = b""  # the gateway's first words: a refusal, or a timeout's
        try:
            if mode == "slowloris":
                await loop.sock_sendall(sock, SLOW_HEAD)
            while not stop.is_set():
                try:
                    data = await asyncio.wait_for(loop.sock_recv(sock, 4096), 3 if mode == "slowloris" else 30)
                except TimeoutError:
                    if mode == "slowloris":
                        await loop.sock_sendall(sock, b"X-Slow: %d\r\n" % random.randrange(1 << 30))
                    continue
                if not data:
                    break
                if len(said) < 4096:
                    said += data
        except OSError:
            pass
        finally:
            stats.held -= 1
            drop(sock)
        if not stop.is_set():
            stats.closed += 1
            await asyncio.sleep(reopen * random.uniform(0.5, 1.5) if refusal(said) else random.uniform(0, 0.5))


def refusal(said: bytes) -> bool:
    """Whether the gateway refused the connection at a bound: a 503 on the data plane, GOAWAY ENHANCE_YOUR_CALM
    (after its SETTINGS) on the gRPC front. A deadline's close or a shed is not one."""
    if said.startswith(b"HTTP/1.1 503 "):
        return True
    at = 0
    while at + 9 <= len(said):
        length, kind = int.from_bytes(said[at:at + 3], "big"), said[at + 3]
        if kind == 0x7 and at + 17 <= len(said):  # GOAWAY: last stream id, then the error code
            return int.from_bytes(said[at + 13:at + 17], "big") == 0xB
        at += 9 + length
    return False


async def attacker_main(target: str, mode: str, sources: list[str], per_source: int, reopen: float) -> None:
    """An attacker process: ``per_source`` slots from each of ``sources``; prints ``ready`` once every slot has
    tried its first connect, then its stats as JSON when it gets SIGTERM."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    host, port = target.rsplit(":", 1)
    stats, stop = AttackStats(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def parent_gone() -> None:  # stdin is the parent's pipe: at its end, stop (the parent died without telling)
        if not os.read(0, 1024):
            loop.remove_reader(0)
            stop.set()

    loop.add_reader(0, parent_gone)
    tasks, firsts = [], []
    for start in range(0, per_source, 100):  # in waves: the listener's backlog is finite
        wave = []
        for source in sources:
            for _ in range(min(100, per_source - start)):
                first = asyncio.Event()
                firsts.append(first)
                wave.append(first)
                tasks.append(asyncio.create_task(hold((host, int(port)), source, mode, reopen, stats, first, stop)))
        await asyncio.gather(*(f.wait() for f in wave))
    print("ready " + json.dumps(dataclasses.asdict(stats)), flush=True)
    await stop.wait()
    final = dataclasses.asdict(stats)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    print("stats " + json.dumps(final), flush=True)


class Attack:
    """``connections`` slots from ``sources`` addresses against ``target``, over processes of ``per_process``."""

    def __init__(self, target: str, mode: str, connections: int, sources: list[str], per_process: int,
                 reopen: float, niceness: int = 0, idle: bool = False,
                 join: Callable[[], None] | None = None) -> None:
        self.niceness = niceness  # added to the attacker processes' nice value (neighbours.py: they yield to the victim)
        self.idle = idle  # SCHED_IDLE: they run only when nothing else on their core wants to (neighbours.py)
        self.join = join  # run in each attacker process before it starts: into a capped cgroup (placement.CpuCap)
        per_source = connections // len(sources)
        per_process_per_source = max(1, per_process // len(sources))
        self.commands = []
        left = per_source
        while left > 0:
            n = min(left, per_process_per_source)
            self.commands.append([sys.executable, __file__, target, mode, ",".join(sources), str(n),
                                  str(reopen)])
            left -= n
        self.procs: list[asyncio.subprocess.Process] = []
        self.ready: list[dict[str, int]] = []

    async def __aenter__(self) -> Attack:
        for command in self.commands:
            self.procs.append(await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                preexec_fn=self._yielding if self.niceness or self.idle or self.join else None))
        for proc in self.procs:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 300)).decode()
            if not line.startswith("ready "):
                raise RuntimeError(f"an attacker process failed: {line!r}")
            self.ready.append(json.loads(line[6:]))
        return self

    def _yielding(self) -> None:
        """In the attacker process, before it runs: its cgroup, scheduling policy or nice value."""
        if self.join is not None:
            self.join()
        if self.idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        if self.niceness:
            os.nice(self.niceness)

    async def __aexit__(self, *_: object) -> None:
        self.final = []
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
            if line.startswith("stats "):
                self.final.append(json.loads(line[6:]))
            await proc.wait()

    def total(self, stats: list[dict[str, int]]) -> dict[str, int]:
        return {key: sum(s[key] for s in stats) for key in ("connects", "failed", "held", "closed")}


if __name__ == "__main__":
    target, mode, sources, per_source, reopen = sys.argv[1:6]
    import uvloop  # the gateway's loop: the same connections and bytes for less of the attacker's CPU (session 18)

    uvloop.run(attacker_main(target, mode, sources.split(","), int(per_source), float(reopen)))
