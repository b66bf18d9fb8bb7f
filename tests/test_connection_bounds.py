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
from hyperframe.frame import DataFrame, GoAwayFrame

from gateway.errors import TooManyConnections
from gateway.gate import SHED_SCAN, ConnectionGate, connection_bounds
from gateway.proxy._wire import error_response, refusal_response
from tests.grpc_helpers import echo_server, grpc_gateway
from tests.test_grpc_hostile import RawConnection, describe, grpc_message

WAIT = 10.0
HEADERS = {"X-User-Id": "victim", "X-Session-Id": "v1"}


# -- the gate -------------------------------------------------------------------------------------------------

class Conn:
    """A connection as the gate sees one: busy (a request in flight) or not; shed once at most."""

    def __init__(self, name: str, busy: bool = False) -> None:
        self.name, self.busy, self.was_shed = name, busy, False

    def sheddable(self) -> bool:
        return not self.busy

    def shed(self) -> None:
        assert not self.was_shed
        self.was_shed = True

    def __repr__(self) -> str:
        return self.name


def test_the_gate_counts_per_listener_and_per_address_and_names_the_bound():
    refused: list[tuple[str, str]] = []
    gate = ConnectionGate("data", 3, 2, on_refused=lambda *key: refused.append(key))
    a1, a2 = Conn("a1", busy=True), Conn("a2", busy=True)
    assert gate.admit("a", a1) is None and gate.admit("a", a2) is None
    assert gate.admit("a", Conn("a3")) == "max_connections_per_client"
    assert gate.admit("b", Conn("b1", busy=True)) is None
    assert gate.admit("c", Conn("c1")) == "max_connections"  # full of busy connections: nothing to shed
    gate.release("a", a1)
    gate.release("a", a1)  # a second release (or one of a connection never counted) changes nothing
    gate.release("z", Conn("z1"))
    assert gate.admit("c", Conn("c1")) is None and gate.by_client == {"a": 1, "b": 1, "c": 1} and gate.open == 3
    assert refused == [("data", "max_connections_per_client"), ("data", "max_connections")]
    assert "SANDBOX_GATEWAY_MAX_CONNECTIONS_PER_CLIENT" in gate.refusal("max_connections_per_client")


def test_a_full_listener_sheds_the_oldest_idle_connection_of_the_address_holding_the_most():
    """Eight addresses can fill a listener that bounds each to an eighth: a ninth still gets in, at the
    expense of whoever holds the most, and only an idle connection of theirs; the spread only gets fairer."""
    shed: list[str] = []
    gate = ConnectionGate("data", 8, 4, on_shed=shed.append)
    a = [Conn("a0", busy=True), Conn("a1"), Conn("a2"), Conn("a3")]
    b = [Conn("b0"), Conn("b1"), Conn("b2")]
    for conn in a:
        assert gate.admit("a", conn) is None
    for conn in b:
        assert gate.admit("b", conn) is None
    victim = Conn("v0")
    assert gate.admit("v", victim) is None and gate.open == 8  # full now
    victim2 = Conn("v1")
    assert gate.admit("v", victim2) is None  # a holds 4, v 1: a's oldest idle one goes (a0 is busy)
    assert [c.name for c in a + b if c.was_shed] == ["a1"] and shed == ["data"] and gate.open == 8
    assert gate.by_client == {"a": 3, "b": 3, "v": 2}
    assert gate.admit("a", Conn("a4")) == "max_connections"  # a holds the most: it pushes nobody out
    assert gate.admit("b", Conn("b3")) == "max_connections"  # 3 against 3: a swap would be no fairer
    assert gate.admit("c", Conn("c0")) is None  # 0 against 3: b (first to hold 3) loses its oldest
    assert [c.name for c in a + b if c.was_shed] == ["a1", "b0"] and gate.by_client == {"a": 3, "b": 2, "v": 2, "c": 1}
    gate.release("a", a[1])  # a shed connection's own close, later, frees nothing more
    assert gate.open == 8
    assert gate.admit("d", Conn("d0")) is None  # a holds the most now: its oldest idle one goes
    assert {c.name for c in a + b if c.was_shed} == {"a1", "b0", "a2"}
    assert gate.by_client == {"a": 2, "b": 2, "v": 2, "c": 1, "d": 1}
    for conn in [*a, *b, victim, victim2]:
        conn.busy = True
    assert gate.admit("e", Conn("e0")) == "max_connections"  # every connection of the 2-holders is busy
    assert len(shed) == 3


def test_the_search_for_an_idle_connection_is_bounded():
    gate = ConnectionGate("grpc", SHED_SCAN + 1, SHED_SCAN + 1)
    busy = [Conn(f"a{i}", busy=True) for i in range(SHED_SCAN)]
    for conn in busy:
        assert gate.admit("a", conn) is None
    idle = Conn("a-last")
    assert gate.admit("a", idle) is None
    assert gate.admit("b", Conn("b0")) == "max_connections"  # its idle one lies past the bound of the search
    gate.release("a", busy[0])
    assert gate.admit("a", busy[0]) is None  # now the idle one is the SHED_SCAN-th looked at (oldest first)
    assert gate.admit("b", Conn("b0")) is None and idle.was_shed


@pytest.mark.parametrize(("settings", "limit", "expected"), [
    pytest.param((None, None), 20_000, (4_000, 500), id="derived from a 20,000 descriptor limit"),
    pytest.param((None, None), 1_024, (204, 25), id="a small limit still leaves a reserve"),
    pytest.param((100, None), 20_000, (100, 16), id="per client never below 16"),
    pytest.param((100, 500), 20_000, (100, 100), id="per client never above the total"),
])
def test_bounds_default_to_shares_of_the_descriptor_limit(settings, limit, expected):
    assert connection_bounds(*settings, limit=limit) == expected


# -- a whole gateway ----------------------------------------------------------------------------------------

class Hang:
    """The sandbox's /hang: requests wait there (in flight) until :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = 0

    async def handler(self, _: web.Request) -> web.Response:
        self.waiting += 1
        await self.release.wait()
        return web.Response(text="served late")


@pytest.fixture
def hang() -> Hang:
    return Hang()


@pytest.fixture
async def gateway(tmp_path: Path, request: pytest.FixtureRequest, hang: Hang) -> AsyncIterator[Any]:
    """A gateway whose sandbox answers HTTP (a plain aiohttp app) and gRPC (the echo service)."""
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="served")

    app = web.Application()
    app.router.add_get("/hang", hang.handler)
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


async def read_head(sock: socket.socket) -> bytes:
    """A response head (the connection stays open: keep-alive)."""
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    data = b""
    async with asyncio.timeout(WAIT):
        while b"\r\n\r\n" not in data:
            chunk = await loop.sock_recv(sock, 65536)
            assert chunk, f"closed after {data!r}"
            data += chunk
    return data


async def until(condition: Any) -> None:
    async with asyncio.timeout(WAIT):
        while not condition():
            await asyncio.sleep(0.01)


@pytest.mark.parametrize("gateway", [{"max_connections": 10, "max_connections_per_client": 5}], indirect=True)
async def test_the_data_plane_refuses_past_its_bounds_and_a_full_port_sheds_an_idle_connection(gateway, hang):
    """Two addresses fill the port: one with requests in flight, one with idle connections. A victim's new
    connection from a third is served: the idle connection the longest open of an address holding the most is
    closed for it, a request in flight never is. An address holding the most is refused (503 naming the bound)."""
    data = gateway.data_address
    gate = gateway.data_plane.gate
    busy = [connect_from("127.0.0.2", data) for _ in range(5)]
    held = list(busy)
    try:
        for sock in busy:
            sock.sendall(b"GET /hang HTTP/1.1\r\nHost: 127.0.0.1\r\nX-User-Id: busy\r\nX-Session-Id: b1\r\n\r\n")
        await until(lambda: hang.waiting == 5)
        idle = [connect_from("127.0.0.3", data) for _ in range(5)]
        held += idle
        await until(lambda: gate.open == 10)  # full
        over = connect_from("127.0.0.3", data)
        answer = await read_all(over)
        over.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 "), answer[:200]
        assert b"\r\nRetry-After: " in head and b"Connection: close" in head
        error = json.loads(body)["error"]
        assert error["code"] == "too_many_connections" and "max_connections_per_client" in error["message"]

        connector = aiohttp.TCPConnector(local_addr=("127.0.0.9", 0))  # keep-alive: it stays counted
        async with aiohttp.ClientSession(connector=connector) as victim:
            await served(f"http://{data[0]}:{data[1]}/", victim, "a new connection to a full port")
            assert await read_all(idle[0]) == b""  # shed: closed between requests, nothing written
            assert gate.by_client == {b"127.0.0.2": 5, b"127.0.0.3": 4, b"127.0.0.9": 1}

            again = connect_from("127.0.0.3", data)  # 4 against 5: pushing out another would be no fairer
            answer = await read_all(again)
            again.close()
            assert answer.startswith(b"HTTP/1.1 503 ") and b"(max_connections," in answer, answer[:300]
            async with aiohttp.ClientSession() as control:  # the control API is not the data plane's to fill
                host, port = gateway.control_address
                for path in ("/healthz", "/readyz", "/metrics"):
                    async with control.get(f"http://{host}:{port}{path}") as response:
                        assert response.status == 200, path
            hang.release.set()
            for sock in busy:  # none of the requests in flight was cut
                assert (await read_head(sock)).startswith(b"HTTP/1.1 200 ")
        assert refused_count(gateway, "data", "max_connections_per_client") == 1
        assert refused_count(gateway, "data", "max_connections") == 1
        assert gateway.metrics.registry.get_sample_value("sgw_connections_shed_total", {"listener": "data"}) == 1
    finally:
        for sock in held:
            drop(sock)


@pytest.mark.parametrize("gateway", [{"max_connections": 6, "max_connections_per_client": 3}], indirect=True)
async def test_the_grpc_front_refuses_past_its_bounds_and_a_full_port_sheds_an_idle_connection(gateway):
    """The same on the gRPC front: a connection with a call open is never shed, one that never sent its preface
    is (GOAWAY NO_ERROR), and past a bound the newcomer gets GOAWAY ENHANCE_YOUR_CALM naming it."""
    address = gateway.grpc_address
    gate = gateway.grpc_front.gate
    busy: list[RawConnection] = []
    held: list[socket.socket] = []
    try:
        for stream in range(3):
            conn = RawConnection(connect_from("127.0.0.3", address), address)
            conn.sock.setblocking(False)
            busy.append(conn)
            held.append(conn.sock)
            await conn.handshake()
            await conn.send(conn.head(1))  # a call open, its message not sent yet
        await until(lambda: all(c.streams for c in gateway.grpc_front.connections))
        idle = [connect_from("127.0.0.2", address) for _ in range(3)]
        held += idle
        await until(lambda: gate.open == 6)  # full
        over = RawConnection(connect_from("127.0.0.2", address), address)
        over.sock.setblocking(False)
        end = await over.ending()
        over.close()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.ENHANCE_YOUR_CALM, describe(end)
        assert b"max_connections_per_client" in end.additional_data

        victim = await RawConnection.open(address)  # from 127.0.0.1, to a full port
        try:
            await victim.unary()
        finally:
            victim.close()
        shed = RawConnection(idle[0], address)
        shed.sock.setblocking(False)
        end = await shed.ending()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.NO_ERROR, describe(end)
        assert b"max_connections" in end.additional_data

        await until(lambda: gate.open == 5)  # the victim has gone
        held.append(connect_from("127.0.0.4", address))  # 6 of 6 again
        await until(lambda: gate.open == 6)
        again = RawConnection(connect_from("127.0.0.2", address), address)  # 2 against 3: no fairer
        again.sock.setblocking(False)
        end = await again.ending()
        again.close()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.ENHANCE_YOUR_CALM, describe(end)
        assert b"(max_connections," in end.additional_data
        for conn in busy:  # the calls open all along are answered
            await conn.send(DataFrame(1, grpc_message(b"late"), flags=["END_STREAM"]))
            end = await conn.finish(1)
            assert end is not None and "END_STREAM" in end.flags and conn.bodies[1].endswith(b"late"), describe(end)
        metrics = gateway.metrics.registry
        assert metrics.get_sample_value("sgw_grpc_connections_closed_total", {"reason": "max_connections"}) == 1
        assert metrics.get_sample_value("sgw_grpc_connections_closed_total", {"reason": "shed"}) == 1
        assert metrics.get_sample_value("sgw_connections_shed_total", {"listener": "grpc"}) == 1
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


def test_a_refusal_is_the_documented_error_rendered_once_with_each_connections_own_request_id() -> None:
    """A refused connection's answer is made once per message (a flood is refused thousands of times a second)
    but is byte for byte the error every other refusal path renders, with that connection's own request ID."""
    message = "too many connections: this port may hold 10 (max_connections, SANDBOX_GATEWAY_MAX_CONNECTIONS)"
    first, second = refusal_response(message, b"r-1"), refusal_response(message, b"r-22")
    assert first == error_response(TooManyConnections(message), b"r-1", close=True)
    assert second == error_response(TooManyConnections(message), b"r-22", close=True)
    assert b"X-Request-Id: r-22\r\n" in second and b"r-1" not in second
