"""Every client-facing listener is bounded in connections, in all and per source address (gateway/gate.py):
past a bound a new connection is refused at once (the data plane: 503 with Retry-After and the JSON error
naming the setting; the gRPC front: GOAWAY ENHANCE_YOUR_CALM), counted, and a victim from another address,
the control API's health checks and metrics go on being served.

Source addresses are loopback ones (127.0.0.2, .3, ...: Linux routes all of 127/8 to lo), so the per-client
bound is shown with real sockets. The flood test opens thousands of idle connections (the descriptor limit
is raised in this process first) to both ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame

from gateway.gate import ConnectionGate, connection_bounds
from tests.grpc_helpers import echo_server, grpc_gateway
from tests.test_grpc_hostile import RawConnection, describe

WAIT = 10.0
HEADERS = {"X-User-Id": "victim", "X-Session-Id": "v1"}


# -- the gate -------------------------------------------------------------------------------------------------

def test_the_gate_counts_per_listener_and_per_address_and_names_the_bound():
    refused: list[tuple[str, str]] = []
    gate = ConnectionGate("data", 3, 2, on_refused=lambda *key: refused.append(key))
    assert gate.admit("a") is None and gate.admit("a") is None
    assert gate.admit("a") == "max_connections_per_client"
    assert gate.admit("b") is None
    assert gate.admit("c") == "max_connections"
    gate.release("a")
    assert gate.admit("c") is None and gate.by_client == {"a": 1, "b": 1, "c": 1}
    assert refused == [("data", "max_connections_per_client"), ("data", "max_connections")]
    assert "SANDBOX_GATEWAY_MAX_CONNECTIONS_PER_CLIENT" in gate.refusal("max_connections_per_client")


@pytest.mark.parametrize(("settings", "limit", "expected"), [
    pytest.param((None, None), 20_000, (4_000, 500), id="derived from a 20,000 descriptor limit"),
    pytest.param((None, None), 1_024, (204, 25), id="a small limit still leaves a reserve"),
    pytest.param((100, None), 20_000, (100, 16), id="per client never below 16"),
    pytest.param((100, 500), 20_000, (100, 100), id="per client never above the total"),
])
def test_bounds_default_to_shares_of_the_descriptor_limit(settings, limit, expected):
    assert connection_bounds(*settings, limit=limit) == expected


# -- a whole gateway ----------------------------------------------------------------------------------------

@pytest.fixture
async def gateway(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A gateway whose sandbox answers HTTP (a plain aiohttp app) and gRPC (the echo service)."""
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="served")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with echo_server() as (_, grpc_port):
        policy = tmp_path / "policy.yaml"
        policy.write_text(
            "pools:\n"
            f"  small: {{provider: static, upstreams: ['http://127.0.0.1:{http_port}'], grpc_port: {grpc_port}}}\n"
            f"  shared: {{provider: static, upstreams: ['http://127.0.0.1:{http_port}'], grpc_port: {grpc_port}}}\n",
            encoding="utf-8")
        async with grpc_gateway(tmp_path, policy, **request.param) as gw:
            yield gw
    await runner.cleanup()


def connect_from(source: str, address: tuple[str, int]) -> socket.socket:
    """A blocking connect from a loopback source address (the kernel completes it before the accept)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(WAIT)
    sock.connect(address)
    return sock


async def connect_async(source: str, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    try:
        sock.bind((source, 0))
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), WAIT)
    except BaseException:
        sock.close()
        raise
    return sock


def drop(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0): thousands of closes leave no TIME_WAIT ports behind for other tests."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


async def read_all(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(WAIT):
        while chunk := await loop.sock_recv(sock, 65536):
            data += chunk
    return data


async def served(url: str, session: aiohttp.ClientSession, local: str) -> None:
    async with session.get(url, headers=HEADERS) as response:
        assert response.status == 200, (local, await response.text())


def refused_count(gw: Any, listener: str, bound: str) -> float:
    value = gw.metrics.registry.get_sample_value("sgw_connections_refused_total",
                                                 {"listener": listener, "bound": bound})
    return value or 0.0


@pytest.mark.parametrize("gateway", [{"max_connections": 12, "max_connections_per_client": 5}], indirect=True)
async def test_the_data_plane_refuses_past_its_bounds_with_503_and_a_victim_is_served(gateway):
    data = gateway.data_address
    held = [connect_from("127.0.0.2", data) for _ in range(5)]
    try:
        over = connect_from("127.0.0.2", data)
        answer = await read_all(over)
        over.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"\r\nRetry-After: " in head and b"Connection: close" in head
        error = json.loads(body)["error"]
        assert error["code"] == "too_many_connections" and "max_connections_per_client" in error["message"]

        held += [connect_from(f"127.0.0.{n}", data) for n in (3, 4) for _ in range(3)]  # 11 of 12
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.9", 0), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as victim:
            await served(f"http://{data[0]}:{data[1]}/", victim, "the 12th connection")
            held.append(connect_from("127.0.0.5", data))  # 12 of 12
            full = connect_from("127.0.0.6", data)
            answer = await read_all(full)
            full.close()
            assert answer.startswith(b"HTTP/1.1 503 ") and b"(max_connections," in answer, answer[:300]
            async with aiohttp.ClientSession() as control:  # the control API is not the data plane's to fill
                for path in ("/healthz", "/readyz", "/metrics"):
                    host, port = gateway.control_address
                    async with control.get(f"http://{host}:{port}{path}") as response:
                        assert response.status == 200, path
            held.pop().close()  # a slot comes back when a connection closes
            await asyncio.sleep(0)
            async with asyncio.timeout(WAIT):
                while gateway.data_plane.gate.open > 11:
                    await asyncio.sleep(0.01)
            await served(f"http://{data[0]}:{data[1]}/", victim, "a freed slot")
        assert refused_count(gateway, "data", "max_connections_per_client") == 1
        assert refused_count(gateway, "data", "max_connections") == 1
    finally:
        for sock in held:
            drop(sock)


@pytest.mark.parametrize("gateway", [{"max_connections": 8, "max_connections_per_client": 3}], indirect=True)
async def test_the_grpc_front_refuses_past_its_bounds_with_enhance_your_calm(gateway):
    address = gateway.grpc_address
    held = [connect_from("127.0.0.2", address) for _ in range(3)]
    try:
        over = RawConnection(connect_from("127.0.0.2", address), address)
        over.sock.setblocking(False)
        end = await over.ending()
        over.close()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.ENHANCE_YOUR_CALM, describe(end)
        assert b"max_connections_per_client" in end.additional_data
        victim = await RawConnection.open(address)  # from 127.0.0.1
        try:
            await victim.unary()
        finally:
            victim.close()
        held += [connect_from(f"127.0.0.{n}", address) for n in (3, 4) for _ in range(2)] + \
            [connect_from("127.0.0.5", address)]  # 8 of 8
        full = RawConnection(connect_from("127.0.0.6", address), address)
        full.sock.setblocking(False)
        end = await full.ending()
        full.close()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.ENHANCE_YOUR_CALM, describe(end)
        assert b"(max_connections," in end.additional_data
        metrics = gateway.metrics.registry
        assert metrics.get_sample_value("sgw_grpc_connections_closed_total", {"reason": "max_connections"}) == 1
        assert refused_count(gateway, "grpc", "max_connections_per_client") == 1
    finally:
        for sock in held:
            drop(sock)


FLOOD = 1500          # idle connections per source address, per port
SOURCES = ("127.0.0.2", "127.0.0.3")


def raise_descriptors(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed <= hard or (hard == resource.RLIM_INFINITY and soft < needed):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        pytest.skip(f"needs {needed} descriptors; this machine allows {hard}")


@pytest.mark.parametrize("gateway", [{"max_connections": 2500, "max_connections_per_client": 1000}],
                         indirect=True)
async def test_thousands_of_idle_connections_cost_a_victim_nothing(gateway):
    """Two sources open 1,500 idle connections each to the data plane and to the gRPC front (6,000: 12,000
    descriptors with the gateway's ends); each listener holds 1,000 per source and the rest are refused, which
    leaves 500 of its 2,500 for everyone else.
    Meanwhile a victim from its own address is served on both ports, and the control API answers."""
    raise_descriptors(2 * 2 * FLOOD * len(SOURCES) + 2000)
    data, grpc = gateway.data_address, gateway.grpc_address
    held: list[socket.socket] = []
    try:
        for source in SOURCES:
            for address in (data, grpc):
                for _ in range(0, FLOOD, 100):  # in batches, the loop accepting meanwhile (the backlog is finite)
                    held += await asyncio.gather(*(connect_async(source, address) for _ in range(100)))
        async with asyncio.timeout(60):
            while gateway.data_plane.gate.open < 2000 or gateway.grpc_front.gate.open < 2000:
                await asyncio.sleep(0.05)
        assert gateway.data_plane.gate.by_client == {source: 1000 for source in (s.encode() for s in SOURCES)}
        assert gateway.grpc_front.gate.by_client == {source: 1000 for source in SOURCES}
        latencies = []
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.9", 0))
        async with aiohttp.ClientSession(connector=connector) as victim:
            for _ in range(20):
                started = time.perf_counter()
                await served(f"http://{data[0]}:{data[1]}/", victim, "a victim during the flood")
                latencies.append(time.perf_counter() - started)
            host, port = gateway.control_address
            async with victim.get(f"http://{host}:{port}/healthz") as response:
                assert response.status == 200
        conn = await RawConnection.open(grpc)
        try:
            await conn.unary()
        finally:
            conn.close()
        assert refused_count(gateway, "data", "max_connections_per_client") == 2 * (FLOOD - 1000)
        assert refused_count(gateway, "grpc", "max_connections_per_client") == 2 * (FLOOD - 1000)
        assert max(latencies) < 2.0, latencies
    finally:
        for sock in held:
            drop(sock)
