"""gRPC front throughput: unary calls/s and streamed messages/s, direct vs nginx vs the gateway, same cores.

    .venv/bin/python benchmarks/grpc_bench.py [--quick] [--concurrency 1,10,50] [--duration 5] [--repeat 3]
        [--streams 4] [--stream-messages 50000] [--no-nginx]

The sandbox is the tests' raw-bytes echo server (tests/grpc_helpers.py) in its
own process; the gateway is a real ``sandbox-gateway serve`` (static pool, its
``grpc_port`` the sandbox's) in another; nginx (Debian's, as proxy_bench.py
finds it) relays with ``grpc_pass`` over an upstream pool with ``keepalive 32``
in a third: the strongest common peer. The load generator is grpclib's client
in this process, on uvloop; every port is a loopback port the kernel chose.
Each round loads direct, then nginx, then the gateway; each figure is the
median over ``--repeat`` rounds, so drift hits all three alike.

Unary: ``--concurrency`` callers (a list runs each), each calling
``/test.Echo/Unary`` (64 bytes) in a loop on one shared HTTP/2 connection.
Streaming: server streams of ``--stream-messages`` messages of 64 bytes,
``--streams`` at a time.

Everything shares the machine's cores: read the ratios, not the absolute
numbers. Goals: unary >= 0.5 of direct, streaming >= 0.8 (issue 18); unary at
least nginx's at 1, 10 and 50 callers (issue 33).

Before the run it prints the machine, build and load average (``harness.header``);
with every figure the CPU time each process (client, sandbox, nginx or gateway)
spent per call and per streamed message (from /proc, Linux only; medians over the
rounds): on a machine shared with other work the rates swing with the neighbours'
load, while CPU per operation stays within a few percent, so compare changes by it.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpclib.client import Channel  # noqa: E402
from grpclib.const import Cardinality  # noqa: E402

from benchmarks.harness import (  # noqa: E402
    LOAD_SELF,
    NGINX,
    NGINX_INSTALL,
    Cpu,
    CpuMeter,
    cpu_line,
    footer,
    free_port,
    header,
    loadavg,
    median_cpu,
    start_nginx,
    stop_procs,
    wait_port,
)
from tests.grpc_helpers import RawCodec  # noqa: E402

IDENT = {"x-user-id": "bench", "x-session-id": "bench-1"}

SANDBOX = """
import asyncio, sys
sys.path.insert(0, {root!r})
import uvloop
from tests.grpc_helpers import echo_server
async def main():
    async with echo_server() as (_, port):
        print(port, flush=True)
        await asyncio.Event().wait()
uvloop.run(main())
"""


def start_sandbox() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", SANDBOX.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def start_gateway(workdir: Path, sandbox_port: int) -> tuple[subprocess.Popen[bytes], str, int]:
    """A whole ``serve`` with its access log on (as served by default), its stderr to a file in ``workdir``.

    To a file, not a pipe this process drains: the drain would run in the client's process and count
    as the client's CPU in the gateway's runs.
    """
    policy = workdir / "policy.yaml"
    policy.write_text("pools:\n"
                      f"  small: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n"
                      f"  shared: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n")
    log = workdir / "serve.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--data-port", "0", "--control-port",
                                 "0", "--grpc-port", "0", "--policy", str(policy), "--log-format", "text"],
                                cwd=workdir, stderr=stderr)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        match = re.search(r"gRPC front \(worker \d+\): h2c://(\S+):(\d+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1), int(match.group(2))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the gateway did not serve gRPC within 60 s:\n{log.read_text(errors='replace')[-2000:]}")


async def unary_calls(host: str, port: int, concurrency: int, duration: float) -> tuple[int, float]:
    """Calls completed by ``concurrency`` callers on one connection within ``duration`` seconds, and the
    seconds they took (from after the connection's first call)."""
    channel = Channel(host, port, codec=RawCodec())
    payload = b"x" * 64
    done = 0
    stop_at = time.perf_counter() + duration

    async def caller() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes,
                                       metadata=IDENT) as stream:
                await stream.send_message(payload, end=True)
                await stream.recv_message()
                await stream.recv_trailing_metadata()
            done += 1

    await caller_warmup(channel)
    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    channel.close()
    return done, elapsed


async def caller_warmup(channel: Channel) -> None:
    async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes, metadata=IDENT) as stream:
        await stream.send_message(b"warm", end=True)
        await stream.recv_message()


async def streamed_messages(host: str, port: int, streams: int, messages: int) -> tuple[int, float]:
    """Messages received over ``streams`` concurrent server streams of ``messages`` each, and the seconds
    that took (from after the connection's first call)."""
    channel = Channel(host, port, codec=RawCodec())
    await caller_warmup(channel)
    request = f"{messages}:64".encode()
    received = 0

    async def one() -> None:
        nonlocal received
        async with channel.request("/test.Echo/ServerStream", Cardinality.UNARY_STREAM, bytes, bytes,
                                   metadata=IDENT) as stream:
            await stream.send_message(request, end=True)
            async for _ in stream:
                received += 1

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(streams)))
    elapsed = time.perf_counter() - started
    channel.close()
    return received, elapsed


@dataclass
class Peer:
    """One target of the load: direct to the sandbox, nginx's grpc_pass, or the gateway."""

    name: str
    host: str
    port: int
    processes: dict[str, list[int]]  # role -> root PIDs measured while it is loaded (the sandbox's too)


@dataclass
class Figures:
    """Per peer, the rates (ops/s) and every process's CPU per op, over the rounds."""

    rates: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[dict[str, Cpu]]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)  # the load average after each run

    def measure(self, peer: Peer, run: Callable[[], tuple[int, float]]) -> None:
        """Run one load against ``peer`` (``run()`` returns the ops done and the seconds they took) with every
        process metered (over the whole run: its connection and first call too, a few ms in seconds)."""
        meter = CpuMeter(peer.processes, LOAD_SELF, "client")
        with meter:
            ops, elapsed = run()
        self.rates.setdefault(peer.name, []).append(ops / elapsed)
        self.cpu.setdefault(peer.name, []).append(meter.per_op(ops))
        self.loads.append(loadavg().split()[0])

    def report(self, label: str, per: str) -> None:
        rate = {name: statistics.median(values) for name, values in self.rates.items()}
        cells = [f"{name} {value:9.0f}" for name, value in rate.items()]
        ratios = [f"{a}/{b} {rate[a] / rate[b]:.2f}" for a, b in
                  (("gateway", "direct"), ("gateway", "nginx"), ("nginx", "direct")) if a in rate and b in rate]
        print(f"{label:<24} " + "   ".join(cells) + "   " + "  ".join(ratios), flush=True)
        cpus = {name: median_cpu(runs) for name, runs in self.cpu.items()}
        loads = sorted(self.loads, key=float)
        print(f"    CPU us/{per} (kernel): {cpu_line(cpus)}; 1-min load average after its runs "
              f"{loads[0]}-{loads[-1]}", flush=True)


NGINX_GRPC = """
    upstream sandbox {{ server 127.0.0.1:{sandbox}; keepalive 32; keepalive_requests 1000000; }}
    server {{
        listen 127.0.0.1:{port} http2 backlog=4096;
        location / {{ grpc_pass grpc://sandbox; }}
    }}
"""


def start_nginx_grpc(workdir: Path, sandbox_port: int) -> tuple[subprocess.Popen[bytes], int]:
    """nginx (1 worker, as the gateway) relaying gRPC to the sandbox over a keep-alive upstream pool.

    ``keepalive 32`` reuses upstream connections (without it nginx opens one per call: half the
    rate at one caller); ``keepalive_requests`` (here and for clients, in ``harness.NGINX_COMMON``)
    is raised from nginx 1.22's 1000, after which it ends a connection with GOAWAY mid-run.
    """
    port = free_port()
    proc = start_nginx(workdir, "grpc", 1, NGINX_GRPC.format(sandbox=sandbox_port, port=port))
    wait_port(port)
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (about 30 seconds in all)")
    parser.add_argument("--concurrency", default="32",
                        help="unary callers on the one connection, or a list of them: 1,10,50 (default 32)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per unary run (default 5)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent server streams (default 4)")
    parser.add_argument("--stream-messages", type=int, default=50_000, help="messages per stream (default 50000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are printed (default 3)")
    parser.add_argument("--no-nginx", action="store_true", help="leave nginx's grpc_pass out")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.stream_messages, args.repeat = 2.0, 10_000, 1
    levels = [int(c) for c in str(args.concurrency).split(",")]
    import uvloop

    print(header("grpc_bench.py",
                 f"client:       grpclib in this process (uvloop), one HTTP/2 connection; unary callers {levels}; "
                 f"streams {args.streams} x {args.stream_messages} messages of 64 bytes; "
                 f"{args.duration:g}s per unary run; medians of {args.repeat} interleaved rounds",
                 "peers:        direct (the sandbox), "
                 + ("" if args.no_nginx else "nginx grpc_pass with upstream keepalive 32 (1 worker), ")
                 + "the gateway (`sandbox-gateway serve`, access log on)", installed=True), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    try:
        sandbox, sandbox_port = start_sandbox()
        procs.append(sandbox)
        gateway, ghost, gport = start_gateway(workdir, sandbox_port)
        procs.append(gateway)
        sandbox_pids = {"sandbox": [sandbox.pid]}
        peers = [Peer("direct", "127.0.0.1", sandbox_port, sandbox_pids)]
        if NGINX and not args.no_nginx:
            nginx, nport = start_nginx_grpc(workdir, sandbox_port)
            procs.append(nginx)
            peers.append(Peer("nginx", "127.0.0.1", nport, {"nginx": [nginx.pid], **sandbox_pids}))
        elif not args.no_nginx:
            print(f"nginx is not installed ({NGINX_INSTALL}): no nginx figures", file=sys.stderr)
        peers.append(Peer("gateway", ghost, gport, {"gateway": [gateway.pid], **sandbox_pids}))

        unary = {c: Figures() for c in levels}
        stream = Figures()
        for _ in range(args.repeat):
            for c in levels:  # interleaved: each round loads every peer in turn
                for peer in peers:
                    unary[c].measure(peer, lambda p=peer, c=c: uvloop.run(  # type: ignore[misc]
                        unary_calls(p.host, p.port, c, args.duration)))
            for peer in peers:
                stream.measure(peer, lambda p=peer: uvloop.run(  # type: ignore[misc]
                    streamed_messages(p.host, p.port, args.streams, args.stream_messages)))
    finally:
        stop_procs(list(reversed(procs)))
        shutil.rmtree(workdir, ignore_errors=True)  # nginx's config and temp dirs, serve's log
    print("goals: unary >= 0.5 of direct, streaming >= 0.8 of direct (issue 18); >= nginx at c=1,10,50 (issue 33)")
    for c in levels:
        unary[c].report(f"unary calls/s c={c}", "call")
    stream.report("streamed messages/s", "message")
    print(footer())


if __name__ == "__main__":
    main()
