"""Shared pieces for the data-plane tests: a hand-written resolver, a gateway launcher, raw HTTP helpers."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import re
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest
from aiohttp import web

from gateway.app import plane_options
from gateway.errors import GatewayError
from gateway.limits import OrgLimits
from gateway.model import Endpoint, Owner, Route
from gateway.proxy import DataPlane, RequestLog
from gateway.settings import Settings
from routing import Identity

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Small retry/backoff numbers keep failure tests fast.
TEST_SETTINGS = {
    "upstream_connect_retries": 1,
    "upstream_connect_backoff": 0.01,
    "upstream_connect_timeout": 2.0,
}


def identity_headers(session: str = "s1", user: str = "u1", **extra: str) -> dict[str, str]:
    return {"X-User-Id": user, "X-Session-Id": session, **extra}


class FakeResolver:
    """Sessions to endpoints; records what the data plane tells it."""

    def __init__(self, endpoint: Endpoint | None = None, *, sandbox_id: str = "ses-test", pool: str = "small") -> None:
        self.default = endpoint
        self.endpoints: dict[str, Endpoint] = {}
        self.sandbox_ids: dict[str, str] = {}
        self.sandbox_id = sandbox_id
        self.pool = pool
        self.error: GatewayError | None = None
        self.moves: dict[str, Endpoint] = {}      # session -> endpoint after invalidate(session)
        self.invalidated: list[str] = []
        self.opened: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()
        self.resolves = 0
        self.gate: asyncio.Event | None = None    # when set up, resolve waits for it (slow sandbox creation)

    def route_to(self, session: str, endpoint: Endpoint, sandbox_id: str | None = None) -> None:
        self.endpoints[session] = endpoint
        if sandbox_id is not None:
            self.sandbox_ids[session] = sandbox_id

    def _route(self, identity: Identity) -> Route:
        if self.error is not None:
            raise self.error
        endpoint = self.endpoints.get(identity.session_id, self.default)
        assert endpoint is not None, f"no endpoint for session {identity.session_id}"
        sandbox_id = self.sandbox_ids.get(identity.session_id, self.sandbox_id)
        return Route(identity.session_id, sandbox_id, self.pool, endpoint, Owner.of(identity))

    def cached_route(self, identity: Identity, owned: Route | None = None) -> Route | None:
        return None  # no cache: every request resolves in a task

    async def resolve(self, identity: Identity) -> Route:
        self.resolves += 1
        if self.gate is not None:
            await self.gate.wait()
        return self._route(identity)

    def invalidate(self, key: str) -> None:
        self.invalidated.append(key)
        if key in self.moves:
            self.endpoints[key] = self.moves.pop(key)

    async def unreachable(self, route: Route) -> None:
        self.invalidate(route.session_id)

    def stream_opened(self, sandbox_id: str) -> None:
        self.opened[sandbox_id] += 1

    def stream_closed(self, sandbox_id: str) -> None:
        self.closed[sandbox_id] += 1


class CachingFakeResolver(FakeResolver):
    """Also answers synchronously from its "cache", like SessionRouter's fast path."""

    def cached_route(self, identity: Identity, owned: Route | None = None) -> Route | None:
        if self.gate is not None:
            return None
        return self._route(identity)


@dataclass
class Gateway:
    plane: DataPlane
    port: int
    records: list[RequestLog] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway() -> AsyncIterator[StartGateway]:
    """Start data planes in front of test resolvers; all stopped at teardown."""
    async with gateways() as start:
        yield start


@pytest.fixture(params=[FakeResolver, CachingFakeResolver], ids=["task-path", "cached-path"])
def resolver_class(request: pytest.FixtureRequest) -> type[FakeResolver]:
    """Both ways the data plane reaches a route: a task per request, or the resolver's sync cache."""
    return request.param  # type: ignore[no-any-return]


async def backend(aiohttp_server, handler, path: str = "/{tail:.*}") -> Endpoint:  # type: ignore[no-untyped-def]
    """A fake sandbox: an aiohttp test server with one handler."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", path, handler)
    server = await aiohttp_server(app)
    return Endpoint("127.0.0.1", server.port)


async def echo_headers(request: web.Request) -> web.Response:
    return web.json_response({"headers": dict(request.headers), "raw_path": request.raw_path,
                              "method": request.method})


async def ws_echo(request: web.Request) -> web.WebSocketResponse:
    """A WebSocket sandbox handler that echoes every text frame."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for msg in ws:
        await ws.send_str(msg.data)
    return ws


def listening_socket(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def aiohttp_backend(handler: Callable[..., Awaitable[object]]) -> AsyncIterator[Endpoint]:
    """An aiohttp fake sandbox on any event loop (the aiohttp_server fixture is tied to pytest's loop)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = listening_socket()
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    try:
        yield Endpoint("127.0.0.1", port)
    finally:
        await runner.cleanup()


_HELD: dict[int, socket.socket] = {}
atexit.register(lambda: [sock.close() for sock in _HELD.values()])


def dead_port() -> int:
    """A port nothing listens on: bound and never listening, and held until the test process exits
    (or ``release_port``), so connecting is refused and no listener (a gateway's own ports, chosen by
    the kernel) takes it meanwhile."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    _HELD[port] = sock
    return port


def release_port(port: int) -> None:
    """Let a test's own server bind a ``dead_port`` after all."""
    _HELD.pop(port).close()


@contextlib.asynccontextmanager
async def gateways() -> AsyncIterator[StartGateway]:
    planes: list[DataPlane] = []

    async def start(resolver: FakeResolver, *, long_request_after: float = 10.0, **overrides: object) -> Gateway:
        settings = Settings(**{**TEST_SETTINGS, **overrides})  # type: ignore[arg-type]
        sock = listening_socket()
        port = sock.getsockname()[1]
        plane = DataPlane(resolver, plane_options(settings), limits=OrgLimits.from_settings(settings),
                          long_request_after=long_request_after)  # type: ignore[arg-type]
        gateway = Gateway(plane, port)
        gateway.plane.on_request = gateway.records.append
        await gateway.plane.start(sock)
        planes.append(gateway.plane)
        return gateway

    try:
        yield start
    finally:
        for plane in planes:
            await plane.stop(0.5)


# -- raw sockets -------------------------------------------------------------------
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class RawBackend:
    port: int
    connections: int = 0

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("127.0.0.1", self.port)


@contextlib.asynccontextmanager
async def raw_backend(handler: Handler) -> AsyncIterator[RawBackend]:
    """A loopback server whose connection handler gets the raw byte streams."""
    backend = RawBackend(0)
    writers: set[asyncio.StreamWriter] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend.connections += 1
        writers.add(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, limit=1 << 20)
    backend.port = server.sockets[0].getsockname()[1]
    try:
        yield backend
    finally:
        server.close()
        for writer in list(writers):
            writer.transport.abort()
        await server.wait_closed()


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
    """One message head: (start line, {lower-cased name: value})."""
    head = await reader.readuntil(b"\r\n\r\n")
    line, *lines = head[:-4].split(b"\r\n")
    headers: dict[bytes, bytes] = {}
    for raw in lines:
        name, _, value = raw.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return line, headers


def answers(response: bytes) -> Handler:
    """A raw sandbox: reads one request head, sends ``response`` as given, keeps the connection open."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(response)
        await writer.drain()
        await reader.read()

    return handler


class RawResponse(NamedTuple):
    """A response read off a raw socket; unpacks as ``status, headers, body``."""

    status: int
    headers: dict[bytes, bytes]   # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, *, head_request: bool = False) -> RawResponse:
    """A full response (Content-Length, chunked, or until close)."""
    line, headers = await read_head(reader)
    assert re.match(rb"HTTP/1\.[01] \d{3}\b", line), f"not an HTTP response: {line[:300]!r}"
    status = int(line.split()[1])
    if head_request or status in (204, 304) or 100 <= status < 200:
        return RawResponse(status, headers, b"")
    if b"content-length" in headers:
        return RawResponse(status, headers, await reader.readexactly(int(headers[b"content-length"])))
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        return RawResponse(status, headers, await read_chunked(reader))
    return RawResponse(status, headers, await reader.read())


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked body's payload, through its last chunk (extensions ignored, no trailers expected)."""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


async def closed_by_server(reader: asyncio.StreamReader, timeout: float = 10.0) -> bool:
    """True when the server ends the connection (FIN or reset) within ``timeout`` and sends nothing more."""
    try:
        rest = await asyncio.wait_for(reader.read(), timeout)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    assert rest == b"", f"unexpected bytes after the response: {rest[:300]!r}"
    return True


@contextlib.asynccontextmanager
async def raw_client(port: int) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def request_bytes(method: str = "GET", path: str = "/", headers: dict[str, str] | None = None, body: bytes = b"",
                  version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: gateway.test"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# -- a gateway in its own process (for memory measurements) -------------------------
GATEWAY_PROCESS = """
import asyncio, socket, sys
import uvloop
from gateway.model import Endpoint, Owner, Route
from gateway.proxy import DataPlane

class Fixed:
    def __init__(self, endpoint): self.endpoint = endpoint
    async def resolve(self, identity):
        return Route(identity.session_id, "ses-mem", "small", self.endpoint, Owner.of(identity))
    def cached_route(self, identity, owned=None): return None
    def invalidate(self, key): pass
    async def unreachable(self, route): pass
    def stream_opened(self, sandbox_id): pass
    def stream_closed(self, sandbox_id): pass

async def main():
    sock = socket.socket(); sock.bind(("127.0.0.1", 0)); sock.listen(16); sock.setblocking(False)
    plane = DataPlane(Fixed(Endpoint("127.0.0.1", int(sys.argv[1]))))
    await plane.start(sock)
    print(sock.getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await plane.stop(1)

uvloop.run(main())
"""


@contextlib.asynccontextmanager
async def gateway_process(backend_port: int) -> AsyncIterator[tuple[int, int]]:
    """A gateway in a subprocess in front of ``backend_port``: yields (port, pid). Stops when stdin closes."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", GATEWAY_PROCESS, str(backend_port), cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        port = int(await asyncio.wait_for(proc.stdout.readline(), 20))
        yield port, proc.pid
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for a condition the gateway reaches on its own (a close noticed, a counter settled)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@contextlib.asynccontextmanager
async def sandbox_http(url: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """A client session and base URL for a sandbox endpoint's ``url()``: a confined local sandbox
    answers only on its Unix socket (``unix:<path>``), every other one on TCP."""
    if url.startswith("unix:"):
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=url.removeprefix("unix:"))
        url = "http://sandbox"
    else:
        connector = aiohttp.TCPConnector()
    async with aiohttp.ClientSession(connector=connector) as http:
        yield http, url
