"""A victim tenant beside an attacker on one real ``sandbox-gateway serve``: the victim's p50/p99 and errors
on the data plane, the gRPC front and the control API, under each attack, beside its baseline (issue 28).

Attacks (all on loopback, bounded in count and time; the attackers use source addresses 127.0.0.2-4, the
victim its own):

- ``grpc-idle``: idle TCP connections to the gRPC port that never send a preface (the gateway holds
  ``max_connections_per_client`` of each source until ``grpc_handshake_timeout``, refuses the rest);
- ``slowloris``: data-plane connections that send a request head a line at a time, never finishing it;
- ``undeclared-streams``: one org opens SSE streams without ``Accept: text/event-stream``, past its
  ``max_streams_per_org`` (they take its slots; its declared ones then get 429; the victim's org has its own).

The sandbox is in this process: an aiohttp app (HTTP, SSE) and the grpclib echo service (gRPC), reached
through static pools. Local-sandbox attacks (files, disk, fork bomb) are in tests/test_local_bounds.py and
tests/test_confinement.py.

    .venv/bin/python benchmarks/neighbours.py [--connections 1500] [--victim 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402
from grpclib.client import Channel  # noqa: E402
from grpclib.const import Cardinality  # noqa: E402

from benchmarks.harness import footer, header  # noqa: E402
from tests.gateway_process import GatewayProcess  # noqa: E402
from tests.grpc_helpers import RawCodec, echo_server  # noqa: E402

SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
VICTIM = {"X-Org-Id": "victim", "X-User-Id": "v", "X-Session-Id": "victim-1"}


class Sandbox:
    """The victim's and attacker's sandbox: plain answers, and an event stream that stays open."""

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


async def measure(name: str, calls: int, call: Callable[[], Awaitable[None]]) -> dict[str, float]:
    latencies, errors = [], 0
    for _ in range(calls):
        started = time.perf_counter()
        try:
            await asyncio.wait_for(call(), 10)
            latencies.append(time.perf_counter() - started)
        except Exception:
            errors += 1
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else float("nan")
    return {"p50": statistics.median(latencies) * 1000 if latencies else float("nan"), "p99": p99 * 1000,
            "errors": errors, "calls": calls}


async def victim(gateway: GatewayProcess, calls: int) -> dict[str, dict[str, float]]:
    connector = aiohttp.TCPConnector(local_addr=("127.0.0.9", 0))
    host, port = gateway.grpc_address.rsplit(":", 1)
    channel = Channel(host, int(port), codec=RawCodec())
    method = "/test.Echo/Unary"
    async with aiohttp.ClientSession(connector=connector) as http:
        async def data() -> None:
            async with http.get(f"{gateway.data_url}/hello", headers=VICTIM) as response:
                assert response.status == 200
                await response.read()

        async def control() -> None:
            async with http.get(f"{gateway.control_url}/healthz") as response:
                assert response.status == 200
                await response.read()

        async def grpc() -> None:
            async with channel.request(method, Cardinality.UNARY_UNARY, bytes, bytes,
                                       metadata={k.lower(): v for k, v in VICTIM.items()}) as stream:
                await stream.send_message(b"ping", end=True)
                assert await stream.recv_message() == b"ping"

        try:
            return {"data plane": await measure("data", calls, data),
                    "gRPC": await measure("grpc", calls, grpc),
                    "control /healthz": await measure("control", max(20, calls // 4), control)}
        finally:
            channel.close()


async def idle_connections(address: tuple[str, int], per_source: int, payload: bytes | None) -> list[socket.socket]:
    loop = asyncio.get_running_loop()
    held: list[socket.socket] = []

    async def one(source: str) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
            await asyncio.wait_for(loop.sock_connect(sock, address), 5)
            if payload:
                await loop.sock_sendall(sock, payload)
            held.append(sock)
        except (OSError, TimeoutError):
            sock.close()

    for source in SOURCES:
        for start in range(0, per_source, 200):
            await asyncio.gather(*(one(source) for _ in range(min(200, per_source - start))))
    return held


async def refused(gateway: GatewayProcess, listener: str) -> int:
    """Connections the gateway refused on ``listener`` so far (sgw_connections_refused_total)."""
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.control_url}/metrics") as response:
        text = await response.text()
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("sgw_connections_refused_total{") and f'listener="{listener}"' in line))


def address(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


async def main(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    print(header("neighbours", f"descriptors:  {hard} (this process and the gateway's, raised to the hard limit)",
                 f"victim:       {args.victim} sequential calls per port and attack", installed=True), flush=True)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sandbox = Sandbox()
    app = web.Application()
    app.router.add_get("/events", sandbox.events)
    app.router.add_get("/{tail:.*}", sandbox.hello)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rows: list[tuple[str, str, dict[str, dict[str, float]], tuple[float, float, float]]] = []
    async with echo_server() as (_, grpc_port):
        with tempfile.TemporaryDirectory() as tmp:
            policy = Path(tmp) / "policy.yaml"
            upstream = f"['http://127.0.0.1:{http_port}'], grpc_port: {grpc_port}"
            policy.write_text(f"pools:\n  small: {{provider: static, upstreams: {upstream}}}\n"
                              f"  shared: {{provider: static, upstreams: {upstream}}}\n", encoding="utf-8")
            gateway = await GatewayProcess(Path(tmp) / "gw", "--policy", str(policy),
                                           env={"SANDBOX_GATEWAY_MAX_STREAMS_PER_ORG": "50",
                                                "SANDBOX_GATEWAY_ACCESS_LOG": "false"}).start()
            try:
                grpc_addr = address("h2c://" + gateway.grpc_address)
                await victim(gateway, 20)  # warm-up: the victim's sandbox route is cached
                rows.append(("baseline", "-", await victim(gateway, args.victim), os.getloadavg()))

                held = await idle_connections(grpc_addr, args.connections, None)
                shut = await refused(gateway, "grpc")
                rows.append(("grpc-idle", f"{len(held)} idle connects from {len(SOURCES)} addresses, "
                             f"{len(held) - shut} admitted, {shut} refused",
                             await victim(gateway, args.victim), os.getloadavg()))
                for sock in held:
                    sock.close()

                head = b"GET /hello HTTP/1.1\r\nHost: x\r\nX-User-Id: attacker\r\n"
                held = await idle_connections(address(gateway.data_url), args.connections, head)
                shut = await refused(gateway, "data")
                rows.append(("slowloris", f"{len(held)} unfinished heads from {len(SOURCES)} addresses, "
                             f"{len(held) - shut} admitted, {shut} refused",
                             await victim(gateway, args.victim), os.getloadavg()))
                for sock in held:
                    sock.close()

                streams, turned_away = [], 0
                async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
                    for i in range(args.streams):
                        response = await http.get(f"{gateway.data_url}/events", headers={
                            "X-Org-Id": "attacker", "X-User-Id": f"a{i}", "X-Session-Id": f"a{i}"})
                        if response.status == 200:
                            streams.append(response)
                        else:
                            turned_away += 1
                            response.release()
                    rows.append(("undeclared-streams", f"{len(streams)} open SSE streams of one org "
                                 f"(max_streams_per_org 50)", await victim(gateway, args.victim), os.getloadavg()))
                    sandbox.release.set()
                    for response in streams:
                        response.release()
            finally:
                await gateway.stop()
    await runner.cleanup()

    print()
    print("| attack | attacker | victim port | p50 ms | p99 ms | errors | load avg (1/5/15) |")
    print("|---|---|---|---|---|---|---|")
    for name, detail, results, load in rows:
        for port, result in results.items():
            print(f"| {name} | {detail} | {port} | {result['p50']:.2f} | {result['p99']:.2f} | "
                  f"{result['errors']}/{result['calls']} | {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} |")
    print(footer())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=1500, help="idle connections per attacking address")
    parser.add_argument("--streams", type=int, default=200, help="undeclared SSE streams the attacker opens")
    parser.add_argument("--victim", type=int, default=200, help="victim calls per port and scenario")
    asyncio.run(main(parser.parse_args()))
