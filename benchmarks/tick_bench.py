"""The CPU one pass of the data plane's clock takes with thousands of client connections open (issue 28).

    .venv/bin/python benchmarks/tick_bench.py [--connections 4000] [--ticks 20] [--mode idle|slowloris|keepalive]

A data plane in this process (its defaults: header_read_timeout 10 s, the tick every 0.5 s) with
``--connections`` loopback connections open to it: ``idle`` ones that have sent nothing, ``slowloris``
ones that sent half a request head, or ``keepalive`` ones that had one request answered (by an aiohttp
sandbox in this process) and stay open. Every pass of the clock (``DataPlane._check_deadlines``) is timed in
CPU time of this thread (``time.thread_time``), for ``--ticks`` passes after the connections are open and
before any of their deadlines is due (a keep-alive connection's first check, 10 s after its request, is let
pass first): the median and the largest pass are printed. Load does not add to
CPU time (it is this thread's), but a busy core makes caches colder: say the load beside a figure.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from benchmarks.harness import footer, header  # noqa: E402


async def run(connections: int, ticks: int, mode: str) -> list[float]:
    from aiohttp import web

    from tests.proxy_helpers import FakeResolver, gateways, identity_headers, read_response, request_bytes

    app = web.Application()
    app.router.add_get("/{tail:.*}", lambda _: web.Response(text="hello"))  # type: ignore[arg-type, return-value]
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    from gateway.model import Endpoint

    passes: list[float] = []
    try:
        async with gateways() as start:
            gw = await start(FakeResolver(Endpoint("127.0.0.1", port)), header_read_timeout=3600.0)
            plane = gw.plane
            writers = []
            for _ in range(connections):
                reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
                if mode == "slowloris":
                    writer.write(b"GET / HTTP/1.1\r\nHost: gateway.test\r\n")
                elif mode == "keepalive":
                    writer.write(request_bytes(headers=identity_headers()))
                    assert (await read_response(reader)).status == 200
                writers.append(writer)
            check = plane._check_deadlines

            def timed(now: float) -> None:
                began = time.thread_time()
                check(now)
                passes.append(time.thread_time() - began)

            plane._check_deadlines = timed
            # Not counted: the passes while each connection's first check falls due (a request's, 10 s after it
            # began: long_request_after); then every one is filed under its own deadline, an hour or 75 s away.
            await asyncio.sleep(2.0 if mode != "keepalive" else 12.0)
            passes.clear()
            tick = getattr(plane, "tick_len", None) or plane._tick_interval  # the latter before the wheel
            while len(passes) < ticks:
                await asyncio.sleep(tick)
            for writer in writers:
                writer.close()
    finally:
        await runner.cleanup()
    return passes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=4000)
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--mode", choices=("idle", "slowloris", "keepalive"), default="idle")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(header("tick", f"connections:  {args.connections} {args.mode}, {args.ticks} passes timed"), flush=True)
    try:
        import uvloop
        passes = uvloop.run(run(args.connections, args.ticks, args.mode))
    except ImportError:
        passes = asyncio.run(run(args.connections, args.ticks, args.mode))
    print(f"one pass of the clock: median {statistics.median(passes) * 1e3:.3f} ms, "
          f"largest {max(passes) * 1e3:.3f} ms (CPU time, {len(passes)} passes)")
    print(footer())


if __name__ == "__main__":
    main()
