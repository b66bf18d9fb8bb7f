"""gRPC front throughput: unary calls/s and streamed messages/s, direct vs through the gateway, same cores.

    .venv/bin/python benchmarks/grpc_bench.py [--quick] [--concurrency 32] [--duration 5] [--repeat 3]

The sandbox is the tests' raw-bytes echo server (tests/grpc_helpers.py) in its
own process; the gateway is a real ``sandbox-gateway serve`` (static pool, its
``grpc_port`` the sandbox's) in another; the load generator is grpclib's client
in this process, on uvloop. Each round loads direct, then through the gateway;
each figure is the median over ``--repeat`` rounds, so drift hits both alike.

Unary: ``--concurrency`` callers, each calling ``/test.Echo/Unary`` (64 bytes)
in a loop on one shared HTTP/2 connection. Streaming: server streams of
``--stream-messages`` messages of 64 bytes, ``--streams`` at a time.

Everything shares the machine's cores: read the ratios, not the absolute
numbers. Goals (issue 18): unary >= 0.5 of direct, streaming >= 0.8.

It also prints the CPU time each process spent per call and per streamed
message through the gateway (from /proc, Linux only; medians over the rounds):
on a machine shared with other work the rates swing with the neighbours' load,
while CPU per operation stays within a few percent, so compare changes by it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from grpclib.client import Channel  # noqa: E402
from grpclib.const import Cardinality  # noqa: E402

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


def start_gateway(workdir: Path, sandbox_port: int) -> tuple[subprocess.Popen[str], str, int]:
    policy = workdir / "policy.yaml"
    policy.write_text("pools:\n"
                      f"  small: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n"
                      f"  shared: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--data-port", "0", "--control-port", "0",
                             "--grpc-port", "0", "--policy", str(policy), "--log-format", "text"], cwd=workdir,
                            stderr=subprocess.PIPE, text=True)  # access log on, as served by default
    assert proc.stderr is not None
    for line in proc.stderr:
        match = re.search(r"gRPC front \(worker \d+\): h2c://(\S+):(\d+)", line)
        if match:
            # Keep draining stderr (access log lines) so the gateway never blocks on a full pipe.
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, match.group(1), int(match.group(2))
    raise RuntimeError("the gateway exited before serving")


async def unary_rate(host: str, port: int, concurrency: int, duration: float) -> float:
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
    return done / elapsed


async def caller_warmup(channel: Channel) -> None:
    async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes, metadata=IDENT) as stream:
        await stream.send_message(b"warm", end=True)
        await stream.recv_message()


async def stream_rate(host: str, port: int, streams: int, messages: int) -> float:
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
    return received / elapsed


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (0.0 where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measured(run: object, ops: object, procs: list[subprocess.Popen[str]], cpu: list[list[float]]) -> float:
    """Run one load (``run()`` returns its rate); append the client's, then each process's CPU us per op."""
    before = [time.process_time(), *(cpu_seconds(p.pid) for p in procs)]
    started = time.perf_counter()
    rate = run()  # type: ignore[operator]
    count = ops(rate, time.perf_counter() - started)  # type: ignore[operator]
    after = [time.process_time(), *(cpu_seconds(p.pid) for p in procs)]
    cpu.append([1e6 * (b - a) / max(count, 1) for a, b in zip(before, after)])
    return rate  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (about 20 seconds in all)")
    parser.add_argument("--concurrency", type=int, default=32, help="unary callers (default 32)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per unary run (default 5)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent server streams (default 4)")
    parser.add_argument("--stream-messages", type=int, default=50_000, help="messages per stream (default 50000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are printed (default 3)")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.stream_messages, args.repeat = 2.0, 10_000, 1
    import uvloop

    sandbox, sandbox_port = start_sandbox()
    workdir = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    gateway, ghost, gport = start_gateway(workdir, sandbox_port)
    results: dict[str, list[float]] = {"unary direct": [], "unary gateway": [], "stream direct": [],
                                       "stream gateway": []}
    cpu: dict[str, list[list[float]]] = {"unary": [], "stream": []}  # client, sandbox, gateway us per op
    try:
        for _ in range(args.repeat):
            for name, (host, port) in (("direct", ("127.0.0.1", sandbox_port)), ("gateway", (ghost, gport))):
                def unary(host: str = host, port: int = port) -> float:
                    return uvloop.run(unary_rate(host, port, args.concurrency, args.duration))

                def stream(host: str = host, port: int = port) -> float:
                    return uvloop.run(stream_rate(host, port, args.streams, args.stream_messages))
                if name == "direct":
                    results["unary direct"].append(unary())
                    results["stream direct"].append(stream())
                    continue
                # calls made: the rate times the load's duration (its callers stop then; to within one call each)
                results["unary gateway"].append(measured(unary, lambda rate, took: rate * args.duration,
                                                         [sandbox, gateway], cpu["unary"]))
                messages = args.streams * args.stream_messages
                results["stream gateway"].append(measured(stream, lambda rate, took: messages, [sandbox, gateway],
                                                          cpu["stream"]))
    finally:
        for proc in (gateway, sandbox):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    medians = {key: statistics.median(values) for key, values in results.items()}
    print(f"cores: {os.cpu_count()}  unary callers: {args.concurrency}  streams: {args.streams} x "
          f"{args.stream_messages} messages of 64 bytes  rounds: {args.repeat}")
    print(f"unary calls/s        direct {medians['unary direct']:9.0f}   gateway {medians['unary gateway']:9.0f}   "
          f"ratio {medians['unary gateway'] / medians['unary direct']:.2f}  (goal >= 0.5)")
    print(f"streamed messages/s  direct {medians['stream direct']:9.0f}   gateway {medians['stream gateway']:9.0f}   "
          f"ratio {medians['stream gateway'] / medians['stream direct']:.2f}  (goal >= 0.8)")
    for kind, what in (("unary", "call"), ("stream", "streamed message")):
        client, sandbox_us, gateway_us = (statistics.median(row[i] for row in cpu[kind]) for i in range(3))
        print(f"CPU per {what} through the gateway: gateway {gateway_us:.1f} us, sandbox {sandbox_us:.1f} us, "
              f"client {client:.1f} us")
    load = Path("/proc/loadavg")
    print(f"load average: {' '.join(load.read_text().split()[:3]) if load.exists() else '?'}")


if __name__ == "__main__":
    main()
