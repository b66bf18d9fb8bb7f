"""A victim tenant beside an attacker on one real ``sandbox-gateway serve``: the victim's p50/p99 and errors
on the data plane, the gRPC front, the control API and its own local sandbox, under each attack, beside its
baseline (issue 28).

Attacks (all on loopback, bounded in count and time):

- ``grpc-idle``: ``--connections`` TCP connections to the gRPC port that never send a preface, from
  ``--sources`` addresses (127.0.0.2, .3, ...), held by attacker processes of ``--per-process`` sockets each
  (a process may hold 20,000 descriptors here; benchmarks/attackers.py). One the gateway closes (refused at a
  bound, shed, or at ``grpc_handshake_timeout``) is opened again: at once if the gateway had held it,
  ``--reopen`` seconds later (30, +-50%) if it was refused at once, so the port stays full for as long as the
  attack runs (``--reopen 5`` makes it a flood of reconnects as well: thousands a second);
- ``data-idle``: the same to the data plane (closed at ``header_read_timeout``);
- ``slowloris``: data-plane connections that send a request head a line every 3 s, never finishing it;
- ``undeclared-streams``: one org opens ``--streams`` SSE streams without ``Accept: text/event-stream``, from
  four addresses (they take its slots past ``max_streams_per_org``; its declared ones then get 429);
- ``files``: the attacker's local sandbox opens files in 100 processes until each is refused (EMFILE), and holds;
- ``disk``: the attacker's local sandbox writes until its disk quota says ENOSPC, and holds the file;
- ``fork-bomb``: the attacker's local sandbox forks until its process limit refuses, and holds.

The victim (its own source address, 127.0.0.200) opens a NEW connection for every call, so a full port would
show: the data plane (GET through a static pool to an aiohttp app in this process), gRPC (a unary call through
the same pool to the grpclib echo service; a new channel per call), the control API (/healthz) and, with
``--local``, ``/execute`` in its own local sandbox (bubblewrap; root only). It calls the ports in turn, one call to each per
turn (``/execute`` every fourth), so a periodic cost of the gateway lands on every port alike (figures before
session 18 measured each port in a block of its own: a wave every 10 s fell in one port's window). The victim's calls run after the
attack is in place (the gateway has answered the first wave) and while it goes on; the CPU the gateway and
the attackers took meanwhile is reported (they share the machine's cores). The gateway runs with its
defaults (descriptor limit raised to the hard one: bounds logged at start) except a smaller disk quota
(``--disk-quota``: the default 10 GiB would write 10 GiB to a shared disk).

On a machine of two or more cores the gateway (and every process it starts: its sandboxes) runs on one core
and this process (the victim's client, the static pool's sandbox) and the attacker processes on another
(``sched_setaffinity``; ``--no-pin`` to share them all). The attackers run capped together at ``--attacker-cpu``
of a core (a cgroup v1 cpu quota of ordinary weight, benchmarks/placement.py, on once their first wave is in), as
if they ran on a machine of their own with that much of it: what they take from the victim's core is the
attacker's cost, not the gateway's (session 17, run L: uncapped at nice 19 they took 27% of it, and the victim's
tail came from them). ``--attacker-cpu 0`` (or no writable cgroup) runs them uncapped at nice 19, as before
session 18. Each row gives the cap, the attackers' CPU and how often the cap held them back, and the attack's
strength at its end (connections held, reconnects), which the cap must not weaken: a row whose attackers held
fewer than an eighth of their first wave says THE ATTACK DID NOT HOLD. ``--idle-attackers`` (SCHED_IDLE instead of
nice 19) starved the attack on a quiet machine (slowloris kept 9 of its 4,000 connections).
Each attack's victim figures are compared with its baseline measured
just before and just after it (both pooled: the p99 of twice the calls), and each p99 is given with the
number of calls it is taken from (at 2,000 calls the p99 is the 20th slowest, not the 5th of 500).
With ``--rounds N`` each attack runs N times, each time between its own baselines: a row then gives the median
of the rounds' p50s and p99s, and its ratio is the median of the rounds' own ratios, each listed below the
table (on a shared VM one round's p99 ratio moves between 0.3x and 3x with nothing changed).

    .venv/bin/python benchmarks/neighbours.py [--connections 20000] [--sources 10] [--victim 2000]
    .venv/bin/python benchmarks/neighbours.py --only grpc-idle,slowloris --reopen 5   # a reconnect flood too
    .venv/bin/python benchmarks/neighbours.py --rounds 3   # each attack three times: medians
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from benchmarks.attackers import Attack  # noqa: E402
from benchmarks.harness import cpu_ns  # noqa: E402
from benchmarks.neighbours_table import Result, Row, pooled, rounds_of, summary, table  # noqa: E402
from benchmarks.placement import CpuCap, cores, pinned  # noqa: E402

SCENARIOS = ("baseline", "grpc-idle", "data-idle", "slowloris", "undeclared-streams", "files", "disk", "fork-bomb",
             "baseline-after")
LOCAL = ("files", "disk", "fork-bomb")
# The control, asked for by name only (--only no-attack): a round with no attack, measured between its
# baselines as an attacked round is, so its ratio is the measurement's own noise on this machine.
CONTROL = "no-attack"
# The attacker processes' CPU cap (a cgroup quota), of one core: half again what slowloris, the hungriest, took at
# full strength over a minute (44-50%, about 830 reconnects a second; benchmarks/README.md, session 18), so the
# attack is bounded without being weakened.
ATTACKER_CPU = 0.75
VICTIM_SOURCE = "127.0.0.200"
VICTIM = {"X-Org-Id": "victim", "X-User-Id": "v", "X-Session-Id": "victim-1"}
VICTIM_BOX = {"X-Org-Id": "victim-box", "X-User-Id": "v", "X-Session-Id": "victim-box-1"}


# -- the victim --------------------------------------------------------------------------------------------------

# Every victim call, (wall-clock start, seconds, which): written to --calls-log, to set the slowest calls against
# what the gateway's loop did then (benchmarks/loop_probe/).
CALLS_LOG: list[tuple[float, float, str]] | None = None


async def measure(calls: int, ports: dict[str, Callable[[], Awaitable[None]]], every: dict[str, int]) -> dict[str, Result]:
    """``calls`` turns; each turn one call to each port (``every``: to that port only every Nth turn), so that a
    periodic cost of the gateway lands on every port alike (before session 18 the ports were measured one after
    another: a wave every 10 s fell in one port's window)."""
    latencies: dict[str, list[float]] = {name: [] for name in ports}
    errors, first = dict.fromkeys(ports, 0), dict.fromkeys(ports, "")
    for turn in range(calls):
        for name, call in ports.items():
            if turn % every.get(name, 1):
                continue
            started = time.perf_counter()
            try:
                await asyncio.wait_for(call(), 10)
                latencies[name].append(time.perf_counter() - started)
                if CALLS_LOG is not None:
                    CALLS_LOG.append((time.time() - latencies[name][-1], latencies[name][-1], call.__name__))
            except Exception as exc:  # noqa: BLE001 (every failure is the victim's error, counted)
                errors[name] += 1
                first[name] = first[name] or f"{type(exc).__name__}: {exc}"[:200]
    return {name: summary(latencies[name], errors[name], len(range(0, calls, every.get(name, 1))), first[name])
            for name in ports}


async def victim(gateway: Any, calls: int, local: bool) -> dict[str, Result]:
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    from tests.grpc_helpers import RawCodec

    host, port = gateway.grpc_address.rsplit(":", 1)
    connector = aiohttp.TCPConnector(local_addr=(VICTIM_SOURCE, 0), force_close=True)  # a new connection per call
    async with aiohttp.ClientSession(connector=connector) as http:
        async def data() -> None:
            async with http.get(f"{gateway.data_url}/hello", headers=VICTIM) as response:
                assert response.status == 200, f"{response.status} {await response.text()}"
                await response.read()

        async def grpc() -> None:
            channel = Channel(host, int(port), codec=RawCodec())
            try:
                async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes,
                                           metadata={k.lower(): v for k, v in VICTIM.items()}) as stream:
                    await stream.send_message(b"ping", end=True)
                    assert await stream.recv_message() == b"ping"
            finally:
                channel.close()

        async def control() -> None:
            async with http.get(f"{gateway.control_url}/healthz") as response:
                assert response.status == 200, response.status
                await response.read()

        async def execute() -> None:
            async with http.post(f"{gateway.data_url}/execute", headers=VICTIM_BOX,
                                 json={"command": "echo ok", "timeout_seconds": 10}) as response:
                body = await response.text()
                assert response.status == 200 and json.loads(body)["stdout"] == "ok\n", body[:200]

        ports = {"data plane": data, "gRPC": grpc, "control /healthz": control}
        if local:
            ports["own sandbox /execute"] = execute
        return await measure(calls, ports, {"own sandbox /execute": max(1, calls // max(20, calls // 4))})


# -- the gateway and its sandbox ------------------------------------------------------------------------------

class Sandbox:
    """The static pool's sandbox: plain answers, and an event stream that stays open until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def hello(self, _: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: hi\n\n")
        await self.release.wait()
        return response


async def counters(gateway: Any) -> dict[str, float]:
    """The gateway's connection counters: refused (by listener and bound), shed, gRPC closes by reason."""
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.control_url}/metrics") as response:
        text = await response.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("sgw_connections_refused_total{", "sgw_connections_shed_total{",
                            "sgw_grpc_connections_closed_total{")):
            name, value = line.rsplit(" ", 1)
            found[name.replace("_total", "")] = float(value)
    return found


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What changed, keyed by family short name and label values: ``shed grpc``, ``refused max_connections/data``."""
    names = {"sgw_connections_refused": "refused", "sgw_connections_shed": "shed",
             "sgw_grpc_connections_closed": "gRPC closed"}
    found = {}
    for name, value in sorted(after.items()):
        if value - before.get(name, 0.0):
            family, labels = name.rstrip("}").split("{", 1)
            values = "/".join(re.findall(r'="([^"]*)"', labels))
            found[f"{names[family]} {values}"] = value - before.get(name, 0.0)
    return found


def changed(before: dict[str, float], after: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.0f}" for name, value in delta(before, after).items()) or "nothing refused or shed"


async def execute(http: aiohttp.ClientSession, gateway: Any, session: str, command: str,
                  timeout: float = 120) -> dict[str, Any]:
    headers = {"X-Org-Id": "attacker-box", "X-User-Id": session, "X-Session-Id": session}
    async with http.post(f"{gateway.data_url}/execute", headers=headers,
                         json={"command": command, "timeout_seconds": timeout}) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def forget(http: aiohttp.ClientSession, gateway: Any, session: str) -> None:
    async with http.delete(f"{gateway.control_url}/v1/sessions/{session}") as response:
        await response.read()


FILES = ("for i in $(seq 100); do bash -c 'n=0; while exec {fd}</dev/null; do n=$((n+1)); done 2>/dev/null; "
         "echo $n > held.$$; exec sleep 600' >/dev/null 2>&1 & done; "
         "while [ $(ls held.* 2>/dev/null | wc -l) -lt 100 ]; do sleep 0.1; done; "
         "cat held.* | awk '{s+=$1} END {print s}'")
FORK_BOMB = "(exec 2>/dev/null; while :; do sleep 600 >/dev/null & done); echo full"


@dataclasses.dataclass
class Options:
    connections: int = 20_000
    sources: int = 10
    per_process: int = 5_000
    reopen: float = 30.0
    streams: int = 1_000
    victim: int = 2_000
    local: bool = True
    disk_quota: int = 256 * 1024**2
    only: tuple[str, ...] = SCENARIOS
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # more gateway settings (the CI test's bounds)
    pin: bool = False  # the gateway on one core, this process and the attackers on another (see pinned)
    rounds: int = 1    # each attack this many times, each between its own baselines (see rounds_of)
    idle_attackers: bool = False  # pinned: the attackers under SCHED_IDLE, not nice 19 (see the module docstring)
    attacker_cpu: float = ATTACKER_CPU  # the attackers' CPU cap, of one core (0: none; see benchmarks/placement.py)


@contextlib.asynccontextmanager
async def gateway_beside_a_sandbox(opts: Options) -> AsyncIterator[tuple[Any, Sandbox]]:
    from tests.gateway_process import GatewayProcess
    from tests.grpc_helpers import echo_server

    sandbox = Sandbox()
    app = web.Application()
    app.router.add_get("/events", sandbox.events)
    app.router.add_get("/{tail:.*}", sandbox.hello)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with echo_server() as (_, grpc_port):
            with tempfile.TemporaryDirectory() as tmp:
                policy = Path(tmp) / "policy.yaml"
                upstream = f"['http://127.0.0.1:{http_port}'], grpc_port: {grpc_port}"
                policy.write_text(f"pools:\n  small: {{provider: static, upstreams: {upstream}}}\n"
                                  f"  shared: {{provider: static, upstreams: {upstream}}}\n"
                                  "  box: {provider: local}\n"
                                  "orgs:\n  victim-box: {pool: box}\n  attacker-box: {pool: box}\n", encoding="utf-8")
                split = cores() if opts.pin else None
                with pinned(split[0] if split else None):  # the gateway and its sandboxes inherit it
                    gateway = await GatewayProcess(Path(tmp) / "gw", "--policy", str(policy), env={
                        "SANDBOX_GATEWAY_MAX_STREAMS_PER_ORG": "50", "SANDBOX_GATEWAY_ACCESS_LOG": "false",
                        "SANDBOX_GATEWAY_LOCAL_DISK_QUOTA_BYTES": str(opts.disk_quota), **opts.env}).start()
                if split:
                    os.sched_setaffinity(0, split[1])  # the victim, the static sandbox and the attackers to come
                try:
                    yield gateway, sandbox
                finally:
                    await gateway.stop()
    finally:
        await runner.cleanup()


async def run(opts: Options) -> list[Row]:
    """Every scenario of ``opts.only``, in order, on one gateway; the victim's results per scenario."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sources = [f"127.0.0.{2 + i}" for i in range(opts.sources)]
    local = opts.local
    rows: list[Row] = []
    async with gateway_beside_a_sandbox(opts) as (gateway, sandbox), aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)) as http:
        await victim(gateway, 20, local)  # warm-up: routes cached, the victim's own sandbox started

        async def measured(scenario: str, attacker: str) -> None:
            rows.append(Row(scenario, attacker, await victim(gateway, opts.victim, local), os.getloadavg()))

        for scenario in opts.only:
            if scenario.startswith("baseline"):
                await measured(scenario, "-")
                continue
            rounds = [await attacked(scenario, gateway, sandbox, http, opts, sources, local, n)
                      for n in range(opts.rounds)]
            rows.append(rounds[0] if len(rounds) == 1 else rounds_of(rounds))
    return rows


async def attacked(scenario: str, gateway: Any, sandbox: Sandbox, http: aiohttp.ClientSession, opts: Options,
                   sources: list[str], local: bool, n: int = 0) -> Row:
    """Round ``n`` of one attack, between the victim's baselines just before and just after it (the machine is
    shared: its load moves within a minute)."""
    paired = await victim(gateway, opts.victim, local)
    before = await counters(gateway)
    if scenario in ("grpc-idle", "data-idle", "slowloris"):
        row = await connection_attack(scenario, gateway, opts, sources, before, local)
    elif scenario == "undeclared-streams":
        row = await streams(gateway, sandbox, opts, before, local)
    elif scenario == CONTROL:
        row = Row(scenario, "no attack (the control)", await victim(gateway, opts.victim, local), os.getloadavg())
    else:
        row = await local_attack(scenario, gateway, http, opts, local, n)
    after = await victim(gateway, opts.victim, local)
    row.before = {port: pooled(result, after[port]) for port, result in paired.items()}
    return row


async def connection_attack(scenario: str, gateway: Any, opts: Options, sources: list[str],
                            before: dict[str, float], local: bool) -> Row:
    """Idle or slowloris connections to a port, from attacker processes, held while the victim is measured."""
    target = gateway.grpc_address if scenario == "grpc-idle" else gateway.data_url.split("://", 1)[1]
    mode = "slowloris" if scenario == "slowloris" else "idle"
    # Pinned, the attackers share the victim's core: capped (a cgroup quota) and at nice 19 they take at most their
    # cap of it, yielding to the victim's client, so what the victim sees is the gateway's work for the attack, not
    # the attackers' own reconnect loops and line timers (see the module docstring).
    cap = CpuCap(opts.attacker_cpu, held=False)  # capped once the first wave is in (it took minutes capped)
    with cap:
        attack = Attack(target, mode, opts.connections, sources, opts.per_process, opts.reopen,
                        0 if opts.idle_attackers or not opts.pin or cap.group else 19,
                        idle=opts.pin and opts.idle_attackers, join=cap.join)
        async with attack:
            with cap.holding():  # capped while measured; their end (5,000 tasks cancelled each) uncapped
                settled = await settle(gateway)
                gateway_pid, attackers = [gateway.proc.pid], [p.pid for p in attack.procs]
                cpu, throttled = (cpu_ns(gateway_pid)[0], cpu_ns(attackers)[0]), cap.stat()
                started = time.perf_counter()
                results = await victim(gateway, opts.victim, local)
                seconds = time.perf_counter() - started
                cpu = (cpu_ns(gateway_pid)[0] - cpu[0]) / 1e9, (cpu_ns(attackers)[0] - cpu[1]) / 1e9
                throttled = {key: value - throttled[key] for key, value in cap.stat().items()}
                load = os.getloadavg()
    first, final = attack.total(attack.ready), attack.total(attack.final)
    after = await counters(gateway)
    detail = (f"{opts.connections} {mode} connections from {len(sources)} addresses in {len(attack.commands)} "
              f"processes (one the gateway held reopened at once, one refused after {opts.reopen:g} s +-50%), "
              f"{cap.describe()}: {first['held']} open after the first wave (some refused, not yet read), "
              f"{final['held']} at the end; the gateway settled in {settled:.1f} s; "
              f"{final['connects'] - first['connects']} reconnects in all; while the victim was measured "
              f"({seconds:.1f} s) the gateway took {cpu[0]:.1f} s of CPU, the attackers {cpu[1]:.1f} s "
              f"({cpu[1] / seconds:.0%} of a core{throttling(throttled)}); the gateway: {changed(before, after)}")
    if final["held"] < first["held"] / 8:  # the first wave counts connections not yet refused: 8,000 for 4,000 slots
        detail += (f"; THE ATTACK DID NOT HOLD: its processes kept {final['held']} of {first['held']} connections "
                   "(starved of CPU?): this row does not measure the attack")
    facts = {"first": first, "final": final, "gateway": delta(before, after), "attackers_cpu": cpu[1] / seconds,
             "capped": bool(throttled), "throttled": throttled}
    return Row(scenario, detail, results, load, facts)


def throttling(stat: dict[str, int]) -> str:
    """How often the cap held the attackers back, from the group's cpu.stat differences ('' uncapped)."""
    if not stat:
        return ""
    return (f", throttled in {stat['nr_throttled']} of {stat['nr_periods']} periods, "
            f"{stat['throttled_time'] / 1e9:.1f} s in all")


async def settle(gateway: Any, quiet: float = 100, longest: float = 30) -> float:
    """Seconds until the gateway refuses, sheds and closes fewer than ``quiet`` connections per 0.5 s (the first
    wave has been answered), at most ``longest``."""
    started = time.perf_counter()
    last = sum((await counters(gateway)).values())
    while time.perf_counter() - started < longest:
        await asyncio.sleep(0.5)
        now = sum((await counters(gateway)).values())
        if now - last < quiet:
            break
        last = now
    return time.perf_counter() - started


async def streams(gateway: Any, sandbox: Sandbox, opts: Options, before: dict[str, float], local: bool) -> Row:
    """One org opens ``opts.streams`` undeclared SSE streams from four addresses and keeps them open."""
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, local_addr=(f"127.0.0.{2 + i}", 0)))
                for i in range(5)]  # four for the undeclared streams, one for the declared one
    opened: list[aiohttp.ClientResponse] = []
    refused = 0

    async def one(i: int) -> None:
        nonlocal refused
        response = await sessions[i % 4].get(f"{gateway.data_url}/events", headers={
            "X-Org-Id": "attacker", "X-User-Id": f"a{i}", "X-Session-Id": f"a{i}"})
        if response.status == 200:
            opened.append(response)
        else:
            refused += 1
            response.release()

    try:
        for start in range(0, opts.streams, 100):
            await asyncio.gather(*(one(i) for i in range(start, min(opts.streams, start + 100))))
        declared = await sessions[4].get(f"{gateway.data_url}/events", headers={
            "X-Org-Id": "attacker", "X-User-Id": "a-declared", "X-Session-Id": "a-declared",
            "Accept": "text/event-stream"})
        declared_status = declared.status
        declared.release()
        results = await victim(gateway, opts.victim, local)
        return Row("undeclared-streams", f"{len(opened)} undeclared SSE streams of one org open ({refused} refused); "
                   f"its declared stream then: {declared_status}; "
                   f"the gateway: {changed(before, await counters(gateway))}",
                   results, os.getloadavg(), {"opened": len(opened), "declared": declared_status})
    finally:
        sandbox.release.set()
        for response in opened:
            response.release()
        for session in sessions:
            await session.close()
        sandbox.release.clear()


async def local_attack(scenario: str, gateway: Any, http: aiohttp.ClientSession, opts: Options, local: bool,
                       n: int = 0) -> Row:
    """The attacker's own local sandbox exhausts one of its bounds and holds on; then the victim is measured,
    and another tenant's NEW sandbox is started (the issue: a full disk failed the next tenant's with 503).
    Each round ``n`` is a new attacker sandbox and a new newcomer."""
    session = f"a-{scenario}" + (f"-{n}" if n else "")
    facts: dict[str, Any] = {}
    started = time.perf_counter()
    if scenario == "files":
        answer = await execute(http, gateway, session, FILES)
        facts["held"] = int(answer["stdout"].strip() or 0)
        detail = f"100 processes hold {facts['held']} open files (each refused at its limit)"
    elif scenario == "disk":
        size = opts.disk_quota + 64 * 1024**2
        answer = await execute(http, gateway, session, f"head -c {size} /dev/zero > big; echo exit=$?; du -sm big")
        tail = answer["stderr"].strip().splitlines()[-1:] or ["(no error)"]
        facts["enospc"] = "No space left on device" in answer["stderr"]
        detail = (f"wrote {answer['stdout'].split()[-2] if answer['stdout'].split() else '?'} MiB of {size >> 20}: "
                  f"{tail[0][:80]}")
    else:
        answer = await execute(http, gateway, session, FORK_BOMB, timeout=60)
        facts["full"] = answer["stdout"].strip() == "full"
        detail = f"forked until refused ({answer['stdout'].strip()})"
    detail += f", in {time.perf_counter() - started:.1f} s"
    try:
        results = await victim(gateway, opts.victim, local)
        created = time.perf_counter()
        fresh = f"new-{scenario}" + (f"-{n}" if n else "")
        newcomer = {"X-Org-Id": "victim-box", "X-User-Id": fresh, "X-Session-Id": fresh}
        async with http.post(f"{gateway.data_url}/execute", headers=newcomer,
                             json={"command": "echo ok > f && cat f", "timeout_seconds": 30}) as response:
            status = response.status
            await response.read()
        detail += f"; another tenant's new sandbox: {status} in {time.perf_counter() - created:.1f} s"
        facts["newcomer"] = status
        await forget(http, gateway, fresh)
        return Row(scenario, detail, results, os.getloadavg(), facts)
    finally:
        await forget(http, gateway, session)


def placement(opts: Options) -> str:
    split, cap = cores() if opts.pin else None, CpuCap(opts.attacker_cpu)
    attackers = ("SCHED_IDLE" if opts.idle_attackers else "nice 0" if cap.parent else "nice 19" if split else "nice 0")
    if split is None:
        return f"not pinned: the gateway, the victim's client and the attackers share every core; {cap.describe()}"
    return (f"the gateway and its sandboxes on {sorted(split[0])}, the victim's client, the static sandbox and "
            f"the attackers ({attackers}) on {sorted(split[1])}; {cap.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=20_000, help="attacking connections per connection attack")
    parser.add_argument("--sources", type=int, default=10, help="attacking source addresses (127.0.0.2 on)")
    parser.add_argument("--per-process", type=int, default=5_000, help="attacking sockets per attacker process")
    parser.add_argument("--reopen", type=float, default=30.0, help="seconds before a closed attacker slot reconnects")
    parser.add_argument("--streams", type=int, default=1_000, help="undeclared SSE streams the attacker opens")
    parser.add_argument("--victim", type=int, default=2_000, help="victim calls per port and measurement")
    parser.add_argument("--disk-quota", type=int, default=256 * 1024**2, help="local_disk_quota_bytes for the run")
    parser.add_argument("--max-connections", type=int, help="the gateway's max_connections (default: derived)")
    parser.add_argument("--per-client", type=int, help="the gateway's max_connections_per_client (default: derived)")
    parser.add_argument("--no-local", action="store_true", help="no local sandboxes (they need root and bubblewrap)")
    parser.add_argument("--no-pin", action="store_true", help="the gateway, the victim and the attackers share cores")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, in order: " + ",".join(SCENARIOS) + f" (and {CONTROL}, a round without an attack)")
    parser.add_argument("--calls-log", help="write every victim call here: wall-clock start, ms, port (in order)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each attack, each between its own baselines")
    parser.add_argument("--attacker-cpu", type=float, default=ATTACKER_CPU, help="the attacker processes' CPU cap, "
                        f"of one core (a cgroup v1 cpu quota; 0: none; default {ATTACKER_CPU:g})")
    parser.add_argument("--idle-attackers", action="store_true", help="pinned, the attackers under SCHED_IDLE, not "
                        "nice 19 (it can starve the attack: see the module docstring)")
    args = parser.parse_args()
    local = not args.no_local and os.geteuid() == 0 and shutil.which("bwrap") is not None
    only = tuple(s for s in args.only.split(",") if s and (local or s not in LOCAL))
    env = {f"SANDBOX_GATEWAY_{name.upper()}": str(value) for name, value in (
        ("max_connections", args.max_connections), ("max_connections_per_client", args.per_client)) if value}
    opts = Options(args.connections, args.sources, args.per_process, args.reopen, args.streams, args.victim, local,
                   args.disk_quota, only, env, not args.no_pin, max(1, args.rounds), args.idle_attackers,
                   args.attacker_cpu)
    from benchmarks.harness import footer, header

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    print(header("neighbours", f"descriptors:  {hard} per process (the gateway's raised to it: bounds "
                 f"{hard // 5} per port, {hard // 40} per address)",
                 f"victim:       {args.victim} calls per port and measurement, each on a new connection; "
                 f"{max(1, args.rounds)} round(s) of each attack",
                 f"cores:        {placement(opts)}",
                 installed=True), flush=True)
    global CALLS_LOG
    if args.calls_log:
        CALLS_LOG = []
    rows = asyncio.run(run(opts))
    if CALLS_LOG is not None:
        with open(args.calls_log, "w", encoding="utf-8") as out:
            out.writelines(f"{t:.4f} {d * 1000:.3f} {name}\n" for t, d, name in CALLS_LOG)
    print()
    print(table(rows))
    print(footer())


if __name__ == "__main__":
    main()
