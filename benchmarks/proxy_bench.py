"""Data-plane throughput: direct vs nginx (reverse proxy) vs the gateway, on the same cores.

    .venv/bin/python benchmarks/proxy_bench.py [--quick] [--concurrency 10,50,200] [--workers 1,2]

A fixed backend (nginx serving a small static file when nginx is installed, else
a fast asyncio server) is loaded directly, through nginx as a reverse proxy
(keep-alive upstream) and through the gateway (DataPlane with a fixed resolver,
1 or 2 worker processes on one SO_REUSEPORT port), all with the same client (wrk
when installed, else an aiohttp load generator). The three targets run back to
back for each concurrency level, and each cell is the median of ``--repeat``
such rounds, so drift in whatever else the machine does hits all three alike.
Then streaming: SSE events/s and a 100 MB upload, direct vs gateway.

It prints the machine, the build and the load average first (``harness.header``),
and under each row the CPU per request of every process of each target's run
(the proxy, the backend, Redis if used, wrk). ``--serve`` with more than one
worker uses ``BENCH_REDIS_URL`` when set, else a redis-server of its own.

Load generator, backend and proxies share the machine's cores: read the ratios,
not the absolute numbers. Steadier than req/s on a shared machine is the CPU each
proxy spends per proxied request (``nginx us/req``, ``gw us/req``): the on-CPU time
of its whole process tree (every thread, from ``/proc/PID/task/TID/schedstat``)
over the run, divided by the requests wrk completed; in brackets the part of it
spent in the kernel (``/proc/PID/stat`` stime). ``--profile DIR`` records
the gateway with py-spy (``--native``, raw folded stacks) in one extra round at
each concurrency, kept out of the figures. ``--no-fast-path`` gives the resolver a
``cached_route`` that always misses, which costs the gateway one task per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness import (  # noqa: E402
    LOAD_CHILD,
    LOAD_SELF,
    NGINX,
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
from benchmarks.pyspy_profile import print_breakdowns, py_spy  # noqa: E402

WRK = shutil.which("wrk")
IDENTITY = {"X-User-Id": "bench-user", "X-Session-Id": "bench-session"}
BODY = b"hello, world\n"


# -- the gateway --------------------------------------------------------------
def launch_gateway(backend_port: int, workers: int, *, fast_path: bool = True, serve_dir: Path | None = None,
                   redis_url: str | None = None) -> tuple[list[subprocess.Popen[bytes]], int]:
    """Start the gateway in front of ``backend_port``: ``workers`` processes on one SO_REUSEPORT port.

    The one place that knows how the gateway is started: the bare data plane with a fixed resolver,
    or with ``serve_dir`` the whole ``sandbox-gateway serve`` (policy routing, owner check, metrics,
    activity, the access log on and written to a file there) with a static pool on the backend;
    ``redis_url`` is its store, which more than one ``serve`` worker needs.
    """
    port = free_port()
    if serve_dir is not None:
        policy = serve_dir / "policy.yaml"
        upstream = f"http://127.0.0.1:{backend_port}"
        policy.write_text(f"pools: {{small: {{provider: static, upstreams: ['{upstream}']}}, "
                          f"shared: {{provider: static, upstreams: ['{upstream}']}}}}\n")
        if workers > 1 and redis_url is None:
            raise ValueError("`serve --workers N` needs Redis: pass redis_url")
        redis = ["--redis-url", redis_url] if workers > 1 and redis_url else []
        with open(serve_dir / f"serve-{port}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.cli", "serve", "--workers", str(workers), "--policy", str(policy),
                 "--data-port", str(port), "--control-port", "0", "--grpc-port", "0", "--log-format", "json", *redis],
                cwd=serve_dir, stderr=log)
        wait_port(port)
        time.sleep(0.2 * workers)
        return [proc], port
    args = [sys.executable, __file__, "_gateway", str(port), str(backend_port), "1" if fast_path else "0"]
    procs = [subprocess.Popen(args, cwd=ROOT) for _ in range(workers)]
    wait_port(port)
    time.sleep(0.2 * workers)  # every worker bound and serving
    return procs, port


def _gateway_worker(port: int, backend_port: int, fast_path: bool) -> None:
    import uvloop

    from gateway.model import Endpoint, Owner, Route
    from gateway.proxy import DataPlane, PlaneOptions
    from routing import Identity

    endpoint = Endpoint("127.0.0.1", backend_port)

    class FixedResolver:
        """Every session goes to the one backend (what SessionRouter's cache hit returns)."""

        def __init__(self) -> None:
            self.routes: dict[str, Route] = {}

        def cached_route(self, identity: Identity, owned: Route | None = None) -> Route | None:
            route = self.routes.get(identity.session_id)
            if route is None:
                route = self.routes[identity.session_id] = Route(
                    identity.session_id, "ses-bench", "small", endpoint, Owner.of(identity))
            return route

        async def resolve(self, identity: Identity) -> Route:
            return self.cached_route(identity)  # type: ignore[return-value]

        def invalidate(self, key: str) -> None:
            self.routes.pop(key, None)

        def stream_opened(self, sandbox_id: str) -> None:
            pass

        def stream_closed(self, sandbox_id: str) -> None:
            pass

    class SlowPathResolver(FixedResolver):
        def cached_route(self, identity: Identity, owned: Route | None = None) -> Route | None:
            return None  # a miss every time: one task per request

        async def resolve(self, identity: Identity) -> Route:
            return FixedResolver.cached_route(self, identity)  # type: ignore[return-value]

    async def main() -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(4096)
        sock.setblocking(False)
        resolver = FixedResolver() if fast_path else SlowPathResolver()
        # BENCH_TRACING_ENDPOINT (an OTLP/HTTP receiver): requests traced (gateway/tracing.py), for its cost;
        # BENCH_TRACING_RATIO: the share sampled (default 1.0).
        endpoint = os.environ.get("BENCH_TRACING_ENDPOINT")
        tracer = None
        if endpoint:
            from gateway.tracing import Tracer

            tracer = Tracer(endpoint, float(os.environ.get("BENCH_TRACING_RATIO", "1.0")))
        plane = DataPlane(resolver, PlaneOptions(upstream_pool_size=512), tracer=tracer)
        await plane.start(sock)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await stop.wait()
        await plane.stop(1.0)

    uvloop.run(main())


NGINX_BACKEND = """
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {dir}/www;
        location / {{ }}
    }}
"""

NGINX_PROXY = """
    upstream backend {{ server 127.0.0.1:{backend}; keepalive 256; keepalive_requests 10000000; }}
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        {log}
        location / {{
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
"""


def nginx_log(args: argparse.Namespace, tmp: Path, workers: int) -> str:
    """The proxy nginx's access_log directive: every request logged, buffered (as ``serve`` logs each
    request and writes them in batches), or none (``--nginx-log off``; the default for the bare plane,
    which logs nothing)."""
    if args.nginx_log == "off" or (args.nginx_log == "auto" and not args.serve):
        return "access_log off;"
    return f"access_log {tmp}/proxy{workers}-access.log combined buffer=64k flush=1s;"


@dataclass
class Backend:
    port: int
    procs: list[subprocess.Popen[bytes]]


def start_backend(tmp: Path) -> Backend:
    port = free_port()
    if NGINX:
        (tmp / "www").mkdir(exist_ok=True)
        (tmp / "www" / "index.html").write_bytes(BODY)
        proc = start_nginx(tmp, "backend", 1, NGINX_BACKEND.format(port=port, dir=tmp))
    else:
        proc = subprocess.Popen([sys.executable, __file__, "_backend", str(port)])
    wait_port(port)
    return Backend(port, [proc])


# -- streaming backend (SSE and uploads) ----------------------------------------
def _stream_backend(port: int) -> None:
    import uvloop

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                return
            line = head.split(b"\r\n", 1)[0]
            if line.startswith(b"GET /sse"):
                count = int(line.split(b"n=")[1].split()[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                event = b"data: %s\n\n" % (b"x" * 48)
                chunk = b"%x\r\n%s\r\n" % (len(event), event)
                for i in range(count):
                    writer.write(chunk)
                    if i % 64 == 0:
                        await writer.drain()
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            else:  # POST /upload with Content-Length: read and discard
                length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
                left = length
                while left:
                    data = await reader.read(min(left, 1 << 20))
                    if not data:
                        return
                    left -= len(data)
                body = b"%d" % length
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, limit=1 << 20)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


def _plain_backend(port: int) -> None:
    """Fallback backend without nginx: a minimal keep-alive HTTP server on uvloop."""
    import uvloop

    response = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/html\r\n\r\n%s" % (len(BODY), BODY)

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(response * data.count(b"\r\n\r\n"))  # type: ignore[attr-defined]

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Server, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# -- load -------------------------------------------------------------------------
@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    elapsed: float = 0.0          # seconds the load ran (requests = rps * elapsed)
    cpu: dict[str, Cpu] = field(default_factory=dict)  # per role (gateway, nginx, backend, wrk): CPU per request


def _ms(text: str) -> float:
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def load(port: int, concurrency: int, duration: float, headers: dict[str, str],
         measure: dict[str, list[int]] | None = None) -> Result:
    """Load ``port``; also the CPU per request of each process tree in ``measure`` (role: root PIDs) and
    of the load generator itself."""
    meter = CpuMeter(measure or {}, LOAD_CHILD if WRK else LOAD_SELF, "wrk" if WRK else "aiohttp")
    with meter:
        result = _load(port, concurrency, duration, headers)
    result.cpu = meter.per_op(result.rps * result.elapsed)
    return result


def _load(port: int, concurrency: int, duration: float, headers: dict[str, str]) -> Result:
    url = f"http://127.0.0.1:{port}/index.html"
    if WRK:
        threads = min(2, concurrency)
        cmd = [WRK, f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "--latency"]
        for name, value in headers.items():
            cmd += ["-H", f"{name}: {value}"]
        out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
        done = re.search(r"(\d+) requests in ([\d.]+)(\w+)", out)
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
        p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
        if "Non-2xx" in out or "Socket errors" in out:
            print(f"  warning: errors during load on port {port}:\n{out}", file=sys.stderr)
        return Result(rps, p50, p99, elapsed=int(done.group(1)) / rps if done and rps else 0.0)
    return asyncio.run(_aiohttp_load(url, concurrency, duration, headers))


async def _aiohttp_load(url: str, concurrency: int, duration: float, headers: dict[str, str]) -> Result:
    import aiohttp

    latencies: list[float] = []
    deadline = time.perf_counter() + duration

    async def worker(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            async with session.get(url, headers=headers) as response:
                await response.read()
            latencies.append(time.perf_counter() - start)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        started = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return Result(len(latencies) / elapsed, latencies[len(latencies) // 2] * 1000,
                  latencies[int(len(latencies) * 0.99)] * 1000, elapsed=elapsed)


async def _sse_rate(port: int, events: int, headers: dict[str, str]) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"GET /sse?n={events} HTTP/1.1\r\nHost: bench\r\n{extra}\r\n".encode())
    start = time.perf_counter()
    seen = 0
    last = b""
    while seen < events:
        data = await reader.read(1 << 16)
        if not data:
            break
        seen += (last + data).count(b"\n\n")  # an event's blank line may be split across two reads
        last = data[-1:]
    elapsed = time.perf_counter() - start
    writer.close()
    await writer.wait_closed()
    return seen / elapsed


async def _upload_rate(port: int, size: int, headers: dict[str, str]) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"POST /upload HTTP/1.1\r\nHost: bench\r\nContent-Length: {size}\r\n{extra}\r\n".encode())
    chunk = os.urandom(1 << 18)
    start = time.perf_counter()
    left = size
    while left:
        piece = chunk[:left]
        writer.write(piece)
        left -= len(piece)
        await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    elapsed = time.perf_counter() - start
    writer.close()
    await writer.wait_closed()
    return size / elapsed / 1e6


# -- the run ------------------------------------------------------------------------
def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.rjust(width) for cell, width in zip(cells, widths))


@contextlib.contextmanager
def running(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Stop ``procs`` on the way out, whatever happened."""
    try:
        yield
    finally:
        stop_procs(procs)


def median_result(results: list[Result]) -> Result:
    """The run with the median throughput (its latencies belong to that run), with each process's median CPU
    per request."""
    middle = sorted(results, key=lambda r: r.rps)[len(results) // 2]
    return Result(middle.rps, middle.p50_ms, middle.p99_ms, middle.elapsed, median_cpu([r.cpu for r in results]))


def _us(result: Result | None, role: str) -> str:
    """CPU per request of ``role``'s processes: total (kernel part)."""
    cpu = result.cpu.get(role) if result is not None else None
    return "-" if cpu is None else str(cpu)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        role, *rest = sys.argv[1:]
        if role == "_gateway":
            _gateway_worker(int(rest[0]), int(rest[1]), rest[2] == "1")
        elif role == "_backend":
            _plain_backend(int(rest[0]))
        elif role == "_stream":
            _stream_backend(int(rest[0]))
        return

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short runs (about a minute in all)")
    parser.add_argument("--concurrency", default="10,50,200")
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--duration", type=float, default=None, help="seconds per load run")
    parser.add_argument("--repeat", type=int, default=None, help="rounds per cell; the median is shown")
    parser.add_argument("--serve", action="store_true",
                        help="the whole `sandbox-gateway serve` (access log on) instead of the bare data plane; "
                             "with more than one worker it uses BENCH_REDIS_URL when set, else starts its own "
                             "redis-server on a loopback port the kernel chooses")
    parser.add_argument("--nginx-log", choices=("auto", "on", "off"), default="auto",
                        help="whether the nginx proxy writes an access line per request (buffered, 64k, flushed "
                             "each second): auto is on with --serve (whose access log is on) and off without")
    parser.add_argument("--no-fast-path", action="store_true",
                        help="resolver whose cached_route always misses: one task per request")
    parser.add_argument("--no-streaming", action="store_true", help="skip the SSE and upload runs")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="py-spy record (--native, raw folded stacks) the gateway in one extra round at each "
                             "concurrency (not counted), into DIR/gateway-w<workers>-c<conc>.txt")
    args = parser.parse_args()
    duration = args.duration or (2.0 if args.quick else 5.0)
    repeat = args.repeat or (1 if args.quick else 3)
    levels = [int(c) for c in args.concurrency.split(",")]
    worker_counts = [int(n) for n in args.workers.split(",")]

    print(header("proxy_bench.py" + (" --serve" if args.serve else " (bare data plane)"),
                 f"client:       {'wrk -t2' if WRK else 'aiohttp (in this process)'}; "
                 f"backend: {'nginx static file' if NGINX else 'asyncio'}; "
                 f"{duration:g}s per run, median of {repeat} interleaved rounds",
                 f"nginx proxy:  access log {nginx_log(args, Path('<tmp>'), 1)}", installed=args.serve), flush=True)
    with tempfile.TemporaryDirectory(prefix="proxy-bench-") as tmp_name, contextlib.ExitStack() as stack:
        tmp = Path(tmp_name)
        redis_url, redis_pids = None, []
        if args.serve and max(worker_counts) > 1:
            redis_url, redis_pids = bench_redis(stack)
        print("under each row: CPU per request in us (kernel part in brackets) of every process in each "
              "target's run (the proxy, the backend, Redis if used, the load generator)")
        header_row = ["workers", "conc", "direct r/s", "nginx r/s", "gateway r/s", "gw/nginx", "gw/direct",
                      "direct p50/p99 ms", "nginx p50/p99 ms", "gateway p50/p99 ms", "nginx us/req (sys)",
                      "gw us/req (sys)"]
        widths = [7, 4, 10, 9, 11, 8, 9, 17, 16, 18, 18, 15]
        print(_row(header_row, widths), flush=True)
        backend = start_backend(tmp)
        with running(backend.procs):
            gateway_cpu = run_table(args, tmp, backend, levels, worker_counts, duration, repeat, widths,
                                    redis_url, redis_pids)
        if args.profile is not None:
            print_breakdowns(args.profile, {cell: result.cpu for cell, result in gateway_cpu.items()})
        if not args.no_streaming:
            run_streaming(args)
    print(footer())


def bench_redis(stack: contextlib.ExitStack) -> tuple[str, list[int]]:
    """The Redis more than one ``serve`` worker needs: ``BENCH_REDIS_URL``, else a redis-server of our own.

    Ours is the tests' (``tests/redis_server.py``): a temp dir, a loopback port the kernel chose, no
    persistence; its PID is returned so its CPU per request is measured with the gateway's.
    """
    url = os.environ.get("BENCH_REDIS_URL")
    if url:
        return url, []
    from tests.redis_server import RedisServer, redis_server_path

    if redis_server_path() is None:
        raise SystemExit("--serve with more than one worker needs Redis: install redis-server "
                         "(apt-get install redis-server) or set BENCH_REDIS_URL")
    server = stack.enter_context(RedisServer())
    print(f"redis:        redis-server of our own at {server.url} (BENCH_REDIS_URL unset)", flush=True)
    return server.url, [server.pid] if server.pid is not None else []


def run_table(args: argparse.Namespace, tmp: Path, backend: Backend, levels: list[int], worker_counts: list[int],
              duration: float, repeat: int, widths: list[int], redis_url: str | None,
              redis_pids: list[int]) -> dict[tuple[int, int], Result]:
    """Direct, nginx and the gateway, interleaved per concurrency level: one row (and a CPU line) per cell."""
    gateway_cpu: dict[tuple[int, int], Result] = {}
    backend_pids = {"backend": [proc.pid for proc in backend.procs]}
    for workers in worker_counts:
        procs: list[subprocess.Popen[bytes]] = []
        nport = None
        if NGINX:
            nport = free_port()
            config = NGINX_PROXY.format(port=nport, backend=backend.port, log=nginx_log(args, tmp, workers))
            procs.append(start_nginx(tmp, f"proxy{workers}", workers, config))
            wait_port(nport)
        gateway_procs, gport = launch_gateway(backend.port, workers, fast_path=not args.no_fast_path,
                                              serve_dir=tmp if args.serve else None,
                                              redis_url=redis_url if workers > 1 else None)
        measure = {
            "direct": backend_pids,
            "nginx": {"nginx": [procs[0].pid] if nport else [], **backend_pids},
            "gateway": {"gateway": [proc.pid for proc in gateway_procs], **backend_pids,
                        **({"redis": redis_pids} if redis_pids and workers > 1 else {})},
        }
        procs += gateway_procs
        with running(procs):
            load(backend.port, 10, 1, {})  # warm up all three
            if nport:
                load(nport, 10, 1, {})
            load(gport, 10, 1, IDENTITY)
            for c in levels:
                # Interleaved rounds: drift in what else the machine does hits all three alike.
                runs: dict[str, list[Result]] = {"direct": [], "nginx": [], "gateway": []}
                for _ in range(repeat):
                    runs["direct"].append(load(backend.port, c, duration, {}, measure=measure["direct"]))
                    if nport:
                        runs["nginx"].append(load(nport, c, duration, {}, measure=measure["nginx"]))
                    runs["gateway"].append(load(gport, c, duration, IDENTITY, measure=measure["gateway"]))
                if args.profile is not None:  # a round of its own: sampling slows what it samples
                    args.profile.mkdir(parents=True, exist_ok=True)
                    spy = py_spy(gateway_procs[0].pid, args.profile / f"gateway-w{workers}-c{c}.txt",
                                 max(duration, 8))
                    if spy is not None:
                        load(gport, c, max(duration, 8), IDENTITY)
                        spy.wait()
                d, g = median_result(runs["direct"]), median_result(runs["gateway"])
                gateway_cpu[(workers, c)] = g
                n = median_result(runs["nginx"]) if runs["nginx"] else None
                print(_row([
                    str(workers), str(c), f"{d.rps:,.0f}", f"{n.rps:,.0f}" if n else "-", f"{g.rps:,.0f}",
                    f"{g.rps / n.rps:.2f}" if n else "-", f"{g.rps / d.rps:.2f}",
                    f"{d.p50_ms:.2f}/{d.p99_ms:.2f}", f"{n.p50_ms:.2f}/{n.p99_ms:.2f}" if n else "-",
                    f"{g.p50_ms:.2f}/{g.p99_ms:.2f}", _us(n, "nginx"), _us(g, "gateway")], widths), flush=True)
                cpus = {"direct": d.cpu, **({"nginx": n.cpu} if n else {}), "gateway": g.cpu}
                print(f"    CPU us/req (kernel): {cpu_line(cpus)}; load average {loadavg()}", flush=True)
    return gateway_cpu


def run_streaming(args: argparse.Namespace) -> None:
    """SSE events/s and a 100 MB upload, direct and through the (bare) gateway."""
    sport = free_port()
    stream = subprocess.Popen([sys.executable, __file__, "_stream", str(sport)])
    wait_port(sport)
    with running([stream]):
        procs, gport = launch_gateway(sport, 1, fast_path=not args.no_fast_path)
        with running(procs):
            events = 50_000 if args.quick else 200_000
            size = 100 * 1024 * 1024
            sse_direct = asyncio.run(_sse_rate(sport, events, {}))
            sse_gateway = asyncio.run(_sse_rate(gport, events, IDENTITY))
            up_direct = asyncio.run(_upload_rate(sport, size, {}))
            up_gateway = asyncio.run(_upload_rate(gport, size, IDENTITY))
    print()
    print(f"SSE events/s ({events:,} events of 56 B): direct {sse_direct:,.0f}, gateway {sse_gateway:,.0f} "
          f"(ratio {sse_gateway / sse_direct:.2f})")
    print(f"100 MB upload: direct {up_direct:,.0f} MB/s, gateway {up_gateway:,.0f} MB/s "
          f"(ratio {up_gateway / up_direct:.2f})")


if __name__ == "__main__":
    main()
