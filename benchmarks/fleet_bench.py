"""Background cost at fleet size: a replica's idle CPU, one page of GET /v1/sandboxes, a reaper pass.

    .venv/bin/python benchmarks/fleet_bench.py [--sandboxes 100000] [--seconds 30] [--url redis://...]

1. Fills a Redis with ``--sandboxes`` sessions, each bound to its own ready sandbox, through the
   store's own scripts (``RedisStore.load_ready``: ``put_binding``, ``reserve_sandbox`` and
   ``mark_ready`` pipelined; versions without it: those public calls, many in flight), so the
   layout is exactly what a running gateway writes; prints Redis ``used_memory`` per session.
2. Starts a real ``sandbox-gateway serve`` on that Redis (default policy, local provider, no
   traffic) and reads its CPU time from ``/proc/<pid>/stat`` over ``--seconds``: the idle cost of
   gauges, reaping and orphan sweeps at that size. Target: under 2% at 100,000.
3. Route resolution on a cache miss (``get_binding`` + ``get_sandbox``), median of 2,000.
   ``GET /v1/sandboxes?limit=100`` on that replica: the median of ``--requests`` requests (the
   first one alone on versions without paging, which answer everything). Target: under 50 ms.
4. One reaper pass (``reap_once`` + ``sweep_orphans``, what a replica runs every
   ``reap_interval``) in this process with nothing idle (the steady state), then with every
   sandbox idle (``--idle-pass``: batches until the pass's budget is spent). With ``--drain S``,
   passes back to back for up to S seconds: the reaping throughput, and how long 58% of the
   fleet (the issue's backlog) would take to drain at it. Target: under 10 minutes.
   ``GET /v1/sandboxes?state=suspended&limit=100`` (a filter that matches nothing here: the
   worst case of a filtered page) is timed beside the unfiltered page. Target: under 20 ms.

Before/after: run it with ``PYTHONPATH`` pointing at another checkout (e.g. an exported
``main``); it uses only calls that every version has. Each run prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState  # noqa: E402
from gateway.store.base import Caps  # noqa: E402
from gateway.store.redis import RedisStore  # noqa: E402
from routing import Isolation  # noqa: E402

PREFIX = "sgw"  # serve's default --redis-prefix
INFLIGHT = 256


def per_session(i: int) -> tuple[Binding, SandboxRecord]:
    """Session ``i`` bound to its own ``ses-`` sandbox; realistic lengths (UUID orgs and users)."""
    session_id = f"agent_{i:08d}-5453-4ae3-a51f-a8d2274a7b56"
    sandbox_id = "ses-" + hashlib.sha256(session_id.encode()).hexdigest()[:48]
    owner = Owner(f"{i % 977:08d}-5453-4ae3-a51f-a8d2274a7b56", f"{i:08d}-63c2-4d14-84b3-60d6ac3b592f", None)
    now = time.time()
    binding = Binding(session_id, sandbox_id, "small", Isolation.PER_SESSION, owner, now)
    return binding, SandboxRecord(sandbox_id, "small", owner.org_id, SandboxState.CREATING, created_at=now,
                                  owner=owner)


async def fill(url: str, count: int) -> tuple[float, float]:
    """Seconds to load ``count`` sessions, and Redis bytes per session (``used_memory`` delta)."""
    store = RedisStore(url, PREFIX, "bench-loader", max_connections=INFLIGHT, socket_timeout=60.0)
    started = time.perf_counter()
    endpoint = Endpoint("127.0.0.1", 9)
    client = Redis.from_url(url)
    used = (await client.info("memory"))["used_memory"]

    async def one(i: int) -> None:
        binding, record = per_session(i)
        await store.put_binding(binding)
        await store.reserve_sandbox(record, Caps(), 600)
        await store.mark_ready(record.sandbox_id, endpoint)

    try:
        if hasattr(store, "load_ready"):  # the bulk path: the same scripts, pipelined
            for start in range(0, count, 2000):
                await store.load_ready([(*per_session(i), endpoint) for i in range(start, min(count, start + 2000))])
        else:
            for start in range(0, count, INFLIGHT):
                await asyncio.gather(*(one(i) for i in range(start, min(count, start + INFLIGHT))))
        elapsed = time.perf_counter() - started
        per = ((await client.info("memory"))["used_memory"] - used) / count
    finally:
        await store.close()
        await client.aclose()
    return elapsed, per


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def idle_cpu_and_listing(url: str, seconds: float, requests: int, workdir: Path) -> tuple[float, float, str]:
    from tests.gateway_process import GatewayProcess

    gateway = await GatewayProcess(workdir, "--redis-url", url, "--no-access-log").start(timeout=120)
    try:
        assert gateway.proc is not None
        worker = next(int(line.split("pid ")[1].split(")")[0]) for line in gateway.log if "serving (worker" in line)
        pids = {gateway.proc.pid, worker}
        await asyncio.sleep(5.0)  # past startup
        before = {pid: cpu_seconds(pid) for pid in pids}
        await asyncio.sleep(seconds)
        used = sum(cpu_seconds(pid) - before[pid] for pid in pids)
        timings = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            for _ in range(requests):
                started = time.perf_counter()
                async with http.get(f"{gateway.control_url}/v1/sandboxes", params={"limit": "100"}) as response:
                    body = await response.json()
                timings.append(time.perf_counter() - started)
                if response.status != 200:
                    outcome = f"{response.status} {body['error']['code']}"
                    break
                outcome = f"{len(body['sandboxes']):,} listed"
                if len(body["sandboxes"]) > 100:
                    break  # a version without paging answered everything: one request says enough
        filtered = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
            for _ in range(requests):
                started = time.perf_counter()
                async with http.get(f"{gateway.control_url}/v1/sandboxes",
                                    params={"limit": "100", "state": "suspended"}) as response:
                    await response.read()
                filtered.append(time.perf_counter() - started)
        outcome += f"; ?state=suspended page {statistics.median(filtered) * 1000:.1f} ms"
        return used / seconds * 100, statistics.median(timings) * 1000, outcome
    finally:
        await gateway.stop()


async def route_resolution(url: str, count: int, lookups: int = 2000) -> float:
    """Median ms of what a replica does on a route-cache miss (``get_binding`` then ``get_sandbox``)."""
    import random

    store = RedisStore(url, PREFIX, "bench-lookups")
    try:
        timings = []
        for i in random.Random(7).sample(range(count), min(lookups, count)):
            binding, _ = per_session(i)
            started = time.perf_counter()
            found = await store.get_binding(binding.session_id)
            assert found is not None and await store.get_sandbox(found.sandbox_id) is not None
            timings.append(time.perf_counter() - started)
        return statistics.median(timings) * 1000
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def reaper(url: str, workdir: Path, offset: float, name: str) -> AsyncIterator[Any]:
    """A router in this process holding the reaper lease, its clock ``offset`` seconds on."""
    from gateway.providers.base import PoolProviders
    from gateway.providers.local import LocalProvider
    from gateway.sessions import SessionRouter
    from routing import default_policy

    store = RedisStore(url, PREFIX, name, clock=lambda: time.time() + offset)
    local = LocalProvider(workdir, stop_on_close=False)
    providers = PoolProviders({"small": local, "shared": local})
    router = SessionRouter(store, providers, default_policy([]), replica_id=name, clock=lambda: time.time() + offset)
    await providers.start(router.sandbox_lost)
    try:
        await store._redis.delete(store.keys.lease("reaper"))  # the stopped replica's lease
        yield router
    finally:
        await providers.close()
        await store.close()


async def reap_pass(url: str, workdir: Path, *, idle: bool) -> tuple[float, int]:
    offset = 86_400.0 * 2 if idle else 0.0  # a clock two days on: every sandbox (and session) is idle
    async with reaper(url, workdir, offset, "bench-reaper") as router:
        started = time.perf_counter()
        reaped = await router.lifecycle.reap_once()
        await router.lifecycle.sweep_orphans(600.0)
        return (time.perf_counter() - started) * 1000, len(reaped)


async def drain(url: str, workdir: Path, seconds: float) -> tuple[int, float]:
    """Reaper passes back to back, every sandbox idle, for up to ``seconds`` (or until drained):
    (sandboxes reaped, seconds taken). What the lease holder does while a backlog lasts, minus the
    sleep between passes (serve's pass goes on for up to 4 x reap_interval, then sleeps one)."""
    reaped = 0
    async with reaper(url, workdir, 86_400.0 * 2, "bench-drain") as router:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            done = len(await router.lifecycle.reap_once())
            reaped += done
            if not done:
                break
        return reaped, time.perf_counter() - started


async def run(args: argparse.Namespace, url: str) -> None:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        if args.fill:
            loaded, per_session_bytes = await fill(url, args.sandboxes)
            print(f"filled {args.sandboxes:,} sessions, each with its own ready sandbox, in {loaded:.1f} s: "
                  f"{per_session_bytes:,.0f} B of redis used_memory per session", flush=True)
        cpu, list_ms, listed = await idle_cpu_and_listing(url, args.seconds, args.requests, Path(tmp) / "serve")
        print(f"idle CPU {cpu:.2f}%, listing {list_ms:.1f} ms ({listed})", flush=True)
        lookup_ms = await route_resolution(url, args.sandboxes)
        steady_ms, _ = await reap_pass(url, Path(tmp) / "reaper", idle=False)
        rows = [
            ("route resolution, cache miss (p50)", f"{lookup_ms:.2f} ms", ""),
            ("replica idle CPU", f"{cpu:.2f}%", "< 2%"),
            ("GET /v1/sandboxes?limit=100", f"{list_ms:.1f} ms ({listed})", "< 50 ms"),
            ("reaper pass + sweep, nothing idle", f"{steady_ms:.1f} ms", ""),
        ]
        if args.idle_pass:
            idle_ms, reaped = await reap_pass(url, Path(tmp) / "reaper", idle=True)
            rows.append(("reaper pass + sweep, all idle", f"{idle_ms:.1f} ms ({reaped:,} reaped)", ""))
        if args.drain:
            drained, took = await drain(url, Path(tmp) / "drain", args.drain)
            rate = drained / took if took else 0.0
            backlog = 0.58 * args.sandboxes
            rows.append(("reaping throughput, all idle", f"{rate:,.0f}/s ({drained:,} in {took:.0f} s)", ""))
            rows.append((f"drain 58% of {args.sandboxes:,} at that rate", f"{backlog / rate / 60:.1f} min" if rate
                         else "-", "< 10 min"))
    print(f"\n{args.sandboxes:,} sandboxes, code from {os.environ.get('PYTHONPATH') or 'this checkout'}")
    for name, value, target in rows:
        print(f"  {name:<36} {value:>28}  {target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sandboxes", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=30.0, help="idle CPU measured over this long")
    parser.add_argument("--requests", type=int, default=20, help="GET /v1/sandboxes requests (median)")
    parser.add_argument("--idle-pass", action="store_true", help="also reap one batch with everything idle")
    parser.add_argument("--drain", type=float, default=0.0, metavar="SECONDS",
                        help="then reap passes back to back, everything idle, for up to this long: the reaping "
                             "throughput and the time 58%% of the fleet would take to drain")
    parser.add_argument("--url", help="an existing Redis (flushed first!); default: a private redis-server")
    parser.add_argument("--no-fill", dest="fill", action="store_false",
                        help="with --url: measure what is there (a previous run's fill), flush nothing")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("fleet_bench.py"):
        if args.url:
            import redis

            if args.fill:
                redis.Redis.from_url(args.url).flushdb()
            asyncio.run(run(args, args.url))
            return
        from tests.redis_server import RedisServer

        with RedisServer() as server:  # a private one, removed with its data afterwards
            asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()
