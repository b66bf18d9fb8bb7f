"""The Redis session store: route lookups/s and Redis memory per session.

    .venv/bin/python benchmarks/store_bench.py [--sessions 1000000] [--concurrency 1,16,64]
                                               [--seconds 3] [--url redis://host:port/db]

1. Route lookups (what a replica does on a route-cache miss: ``get_binding`` then
   ``get_sandbox``) against Redis, side by side with the in-process memory store
   as the baseline, at each concurrency (tasks sharing one store).
2. Memory: ``INFO memory`` ``used_memory`` before and after loading ``--sessions``
   bindings (realistic IDs: ``agent_<uuid>`` sessions, UUID orgs and users,
   ``--sessions-per-sandbox`` sessions per shared sandbox), divided by the count.
   Loading runs a bulk variant of the store's ``PUT_BINDING`` script (same writes,
   many bindings per call) on JSON checked against ``RedisStore.binding_json``, so
   the layout measured is exactly the one ``RedisStore.put_binding`` writes.
3. :func:`gateway_benchmarks`: route resolution from the per-process cache vs
   through Redis, and ``serve --workers 1/2/3`` on one Redis.
4. ``--mix``: the gateway's own mix at the store, from ``--mix-processes`` client processes
   (one client process saturates long before Redis does): per 100 operations 80 route
   look-ups (``get_binding`` + ``get_sandbox``), 8 new sessions with their own sandbox
   (``reserve_sandbox`` + ``mark_ready`` + ``put_binding``), 2 reaps (``release_sandbox`` of one of
   them, after a ``scan_sandboxes`` page) and 10 activity batches (``touch``, 20 entries). Redis's
   own CPU (``INFO cpu``, main thread) per operation gives the ceiling one Redis core carries
   (operations/s at 100%), reported with sessions per GiB from the memory measurement.

A private ``redis-server`` (tests/redis_server.py) is started unless ``--url`` is
given; on a shared server the memory delta includes everyone else's writes.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from redis.asyncio import Redis  # noqa: E402

from gateway.model import Binding, Endpoint, Owner, SandboxRecord, SandboxState  # noqa: E402
from gateway.store.base import Caps, SessionStore  # noqa: E402
from gateway.store.memory import MemoryStore  # noqa: E402
from gateway.store.redis import RedisStore  # noqa: E402
from gateway.store.redis_scripts import RedisKeys  # noqa: E402
from routing import Isolation, shared_sandbox_id  # noqa: E402

LOOKUP_SESSIONS = 10_000
BATCH = 500  # bindings per bulk-load script call

BULK_PUT_BINDINGS = """
-- PUT_BINDING (gateway/store/redis_scripts.py) for many bindings in one call, same writes.
-- KEYS[1] seen zset, KEYS[2] count:sessions hash, then per binding: KEYS[2i+1] binding string,
-- KEYS[2i+2] the sandbox hash
-- ARGV per binding: binding (compact), session id, created_at, pool (4 each)
-- returns the number of bindings stored (an existing binding wins and is skipped)
local stored = 0
for i = 1, #ARGV / 4 do
  local key, sandbox = KEYS[2 * i + 1], KEYS[2 * i + 2]
  local value, session_id, created_at, pool = ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i]
  if redis.call('SET', key, value, 'NX') then
    redis.call('ZADD', KEYS[1], created_at, session_id)
    if redis.call('HSETNX', sandbox, '+' .. session_id, '') == 1 then redis.call('HINCRBY', sandbox, 'n', 1) end
    redis.call('HINCRBY', KEYS[2], pool, 1)
    stored = stored + 1
  end
end
return stored
"""


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    value: str
    baseline: str = ""
    ratio: str = ""


def make_binding(i: int, per_sandbox: int, now: float) -> Binding:
    org = str(uuid.UUID(int=i // per_sandbox + 1))
    user = str(uuid.UUID(int=(i // per_sandbox + 1) << 64))
    return Binding(f"agent_{uuid.UUID(int=i)}", shared_sandbox_id(org, user, None), "shared", Isolation.SHARED,
                   Owner(org, user, None), now)


def fast_bindings(start: int, stop: int, per_sandbox: int, now: float) -> list[tuple[str, str, str]]:
    """(session ID, sandbox ID, stored value) of ``make_binding(i)`` for i in [start, stop), written by
    ``RedisStore.binding_value``: exactly what ``put_binding`` stores."""
    rows = []
    for i in range(start, stop):
        binding = make_binding(i, per_sandbox, now)
        rows.append((binding.session_id, binding.sandbox_id, RedisStore.binding_value(binding)))
    return rows


async def seed(store: SessionStore, count: int, per_sandbox: int) -> list[str]:
    now = time.time()
    sessions = []
    for start in range(0, count, 500):
        bindings = [make_binding(i, per_sandbox, now) for i in range(start, min(count, start + 500))]
        await asyncio.gather(*(store.put_binding(b) for b in bindings))
        for b in bindings[::per_sandbox]:
            record = SandboxRecord(b.sandbox_id, b.pool, b.owner.org_id, SandboxState.CREATING, created_at=now)
            await store.reserve_sandbox(record, Caps(), 30)
            await store.mark_ready(b.sandbox_id, Endpoint("10.0.0.1", 8080))
        sessions += [b.session_id for b in bindings]
    return sessions


async def lookups_per_second(store: SessionStore, sessions: list[str], concurrency: int, seconds: float) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        nonlocal done
        i = offset
        while time.perf_counter() < deadline:
            binding = await store.get_binding(sessions[i % len(sessions)])
            assert binding is not None
            assert await store.get_sandbox(binding.sandbox_id) is not None
            done += 1
            i += concurrency

    started = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(concurrency)))
    return done / (time.perf_counter() - started)


async def round_trips_per_second(url: str, concurrency: int, seconds: float) -> float:
    """Plain redis-py GETs: the client's ceiling on this machine (a lookup is two round trips)."""
    client = Redis.from_url(url, decode_responses=True)
    try:
        await client.set("bench:probe", "x")
        done = 0
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await client.get("bench:probe")
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)
    finally:
        await client.delete("bench:probe")
        await client.aclose()


async def bench_lookups(url: str, concurrency: list[int], seconds: float, per_sandbox: int) -> list[Row]:
    memory = MemoryStore()
    redis_store = RedisStore(url, f"bench-{uuid.uuid4().hex[:8]}", "bench", max_connections=max(concurrency) + 2)
    try:
        sessions = await seed(memory, LOOKUP_SESSIONS, per_sandbox)
        await seed(redis_store, LOOKUP_SESSIONS, per_sandbox)
        rows = []
        for tasks in concurrency:
            base = await lookups_per_second(memory, sessions, tasks, seconds / 3)
            ceiling = await round_trips_per_second(url, tasks, seconds / 3) / 2
            value = await lookups_per_second(redis_store, sessions, tasks, seconds)
            rows.append(Row(f"route lookups/s, {tasks} task(s)", f"{value:,.0f}", f"{base:,.0f} (memory store)",
                            f"{value / base:.3f}"))
            rows.append(Row("", "", f"{ceiling:,.0f} (redis-py GET/s / 2)", f"{value / ceiling:.2f}"))
        return rows
    finally:
        await redis_store.close()
        await memory.close()


async def bench_memory(url: str, sessions: int, per_sandbox: int,
                       used_memory: Callable[[], Awaitable[int]]) -> list[Row]:
    keys = RedisKeys(f"mem-{uuid.uuid4().hex[:8]}")
    client = Redis.from_url(url, decode_responses=True)
    try:
        bulk = client.register_script(BULK_PUT_BINDINGS)
        before = await used_memory()
        now = time.time()
        created = repr(now)
        started = time.perf_counter()
        json_bytes = stored = 0
        pending: list[Awaitable[int]] = []
        for start in range(0, sessions, BATCH):
            rows = fast_bindings(start, min(sessions, start + BATCH), per_sandbox, now)
            batch_keys = [keys.session_seen, keys.count_sessions]
            args = []
            for session_id, sandbox_id, data in rows:
                json_bytes += len(data.encode())
                batch_keys += [keys.binding(session_id), keys.sandbox(sandbox_id)]
                args += [data, session_id, created, "shared"]
            pending.append(bulk(keys=batch_keys, args=args))
            if len(pending) >= 8:  # a few calls in flight: the client encodes while redis runs
                stored += sum(await asyncio.gather(*pending))
                pending = []
        stored += sum(await asyncio.gather(*pending))
        assert stored == sessions, f"stored {stored} of {sessions}"
        elapsed = time.perf_counter() - started
        after = await used_memory()
        per_session = (after - before) / sessions
        return [
            Row(f"redis memory per session ({sessions:,} bindings)", f"{per_session:,.0f} B",
                f"{json_bytes / sessions:,.0f} B (binding value)", f"{per_session / (json_bytes / sessions):.2f}"),
            Row("bulk load (Lua, PUT_BINDING's writes)", f"{sessions / elapsed:,.0f} bindings/s"),
            Row("redis used_memory after load", f"{after / 2**20:,.1f} MiB"),
        ]
    finally:
        await client.aclose()


async def gateway_benchmarks(url: str, args: argparse.Namespace) -> list[Row]:
    """Route resolution with the per-process cache (hit) vs through Redis (miss), then
    ``sandbox-gateway serve --workers N`` (N processes on one Redis, the replicas of one
    host) proxying to a fixed backend, for N = 1, 2, 3."""
    return [*await _cache_hit_vs_miss(url, args.seconds), *await asyncio.to_thread(_replica_throughput, url, args)]


async def _cache_hit_vs_miss(url: str, seconds: float) -> list[Row]:
    from gateway.providers.base import PoolProviders
    from gateway.providers.static import StaticProvider
    from gateway.sessions import RouterTuning, SessionRouter
    from routing import Identity, parse_policy

    policy = parse_policy("pools: {small: {provider: static, upstreams: ['http://127.0.0.1:9']}, "
                          "shared: {provider: static, upstreams: ['http://127.0.0.1:9']}}", "bench")
    static = StaticProvider({"small": ["http://127.0.0.1:9"], "shared": ["http://127.0.0.1:9"]})
    rates = {}
    for label, ttl in (("hit", 3600.0), ("miss", 1e-9)):
        store = RedisStore(url, f"bench-{uuid.uuid4().hex[:6]}", "bench")
        router = SessionRouter(store, PoolProviders({"small": static, "shared": static}), policy,
                               replica_id="bench", tuning=RouterTuning(route_ttl=ttl))
        identities = [Identity.parse(org_id="o", user_id="u", session_id=f"s{i}") for i in range(100)]
        for identity in identities:
            await router.resolve(identity)
        done, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for identity in identities:
                await router.resolve(identity)
            done += len(identities)
        rates[label] = done / seconds
        await store.close()
    return [Row("route resolution, cache hit (per process)", f"{rates['hit']:,.0f}/s", "", ""),
            Row("route resolution, cache miss (redis)", f"{rates['miss']:,.0f}/s", "", ""),
            Row("  hit / miss", "", "", f"{rates['hit'] / rates['miss']:.0f}x")]


def _replica_throughput(url: str, args: argparse.Namespace) -> list[Row]:
    import tempfile

    from benchmarks.proxy_bench import free_port, load, start_backend, stop_procs, wait_port

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        backend = start_backend(Path(tmp))
        policy = Path(tmp) / "policy.yaml"
        upstream = f"http://127.0.0.1:{backend.port}"
        policy.write_text(f"pools: {{small: {{provider: static, upstreams: ['{upstream}']}}, "
                          f"shared: {{provider: static, upstreams: ['{upstream}']}}}}\n")
        try:
            base = None
            for workers in (1, 2, 3):
                port = free_port()
                proc = subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli", "serve", "--workers", str(workers), "--redis-url", url,
                     "--policy", str(policy), "--data-port", str(port), "--control-port", "0", "--grpc-port", "0",
                     "--no-access-log",
                     "--log-level", "warning"], cwd=tmp)
                try:
                    wait_port(port)
                    headers = {"X-Org-Id": "bench", "X-User-Id": "u", "X-Session-Id": "replicas"}
                    load(port, 10, 1.0, headers)  # bind the session and warm every worker's cache
                    result = load(port, 50, args.seconds, headers)
                finally:
                    stop_procs([proc])
                base = base or result.rps
                rows.append(Row(f"serve --workers {workers} on one redis, c=50", f"{result.rps:,.0f} req/s",
                                f"p50 {result.p50_ms:.2f} ms", f"{result.rps / base:.2f}"))
        finally:
            stop_procs(backend.procs)
    return rows


MIX = "read=80,bind=8,reap=2,touch=10"


def _mix_worker(url: str, prefix: str, worker: int, seconds: float, tasks: int, out: object, mix: str) -> None:
    """One client process of the mix: ``tasks`` coroutines for ``seconds``; puts its count in ``out``."""
    import random

    kinds = [name for part in mix.split(",") for name, _, weight in [part.partition("=")] for _ in range(int(weight))]

    async def main() -> int:
        store = RedisStore(url, prefix, f"mix-{worker}", max_connections=tasks + 2)
        try:
            sessions = [make_binding(i, 10, time.time()).session_id for i in range(LOOKUP_SESSIONS)]
            done = 0
            deadline = time.perf_counter() + seconds

            async def task(n: int) -> None:
                nonlocal done
                rng = random.Random(worker * 1000 + n)
                made: list[str] = []
                serial = 0
                while time.perf_counter() < deadline:
                    kind = rng.choice(kinds)
                    now = time.time()
                    if kind == "read":
                        binding = await store.get_binding(rng.choice(sessions))
                        assert binding is not None
                        await store.get_sandbox(binding.sandbox_id)
                    elif kind == "bind":
                        serial += 1
                        session = f"mix-{worker}-{n}-{serial}"
                        sandbox = f"mixsb-{worker}-{n}-{serial}"
                        record = SandboxRecord(sandbox, "small", "org-mix", SandboxState.CREATING, created_at=now,
                                               owner=Owner("org-mix", "u", None))
                        await store.reserve_sandbox(record, Caps(), 60)
                        await store.mark_ready(sandbox, Endpoint("10.0.0.2", 8080))
                        await store.put_binding(Binding(session, sandbox, "small", Isolation.SHARED,
                                                        Owner("org-mix", "u", None), now))
                        made.append(sandbox)
                    elif kind == "reap":
                        await store.scan_sandboxes(None, limit=20, scan=50)
                        if made:
                            await store.release_sandbox(made.pop(0))
                    else:
                        await store.touch({s: now for s in made[-10:]},
                                          {rng.choice(sessions): now for _ in range(10)})
                    done += 1

            await asyncio.gather(*(task(n) for n in range(tasks)))
            return done
        finally:
            await store.close()

    out.put(asyncio.run(main()))  # type: ignore[attr-defined]


async def bench_mix(url: str, seconds: float, processes: int, tasks: int, mix: str = MIX) -> list[Row]:
    import multiprocessing

    prefix = f"mix-{uuid.uuid4().hex[:6]}"
    seeded = RedisStore(url, prefix, "seed")
    try:
        await seed(seeded, LOOKUP_SESSIONS, 10)
    finally:
        await seeded.close()

    async def redis_cpu() -> float:
        async with Redis.from_url(url) as client:
            info = await client.info("cpu")
        main = ("used_cpu_sys_main_thread", "used_cpu_user_main_thread")
        return sum(float(info[k]) for k in main) if all(k in info for k in main) else \
            float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    workers = [context.Process(target=_mix_worker, args=(url, prefix, w, seconds, tasks, out, mix)) for w in range(processes)]
    cpu_before, started = await redis_cpu(), time.perf_counter()
    for worker in workers:
        worker.start()
    done = sum([await asyncio.to_thread(out.get) for _ in workers])
    elapsed = time.perf_counter() - started
    for worker in workers:
        worker.join()
    cpu = await redis_cpu() - cpu_before
    rate = done / seconds
    per_op_us = cpu / done * 1e6
    return [Row(f"mix {mix}, {processes} processes x {tasks} tasks", f"{rate:,.0f} ops/s",
                f"redis main thread {cpu / elapsed:.0%} of a core", ""),
            Row("  redis CPU per mix operation", f"{per_op_us:,.1f} us", ""),
            Row("  ceiling at one redis core (100%)", f"{1e6 / per_op_us:,.0f} ops/s", "")]


def print_table(rows: list[Row]) -> None:
    header = Row("measure", "redis store", "baseline", "ratio")
    widths = [max(len(getattr(r, f)) for r in [header, *rows]) for f in ("name", "value", "baseline", "ratio")]
    for row in [header, *rows]:
        cells = (row.name, row.value, row.baseline, row.ratio)
        print("  ".join(c.ljust(w) if n == 0 else c.rjust(w) for n, (c, w) in enumerate(zip(cells, widths))))


async def run(args: argparse.Namespace, url: str, used_memory: Callable[[], Awaitable[int]]) -> None:
    if args.mix:
        print_table(await bench_mix(url, args.seconds, args.mix_processes, args.mix_tasks, args.mix_weights))
        return
    concurrency = [int(c) for c in args.concurrency.split(",")]
    rows = await bench_lookups(url, concurrency, args.seconds, args.sessions_per_sandbox)
    rows += await bench_memory(url, args.sessions, args.sessions_per_sandbox, used_memory)
    rows += await gateway_benchmarks(url, args)
    print_table(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1_000_000, help="bindings for the memory measurement")
    parser.add_argument("--sessions-per-sandbox", type=int, default=10)
    parser.add_argument("--concurrency", default="1,16,64", help="lookup tasks, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0, help="per redis lookup run")
    parser.add_argument("--url", help="an existing redis (default: a private redis-server)")
    parser.add_argument("--mix", action="store_true", help="only the gateway's mix of operations (section 4)")
    parser.add_argument("--mix-processes", type=int, default=2, help="client processes for --mix")
    parser.add_argument("--mix-tasks", type=int, default=16, help="tasks per client process for --mix")
    parser.add_argument("--mix-weights", default=MIX, help="operations per 100 (read, bind, reap, touch)")
    args = parser.parse_args()
    from benchmarks.harness import reported

    with reported("store_bench.py"):
        _main(args)


def _main(args: argparse.Namespace) -> None:
    if args.url:
        async def used_memory() -> int:
            async with Redis.from_url(args.url) as client:
                return int((await client.info("memory"))["used_memory"])

        asyncio.run(run(args, args.url, used_memory))
        return

    from tests.redis_server import RedisServer

    with RedisServer() as server:
        async def private_used_memory() -> int:
            return await asyncio.to_thread(server.info_memory)

        print(f"redis-server {server.url} (private, no persistence)", flush=True)
        asyncio.run(run(args, server.url, private_used_memory))


if __name__ == "__main__":
    main()
