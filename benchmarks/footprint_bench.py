"""Redis bytes per session, key by key: where the footprint goes.

    .venv/bin/python benchmarks/footprint_bench.py [--sessions 10000] [--url redis://...]

Fills a private redis-server (or ``--url``, flushed first) with ``--sessions`` sessions, each bound
to its own ready ``ses-`` sandbox, through the store's own scripts (``RedisStore.load_ready``, as
``fleet_bench.py`` does), then prints:

- ``used_memory`` per session (what the fleet costs, the dictionaries' own overhead included);
- ``MEMORY USAGE`` (exact, ``SAMPLES 0``) of each kind of key: a binding string and a sandbox hash
  (median over a sample), the shared zsets and hashes divided by the session count, and each key's
  encoding (``OBJECT ENCODING``: a listpack hash, an embstr string);
- what is left: the main dictionary's per-key entry, not in any key's ``MEMORY USAGE``.

At 1,000,000: ``--url`` a redis-server of your own, ``--jobs 2``, then ``fleet_bench.py --url ...
--no-fill --sandboxes 1000000`` on the same server for idle CPU, listing, resolution and reaping.

Before/after: run with ``PYTHONPATH`` pointing at another checkout; it uses only ``load_ready``,
``keys`` and the codec that checkout has.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

from redis.asyncio import Redis

if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet_bench import PREFIX, per_session  # noqa: E402

from gateway.model import Endpoint  # noqa: E402
from gateway.store.redis import RedisStore  # noqa: E402


async def fill_range(url: str, first: int, stop: int) -> None:
    store = RedisStore(url, PREFIX, "bench-loader", socket_timeout=120.0)
    endpoint = Endpoint("10.12.34.56", 8888)  # a pod IP and the runtime port: a realistic endpoint
    try:
        for start in range(first, stop, 2000):
            await store.load_ready([(*per_session(i), endpoint) for i in range(start, min(stop, start + 2000))])
    finally:
        await store.close()


def _fill_job(url: str, first: int, stop: int) -> None:
    asyncio.run(fill_range(url, first, stop))


async def fill(url: str, count: int, jobs: int = 1) -> None:
    """Load ``count`` sessions (``jobs`` processes, each a share), then mark every sandbox and session
    active now: a fill that takes longer than a pool's idle timeout must not leave the first ones idle
    (``fleet_bench.py --no-fill`` then measures a fleet with nothing to reap)."""
    if jobs <= 1:
        await fill_range(url, 0, count)
    else:
        from concurrent.futures import ProcessPoolExecutor

        share = -(-count // jobs)
        loop = asyncio.get_running_loop()
        with ProcessPoolExecutor(jobs) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, _fill_job, url, start, min(count, start + share))
                                   for start in range(0, count, share)))
    store = RedisStore(url, PREFIX, "bench-loader", socket_timeout=120.0)
    try:
        for start in range(0, count, 5000):
            chunk = [per_session(i) for i in range(start, min(count, start + 5000))]
            now = time.time()
            await store.touch({record.sandbox_id: now for _, record in chunk},
                              {binding.session_id: now for binding, _ in chunk})
    finally:
        await store.close()


async def measure(url: str, count: int, sample: int, *, load: bool, jobs: int) -> list[tuple[str, float, str]]:
    client = Redis.from_url(url, decode_responses=True)
    store = RedisStore(url, PREFIX, "bench-measure")
    keys = store.keys
    try:
        if load:
            await client.flushdb()
            base = (await client.info("memory"))["used_memory"]
            await fill(url, count, jobs)
        else:  # what a previous fill left: against the server's own baseline
            base = (await client.info("memory"))["used_memory_startup"]
        used = (await client.info("memory"))["used_memory"] - base
        rows: list[tuple[str, float, str]] = [("used_memory per session (all included)", used / count, "")]
        picks = random.Random(7).sample(range(count), min(sample, count))
        binding_key = lambda i: keys.binding(per_session(i)[0].session_id)  # noqa: E731
        sandbox_key = lambda i: keys.sandbox(per_session(i)[1].sandbox_id)  # noqa: E731
        accounted = 0.0
        for name, key_of in (("binding string", binding_key), ("sandbox hash", sandbox_key)):
            sizes = [await client.memory_usage(key_of(i), samples=0) or 0 for i in picks]
            encoding = await client.object("encoding", key_of(picks[0]))
            size = statistics.median(sizes)
            accounted += size
            rows.append((f"{name} (median, key name included)", size, encoding))
        for name in ("session_seen", "sandboxes", "count_pool", "count_org", "count_state", "count_sessions"):
            key = getattr(keys, name)
            total = await client.memory_usage(key, samples=0) or 0
            accounted += total / count
            rows.append((f"{key} / session", total / count, await client.object("encoding", key) or "absent"))
        dbsize = await client.dbsize()
        rows.append((f"main dict and the rest ({dbsize / count:.2f} keys per session)", used / count - accounted, ""))
        return rows
    finally:
        await store.close()
        await client.aclose()


async def run(args: argparse.Namespace, url: str) -> None:
    client = Redis.from_url(url, decode_responses=True)
    config = await client.config_get("hash-max-listpack-*")
    version = (await client.info("server"))["redis_version"]
    await client.aclose()
    started = time.perf_counter()
    rows = await measure(url, args.sessions, args.sample, load=args.fill, jobs=args.jobs)
    if args.fill:
        print(f"filled in {time.perf_counter() - started:.0f} s ({args.jobs} job(s))")
    print(f"{args.sessions:,} sessions, each with its own ready sandbox; redis {version} {config}; "
          f"code from {os.environ.get('PYTHONPATH') or 'this checkout'}")
    for name, size, encoding in rows:
        print(f"  {name:<58} {size:>8,.0f} B  {encoding}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--sample", type=int, default=200, help="keys sampled for MEMORY USAGE")
    parser.add_argument("--jobs", type=int, default=1, help="processes filling at once")
    parser.add_argument("--url", help="an existing Redis (flushed first!); default: a private redis-server")
    parser.add_argument("--no-fill", dest="fill", action="store_false",
                        help="with --url: measure what a previous fill left (--sessions of them), flush nothing")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("footprint_bench.py"):
        if args.url:
            asyncio.run(run(args, args.url))
            return
        from tests.redis_server import RedisServer

        with RedisServer() as server:  # a private one, removed with its data afterwards
            asyncio.run(run(args, server.url))


if __name__ == "__main__":
    main()
