"""The slowloris's head-deadline wave, without a victim (issue 28, session 17): how the data plane's closes at
``header_read_timeout`` and its loop thread's CPU are spread over time.

A ``serve`` with its defaults pinned to the first core, and ``--connections`` slowloris connections (all held:
fewer than ``max_connections``, so none is refused) from ``--sources`` addresses on the second core under
``SCHED_IDLE`` (benchmarks/attackers.py; each reopened at once when the gateway closes it). After ``--warm``
seconds, over ``--seconds``: the heads closed at their deadline each second (``sgw_head_timeouts_total``) and
the CPU of the gateway's loop thread every 100 ms (its schedstat). Connections admitted together that reach
their deadline together come back as a wave: thousands of closes in a second, then none for nine. The CPU is
the process's own, so it holds up under load better than a latency; say the load anyway.

    .venv/bin/python benchmarks/head_wave.py [--connections 4000] [--sources 4] [--seconds 40] [--timeout 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.attackers import Attack  # noqa: E402
from benchmarks.harness import footer, header  # noqa: E402


def loop_cpu_ms(pid: int) -> float:
    """The CPU the gateway's main (loop) thread has used, in ms."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e6


async def head_timeouts(http: aiohttp.ClientSession, control_url: str) -> float:
    async with http.get(f"{control_url}/metrics") as response:
        text = await response.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("sgw_head_timeouts_total"))


async def sample(pid: int, http: aiohttp.ClientSession, control_url: str, seconds: float) -> tuple[list[float], list[float]]:
    """(loop CPU ms per 100 ms, head timeouts per second) over ``seconds``."""
    cpu: list[float] = []
    closes: list[float] = []
    last_cpu, last_closed = loop_cpu_ms(pid), await head_timeouts(http, control_url)
    for tick in range(1, int(seconds * 10) + 1):
        await asyncio.sleep(0.1)
        now = loop_cpu_ms(pid)
        cpu.append(now - last_cpu)
        last_cpu = now
        if tick % 10 == 0:
            closed = await head_timeouts(http, control_url)
            closes.append(closed - last_closed)
            last_closed = closed
    return cpu, closes


async def run(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    from tests.gateway_process import GatewayProcess

    first, *rest = sorted(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        os.sched_setaffinity(0, {first})  # the gateway inherits it
        gateway = await GatewayProcess(Path(tmp) / "gw", env={
            "SANDBOX_GATEWAY_ACCESS_LOG": "false", "SANDBOX_GATEWAY_HEADER_READ_TIMEOUT": str(args.timeout)}).start()
        os.sched_setaffinity(0, set(rest) or {first})
        try:
            target = gateway.data_url.split("://", 1)[1]
            sources = [f"127.0.0.{2 + i}" for i in range(args.sources)]
            async with Attack(target, "slowloris", args.connections, sources, args.connections, 30.0, idle=True), \
                    aiohttp.ClientSession() as http:
                await asyncio.sleep(args.warm)
                return await sample(gateway.proc.pid, http, gateway.control_url, args.seconds)
        finally:
            await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=4_000, help="slowloris connections held")
    parser.add_argument("--sources", type=int, default=4, help="source addresses (127.0.0.2 on)")
    parser.add_argument("--timeout", type=float, default=10.0, help="header_read_timeout (the default's)")
    parser.add_argument("--warm", type=float, default=12.0, help="seconds before measuring (the first wave)")
    parser.add_argument("--seconds", type=float, default=40.0, help="the measured window")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(header("head_wave", f"attack:       {args.connections} slowloris connections from {args.sources} "
                 f"addresses, reopened at once when closed; header_read_timeout {args.timeout:g} s; {args.seconds:g} s measured", installed=True), flush=True)
    cpu, closes = asyncio.run(run(args))
    per_second = [sum(cpu[i:i + 10]) / 10 for i in range(0, len(cpu) - 9, 10)]  # % of a core
    ranked = sorted(cpu)
    print(f"head timeouts per second: max {max(closes):.0f}, seconds with none: {closes.count(0)} of {len(closes)}")
    print(f"loop thread CPU per second: mean {statistics.mean(per_second):.0f}%, max {max(per_second):.0f}%, "
          f"sd {statistics.pstdev(per_second):.1f}; per 100 ms: p90 {ranked[int(len(ranked) * 0.9)]:.0f}, "
          f"p99 {ranked[int(len(ranked) * 0.99)]:.0f}, max {ranked[-1]:.0f} ms")
    print("head timeouts, each second: " + " ".join(f"{x:.0f}" for x in closes))
    print(footer())


if __name__ == "__main__":
    main()
