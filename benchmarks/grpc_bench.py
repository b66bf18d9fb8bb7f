"""gRPC front throughput: unary calls/s and streamed messages/s, direct vs nginx vs the gateway, same cores.

    .venv/bin/python benchmarks/grpc_bench.py [--quick] [--concurrency 1,10,50] [--duration 5] [--repeat 3]
        [--streams 4] [--stream-messages 50000] [--no-nginx] [--client h2load|grpclib]
        [--sandbox grpcio|grpclib] [--baseline /path/to/other/checkout]

The sandbox is an echo server in its own process: grpcio's (``grpc.aio``, a
generic handler that echoes any unary call's bytes and serves ``ServerStream``;
the default, as gRPC servers in sandboxes usually are) or the tests' grpclib one
(tests/grpc_helpers.py). The gateway is a real ``sandbox-gateway serve`` (static
pool, its ``grpc_port`` the sandbox's) in another; nginx (Debian's, as
proxy_bench.py finds it) relays with ``grpc_pass`` over an upstream pool with
``keepalive 32`` in a third: the strongest common peer. ``--baseline DIR`` adds a
second gateway, ``serve`` from the checkout in DIR (say, main's, with the same
compiled modules), loaded in the same rounds: a change's before and after in one
time window. Every port is a loopback port the kernel chose. Each round loads
direct, nginx, the baseline, then the gateway; each figure is the median over
``--repeat`` rounds, so drift hits them all alike.

Unary: ``--concurrency`` calls in flight (a list runs each) of ``/test.Echo/Unary``
(64 bytes) on one HTTP/2 connection. The client is h2load (``apt-get install
nghttp2-client``; the default when it is installed), a child process: one
connection, ``-m`` streams, for ``--duration`` seconds after 200 unmetered calls; its
per-request log gives the p50 latency. Or grpclib's client in this process (uvloop),
that many callers in a loop. Streaming (grpclib's client, either way): server
streams of ``--stream-messages`` messages of 64 bytes, ``--streams`` at a time.

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
import os
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
    LOAD_CHILD,
    LOAD_SELF,
    NGINX,
    NGINX_INSTALL,
    Cpu,
    CpuMeter,
    cpu_line,
    footer,
    free_port,
    gateway_build,
    header,
    loadavg,
    median_cpu,
    start_nginx,
    stop_procs,
    wait_port,
)
from tests.grpc_helpers import RawCodec  # noqa: E402

IDENT = {"x-user-id": "bench", "x-session-id": "bench-1"}
H2LOAD = shutil.which("h2load")
PAYLOAD = b"x" * 64

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


GRPCIO_SANDBOX = """
import asyncio, grpc
class Echo(grpc.GenericRpcHandler):
    def service(self, details):
        if details.method.endswith("/ServerStream"):
            async def stream(request, context):
                count, size = (int(x) for x in request.decode().split(":"))
                message = b"x" * size
                for _ in range(count):
                    yield message
            return grpc.unary_stream_rpc_method_handler(stream)
        async def unary(request, context):
            return request
        return grpc.unary_unary_rpc_method_handler(unary)
async def main():
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((Echo(),))
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    await server.wait_for_termination()
asyncio.run(main())
"""


def start_sandbox(kind: str) -> tuple[subprocess.Popen[str], int]:
    script = GRPCIO_SANDBOX if kind == "grpcio" else SANDBOX.format(root=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def start_gateway(workdir: Path, sandbox_port: int, checkout: Path | None = None, prefix: tuple[str, ...] = (),
                  wait: float = 60) -> tuple[subprocess.Popen[bytes], str, int]:
    """A whole ``serve`` with its access log on (as served by default), its stderr to a file in ``workdir``.

    To a file, not a pipe this process drains: the drain would run in the client's process and count
    as the client's CPU in the gateway's runs. ``checkout``: the gateway package is that directory's
    (first on the path), else the interpreter's installed one. ``prefix``: a command it runs under
    (valgrind, grpc_instructions.py), ``wait`` seconds at most for it to serve.
    """
    workdir.mkdir(exist_ok=True)
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
    policy = workdir / "policy.yaml"
    policy.write_text("pools:\n"
                      f"  small: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n"
                      f"  shared: {{provider: static, upstreams: ['http://127.0.0.1:9'], grpc_port: {sandbox_port}}}\n")
    log = workdir / "serve.log"
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "gateway.cli", "serve", "--data-port", "0",
                                 "--control-port", "0", "--grpc-port", "0", "--policy", str(policy), "--log-format",
                                 "text"],
                                cwd=workdir, stderr=stderr, env=env)
    deadline = time.monotonic() + wait
    while proc.poll() is None and time.monotonic() < deadline:
        match = re.search(r"gRPC front \(worker \d+\): h2c://(\S+):(\d+)", log.read_text(errors="replace"))
        if match:
            return proc, match.group(1), int(match.group(2))
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the gateway did not serve gRPC within {wait:g} s:\n"
                       f"{log.read_text(errors='replace')[-2000:]}")


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


def h2load_command(workdir: Path, host: str, port: int, concurrency: int) -> list[str]:
    """h2load on one connection, ``concurrency`` unary calls in flight; its options for how many go after the
    first two words."""
    request = workdir / "unary.bin"
    request.write_bytes(b"\0" + len(PAYLOAD).to_bytes(4, "big") + PAYLOAD)
    return [H2LOAD or "h2load", "-c1", f"-m{concurrency}", "-d", str(request), "-H", "content-type: application/grpc",
            "-H", "te: trailers", *(arg for name, value in IDENT.items() for arg in ("-H", f"{name}: {value}")),
            f"http://{host}:{port}/test.Echo/Unary"]


def h2load_calls(workdir: Path, host: str, port: int, concurrency: int, duration: float) -> tuple[int, float, float]:
    """h2load, one connection with ``concurrency`` streams, for ``duration`` seconds: calls done, the seconds
    they took and their median latency (ms, from h2load's per-request log). 200 calls before, unmetered
    by h2load's own clock (the meter around this sees them: a few ms of CPU in seconds)."""
    log = workdir / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends to its --log-file: else the p50 would be of every run so far
    command = h2load_command(workdir, host, port, concurrency)
    subprocess.run([*command[:2], "-n200", *command[2:]], check=True, capture_output=True)
    done = subprocess.run([*command[:2], "-D", f"{duration:g}", "--log-file", str(log), *command[2:]],
                          check=True, capture_output=True, text=True)
    seconds = float(re.search(r"finished in ([\d.]+)s", done.stdout).group(1))  # type: ignore[union-attr]
    succeeded, failed = (int(n) for n in re.search(  # type: ignore[union-attr]
        r"(\d+) succeeded, (\d+) failed", done.stdout).groups())
    if failed or not succeeded:
        raise RuntimeError(f"h2load: {failed} of {succeeded + failed} calls failed:\n{done.stdout[-1500:]}")
    latencies = sorted(int(line.split("\t")[2]) for line in log.read_text().splitlines() if line.count("\t") == 2)
    return succeeded, seconds, latencies[len(latencies) // 2] / 1000 if latencies else float("nan")


async def check_echo(host: str, port: int) -> None:
    """One unary call answered with status OK and its own bytes: h2load counts any HTTP 200 as a success,
    and a gRPC error is an HTTP 200 too."""
    channel = Channel(host, port, codec=RawCodec())
    try:
        async with channel.request("/test.Echo/Unary", Cardinality.UNARY_UNARY, bytes, bytes,
                                   metadata=IDENT) as stream:
            await stream.send_message(PAYLOAD, end=True)
            answer = await stream.recv_message()
            await stream.recv_trailing_metadata()  # raises GRPCError on a status other than OK
    finally:
        channel.close()
    if answer != PAYLOAD:
        raise RuntimeError(f"{host}:{port} did not echo the call: {answer!r}")


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
    """Per peer, the rates (ops/s), p50 latencies (ms, where the client gives them) and every process's CPU per
    op, over the rounds."""

    load: str = LOAD_SELF
    load_name: str = "client"
    rates: dict[str, list[float]] = field(default_factory=dict)
    p50s: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[dict[str, Cpu]]] = field(default_factory=dict)
    loads: list[str] = field(default_factory=list)  # the load average after each run

    def measure(self, peer: Peer, run: Callable[[], tuple[float, ...]]) -> None:
        """Run one load against ``peer`` (``run()`` returns the ops done, the seconds they took and perhaps
        their p50 in ms) with every process metered (over the whole run: its connection and first calls too,
        a few ms in seconds)."""
        meter = CpuMeter(peer.processes, self.load, self.load_name)
        with meter:
            ops, elapsed, *p50 = run()
        self.rates.setdefault(peer.name, []).append(ops / elapsed)
        if p50:
            self.p50s.setdefault(peer.name, []).append(p50[0])
        self.cpu.setdefault(peer.name, []).append(meter.per_op(ops))
        self.loads.append(loadavg().split()[0])

    def report(self, label: str, per: str) -> None:
        rate = {name: statistics.median(values) for name, values in self.rates.items()}
        cells = [f"{name} {value:7.0f}" for name, value in rate.items()]
        ratios = [f"{a}/{b} {rate[a] / rate[b]:.2f}" for a, b in
                  (("gateway", "direct"), ("gateway", "nginx"), ("nginx", "direct"), ("gateway", "baseline"))
                  if a in rate and b in rate]
        print(f"{label:<24} " + "   ".join(cells) + "   " + "  ".join(ratios), flush=True)
        if self.p50s:
            print("    p50 ms: " + "   ".join(f"{name} {statistics.median(values):.3f}"
                                             for name, values in self.p50s.items()), flush=True)
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
                        help="unary calls in flight on the one connection, or a list of them: 1,10,50 (default 32)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per unary run (default 5)")
    parser.add_argument("--streams", type=int, default=4, help="concurrent server streams (default 4)")
    parser.add_argument("--stream-messages", type=int, default=50_000, help="messages per stream (default 50000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; medians are printed (default 3)")
    parser.add_argument("--no-nginx", action="store_true", help="leave nginx's grpc_pass out")
    parser.add_argument("--no-streaming", action="store_true", help="unary calls only")
    parser.add_argument("--client", choices=("h2load", "grpclib"), default="h2load" if H2LOAD else "grpclib",
                        help="unary load generator (default h2load when installed)")
    parser.add_argument("--sandbox", choices=("grpcio", "grpclib"), default="grpcio",
                        help="the echo server behind every peer (default grpcio)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also load a gateway served from this checkout (its gateway/ package), as 'baseline'")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.stream_messages, args.repeat = 2.0, 10_000, 1
    levels = [int(c) for c in str(args.concurrency).split(",")]
    import uvloop

    client = ("h2load (nghttp2), a child process, one HTTP/2 connection" if args.client == "h2load"
              else "grpclib in this process (uvloop), one HTTP/2 connection")
    print(header("grpc_bench.py",
                 f"client:       {client}; unary calls in flight {levels}; streams (grpclib) {args.streams} x "
                 f"{args.stream_messages} messages of 64 bytes; {args.duration:g}s per unary run; medians of "
                 f"{args.repeat} interleaved rounds",
                 f"sandbox:      {args.sandbox} echo server (one process)",
                 "peers:        direct (the sandbox), "
                 + ("" if args.no_nginx else "nginx grpc_pass with upstream keepalive 32 (1 worker), ")
                 + (f"baseline (`serve` from {args.baseline}: {gateway_build(checkout=args.baseline)}), "
                    if args.baseline else "")
                 + "the gateway (`sandbox-gateway serve`, access log on)", installed=True), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="grpc-bench-"))
    procs: list[subprocess.Popen[str] | subprocess.Popen[bytes]] = []
    try:
        sandbox, sandbox_port = start_sandbox(args.sandbox)
        procs.append(sandbox)
        sandbox_pids = {"sandbox": [sandbox.pid]}
        peers = [Peer("direct", "127.0.0.1", sandbox_port, sandbox_pids)]
        if NGINX and not args.no_nginx:
            nginx, nport = start_nginx_grpc(workdir, sandbox_port)
            procs.append(nginx)
            peers.append(Peer("nginx", "127.0.0.1", nport, {"nginx": [nginx.pid], **sandbox_pids}))
        elif not args.no_nginx:
            print(f"nginx is not installed ({NGINX_INSTALL}): no nginx figures", file=sys.stderr)
        if args.baseline is not None:
            base, bhost, bport = start_gateway(workdir / "baseline", sandbox_port, args.baseline.resolve())
            procs.append(base)
            peers.append(Peer("baseline", bhost, bport, {"gateway": [base.pid], **sandbox_pids}))
        gateway, ghost, gport = start_gateway(workdir / "gateway", sandbox_port)
        procs.append(gateway)
        peers.append(Peer("gateway", ghost, gport, {"gateway": [gateway.pid], **sandbox_pids}))
        for peer in peers:
            uvloop.run(check_echo(peer.host, peer.port))

        load = (LOAD_CHILD, "h2load") if args.client == "h2load" else (LOAD_SELF, "client")
        unary = {c: Figures(*load) for c in levels}
        stream = Figures()
        for _ in range(args.repeat):
            for c in levels:  # interleaved: each round loads every peer in turn
                for peer in peers:
                    if args.client == "h2load":
                        unary[c].measure(peer, lambda p=peer, c=c: h2load_calls(  # type: ignore[misc]
                            workdir, p.host, p.port, c, args.duration))
                    else:
                        unary[c].measure(peer, lambda p=peer, c=c: uvloop.run(  # type: ignore[misc]
                            unary_calls(p.host, p.port, c, args.duration)))
            for peer in peers if not args.no_streaming else ():
                stream.measure(peer, lambda p=peer: uvloop.run(  # type: ignore[misc]
                    streamed_messages(p.host, p.port, args.streams, args.stream_messages)))
    finally:
        stop_procs(list(reversed(procs)))
        shutil.rmtree(workdir, ignore_errors=True)  # nginx's config and temp dirs, serve's log
    print("goals: unary >= 0.5 of direct, streaming >= 0.8 of direct (issue 18); >= nginx at c=1,10,50 (issue 33)")
    for c in levels:
        unary[c].report(f"unary calls/s c={c}", "call")
    if not args.no_streaming:
        stream.report("streamed messages/s", "message")
    print(footer())


if __name__ == "__main__":
    main()
