"""The data plane's HTTP/1.1 wire contract, over real loopback sockets.

Fake sandboxes are aiohttp servers with one inline handler per test (or raw
asyncio servers where the test needs byte control); the resolver is a
hand-written fake. Tests where it matters run with both resolver flavours
(with and without the synchronous cache path). Failures: test_proxy_errors.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from gateway.model import Endpoint, Route
from routing import Identity
from tests.proxy_helpers import (
    CachingFakeResolver,
    FakeResolver,
    answers,
    backend,
    echo_headers,
    eventually,
    identity_headers,
    raw_backend,
    raw_client,
    read_head,
    read_response,
    request_bytes,
    resolver_class,
    start_gateway,
)

__all__ = ["resolver_class", "start_gateway"]  # fixtures




# -- bodies ---------------------------------------------------------------------------
async def _echo(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    if request.query.get("chunked"):
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for i in range(0, len(body), 100_000):
            await response.write(body[i:i + 100_000])
        await response.write_eof()
        return response
    return web.Response(body=body, headers={"X-Body-Sha": hashlib.sha256(body).hexdigest()})


@pytest.mark.parametrize("size", [0, 1, 65_537, 8 * 1024 * 1024])
@pytest.mark.parametrize("framing", ["length", "chunked"])
async def test_bodies_round_trip_byte_exact(aiohttp_server, start_gateway, resolver_class, size, framing) -> None:
    gw = await start_gateway(resolver_class(await backend(aiohttp_server, _echo)))
    body = os.urandom(size)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 300_001):
            yield body[i:i + 300_001]

    data = chunks() if framing == "chunked" else io.BytesIO(body)
    params = {"chunked": "1"} if framing == "chunked" else {}
    async with aiohttp.ClientSession() as client, \
            client.post(f"{gw.url}/echo", data=data, params=params, headers=identity_headers()) as response:
        assert response.status == 200, (response.status, await response.text())
        if framing == "chunked":
            assert response.headers.get("Transfer-Encoding") == "chunked" or size == 0
        got = await response.read()
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(body).hexdigest()
    record = gw.records[-1]
    assert record.bytes_in == size
    # Response bytes are counted as forwarded: a chunked body with its chunk framing.
    assert record.bytes_out == size if framing == "length" else record.bytes_out >= size


async def test_path_and_query_forwarded_byte_for_byte(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)))
    async with aiohttp.ClientSession() as client, \
            client.get(URL(f"{gw.url}/a%2Fb?x=%20", encoded=True), headers=identity_headers()) as response:
        assert (await response.json())["raw_path"] == "/a%2Fb?x=%20"


async def test_any_method_is_forwarded(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)))
    async with aiohttp.ClientSession() as client:
        for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND"):
            async with client.request(method, f"{gw.url}/x", headers=identity_headers()) as response:
                assert (await response.json())["method"] == method


# -- headers ----------------------------------------------------------------------------
async def test_request_headers_rewritten(aiohttp_server, start_gateway) -> None:
    endpoint = await backend(aiohttp_server, echo_headers)
    gw = await start_gateway(FakeResolver(endpoint, sandbox_id="ses-abc"))
    headers = identity_headers(**{"X-Org-Id": "org-1", "X-Bot-Id": "bot-1", "Authorization": "Bearer secret",
                                  "Proxy-Authorization": "Basic x", "X-Forwarded-For": "6.6.6.6",
                                  "X-Sandbox-Id": "ses-forged", "X-Custom": "kept", "X-Request-Id": "req-42"})
    async with aiohttp.ClientSession() as client, \
            client.get(f"{gw.url}/h", headers=headers) as response:
        seen = {k.lower(): v for k, v in (await response.json())["headers"].items()}
    for absent in ("x-org-id", "x-user-id", "x-session-id", "x-bot-id", "authorization", "proxy-authorization"):
        assert absent not in seen
    assert seen["x-sandbox-id"] == "ses-abc"
    assert seen["x-forwarded-for"] == "127.0.0.1"  # the inbound one is dropped by default
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == f"127.0.0.1:{gw.port}"
    assert seen["host"] == f"127.0.0.1:{endpoint.port}"
    assert seen["x-custom"] == "kept"
    assert seen["x-request-id"] == "req-42"
    assert gw.records[-1].request_id == "req-42"
    assert response.headers.getall("X-Request-Id") == ["req-42"]  # echoed, so a client can quote it


async def test_trusted_forwarded_for_is_appended_to(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), trust_forwarded_for=True)
    async with aiohttp.ClientSession() as client, \
            client.get(f"{gw.url}/h", headers=identity_headers(**{"X-Forwarded-For": "10.0.0.9"})) as response:
        assert (await response.json())["headers"]["X-Forwarded-For"] == "10.0.0.9, 127.0.0.1"


async def test_hop_by_hop_and_connection_named_headers_dropped(start_gateway) -> None:
    seen: dict[bytes, bytes] = {}

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_head(reader)
        seen.update(headers)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive, X-Hop-Resp\r\n"
                     b"Keep-Alive: timeout=5\r\nX-Hop-Resp: secret\r\nProxy-Connection: x\r\nX-End: 1\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with raw_backend(handler) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes("GET", "/", {**identity_headers(), "Connection": "keep-alive, X-Secret",
                                                    "X-Secret": "1", "Keep-Alive": "300", "TE": "trailers",
                                                    "Trailer": "X-T", "Upgrade": "h2c", "X-Kept": "yes"}))
            status, headers, body = await read_response(reader)
    assert status == 200 and body == b"ok"
    for name in (b"x-secret", b"keep-alive", b"te", b"trailer", b"upgrade", b"x-user-id", b"x-session-id"):
        assert name not in seen, name
    assert seen[b"x-kept"] == b"yes"
    assert seen.get(b"connection") is None
    for name in (b"x-hop-resp", b"keep-alive", b"proxy-connection", b"connection"):
        assert name not in headers, name
    assert headers[b"x-end"] == b"1"


async def test_a_sandbox_request_id_is_kept_not_doubled(start_gateway) -> None:
    async with raw_backend(answers(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nx-request-id: from-sandbox\r\n\r\nok")) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes("GET", "/", {**identity_headers(), "X-Request-Id": "from-client"}))
            head = (await reader.readuntil(b"\r\n\r\n")).lower()
    assert head.startswith(b"http/1.1 200 ") and head.count(b"x-request-id:") == 1
    assert b"x-request-id: from-sandbox\r\n" in head


async def test_request_id_generated_when_absent_or_insane(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)))
    ids = []
    async with aiohttp.ClientSession() as client:
        for extra in ({}, {"X-Request-Id": "bad id with spaces"}, {"X-Request-Id": "x" * 129}):
            async with client.get(f"{gw.url}/", headers=identity_headers(**extra)) as response:
                seen = {k.lower(): v for k, v in (await response.json())["headers"].items()}
                ids.append(seen["x-request-id"])
                assert response.headers["X-Request-Id"] == seen["x-request-id"]
    assert len(set(ids)) == 3
    assert all(" " not in i and len(i) <= 128 for i in ids)
    assert [r.request_id for r in gw.records] == ids


# -- connection management ----------------------------------------------------------------------
async def test_upstream_keep_alive_reuses_connections(start_gateway, resolver_class) -> None:
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_head(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async with raw_backend(keep_alive) as be:
        gw = await start_gateway(resolver_class(be.endpoint))
        async with aiohttp.ClientSession() as client:
            for _ in range(20):
                async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                    assert await response.read() == b"ok"
        assert be.connections == 1


async def test_non_keep_alive_upstream_response_is_not_reused(start_gateway) -> None:
    async def closes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()

    async with raw_backend(closes) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            for _ in range(3):
                writer.write(request_bytes(headers=identity_headers()))
                status, headers, body = await read_response(reader)
                assert (status, body) == (200, b"ok") and b"connection" not in headers  # client stays keep-alive
        assert be.connections == 3


async def test_pipelined_requests_answered_in_order(aiohttp_server, start_gateway, resolver_class) -> None:
    async def path(request: web.Request) -> web.Response:
        if request.path == "/slow":
            await asyncio.sleep(0.05)
        return web.Response(text=request.path + ":" + (await request.text()))

    gw = await start_gateway(resolver_class(await backend(aiohttp_server, path)))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes("GET", "/slow", identity_headers())
                     + request_bytes("POST", "/post", identity_headers(), body=b"data")
                     + request_bytes("GET", "/third", identity_headers()))
        bodies = [(await read_response(reader))[2] for _ in range(3)]
    assert bodies == [b"/slow:", b"/post:data", b"/third:"]


async def test_expect_100_continue(aiohttp_server, start_gateway) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo)))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"PUT /f HTTP/1.1\r\nHost: g\r\nX-User-Id: u\r\nX-Session-Id: s\r\nContent-Length: 5\r\n"
                     b"Expect: 100-continue\r\n\r\n")
        line, _ = await read_head(reader)
        assert line == b"HTTP/1.1 100 Continue"
        writer.write(b"hello")
        status, _, body = await read_response(reader)
    assert (status, body) == (200, b"hello")


@pytest.mark.parametrize(("method", "status"), [("HEAD", 200), ("GET", 204), ("GET", 304)])
async def test_head_204_304_have_no_body(aiohttp_server, start_gateway, method, status) -> None:
    async def handler(request: web.Request) -> web.Response:
        if status == 200:
            return web.Response(body=b"a body that must not be sent for HEAD")
        return web.Response(status=status)

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, handler)))
    async with raw_client(gw.port) as (reader, writer):
        for _ in range(2):  # the same client and upstream connections stay usable
            writer.write(request_bytes(method, "/", identity_headers()))
            got, headers, body = await read_response(reader, head_request=method == "HEAD")
            assert got == status and body == b""
            if method == "HEAD":
                assert headers[b"content-length"] == b"37"
        writer.write(request_bytes("GET", "/after", identity_headers()))
        got, _, _ = await read_response(reader)
        assert got == status
        writer.write_eof()
        assert await reader.read() == b""  # nothing stray was sent


async def test_trailer_header_and_trailers_reach_the_client(start_gateway) -> None:
    """Trailer is not hop-by-hop (RFC 9110): the head announcing the trailer fields keeps it."""
    response = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
                b"5\r\nhello\r\n0\r\nX-Checksum: 5d41402a\r\n\r\n")
    async with raw_backend(answers(response)) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes(headers=identity_headers()))
            _, headers = await read_head(reader)
            body = await reader.readuntil(b"0\r\nX-Checksum: 5d41402a\r\n\r\n")
    assert headers[b"trailer"] == b"X-Checksum"
    assert body == b"5\r\nhello\r\n0\r\nX-Checksum: 5d41402a\r\n\r\n"


async def test_absolute_form_target_goes_upstream_in_origin_form(start_gateway) -> None:
    """RFC 9112 3.2.2: a proxy-style target (``GET http://host/x``) reaches the sandbox as ``/x``, and its
    authority replaces Host (forwarded as X-Forwarded-Host only)."""
    seen: list[tuple[bytes, dict[bytes, bytes]]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_head(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with raw_backend(record) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(b"GET http://App.example:8080/x/y?z=1 HTTP/1.1\r\nHost: other\r\n"
                         b"X-User-Id: u\r\nX-Session-Id: s\r\n\r\n")
            assert (await read_response(reader)).status == 204
    line, headers = seen[0]
    assert line == b"GET /x/y?z=1 HTTP/1.1"
    assert headers[b"x-forwarded-host"] == b"App.example:8080" and headers[b"host"].startswith(b"127.0.0.1:")


class SameRoutes(CachingFakeResolver):
    """A cache that gives a session the same Route object every time, as the session layer's does."""

    def __init__(self, endpoint: Endpoint) -> None:
        super().__init__(endpoint)
        self.routes: dict[str, Route] = {}

    def _route(self, identity: Identity) -> Route:
        route = self.routes.get(identity.session_id)
        if route is None:
            route = self.routes[identity.session_id] = super()._route(identity)
        return route


async def test_each_request_on_a_connection_gets_its_own_forwarded_host_and_sandbox(start_gateway) -> None:
    """The lines a head gains per route and client are kept for a connection's next requests (while the
    route object and the Host repeat): a request with another Host, or another session (another sandbox),
    on the same connection is forwarded with its own X-Forwarded-Host and X-Sandbox-Id, and going back
    gives the first ones again."""
    seen: list[dict[bytes, bytes]] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append((await read_head(reader))[1])
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    sent = [("a.example", "s1"), ("b.example", "s1"), ("b.example", "s2"), ("a.example", "s1")]
    async with raw_backend(record) as be:
        resolver = SameRoutes(be.endpoint)
        resolver.route_to("s2", be.endpoint, sandbox_id="ses-two")
        gw = await start_gateway(resolver)
        async with raw_client(gw.port) as (reader, writer):
            for host, session in sent:
                writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\nX-User-Id: u1\r\nX-Session-Id: {session}\r\n\r\n"
                             .encode())
                assert (await read_response(reader)).status == 200
    assert [(h[b"x-forwarded-host"], h[b"x-sandbox-id"]) for h in seen] == [
        (b"a.example", b"ses-test"), (b"b.example", b"ses-test"), (b"b.example", b"ses-two"),
        (b"a.example", b"ses-test")]
    assert len({h[b"x-request-id"] for h in seen}) == len(sent)
    assert all(h[b"x-forwarded-for"] == b"127.0.0.1" and h[b"x-forwarded-proto"] == b"http" for h in seen)


async def test_http10_client_gets_close_delimited_body(start_gateway) -> None:
    chunked = answers(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    async with raw_backend(chunked) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes(headers=identity_headers(), version="1.0"))
            data = await reader.read()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
    assert body == b"hello world"


async def test_upstream_close_delimited_body_is_rechunked(start_gateway) -> None:
    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it")

    async with raw_backend(until_close) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            for _ in range(2):
                writer.write(request_bytes(headers=identity_headers()))
                status, headers, body = await read_response(reader)
                assert (status, body) == (200, b"all of it")
                assert headers[b"transfer-encoding"] == b"chunked"


async def test_sessions_never_cross(aiohttp_server, start_gateway, resolver_class) -> None:
    def answer(name: str):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.Response:
            await asyncio.sleep(0)
            return web.Response(text=name)
        return handler

    resolver = resolver_class()
    for name in ("a", "b"):
        resolver.route_to(name, await backend(aiohttp_server, answer(name)), sandbox_id=f"ses-{name}")
    gw = await start_gateway(resolver)

    async def hammer(client: aiohttp.ClientSession, session: str) -> None:
        for _ in range(50):
            async with client.get(f"{gw.url}/", headers=identity_headers(session)) as response:
                assert await response.text() == session

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=20)) as client:
        await asyncio.gather(*(hammer(client, session) for session in ["a", "b"] * 10))
    assert {(r.sandbox_id, r.status) for r in gw.records} == {("ses-a", 200), ("ses-b", 200)}


async def test_an_answer_of_the_gateways_own_counts_its_body(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, _echo)))
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/x") as response:  # no identity: 400
        body = await response.read()
    assert response.status == 400 and body
    assert (gw.records[-1].status, gw.records[-1].bytes_out) == (400, len(body))


async def test_request_log_record(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, _echo), sandbox_id="ses-r", pool="p"))
    async with aiohttp.ClientSession() as client, \
            client.put(f"{gw.url}/x", data=b"12345", headers=identity_headers()) as response:
        await response.read()
    record = gw.records[-1]
    assert (record.method, record.pool, record.sandbox_id, record.status, record.protocol, record.error) == \
        ("PUT", "p", "ses-r", 200, "http", None)
    assert (record.bytes_in, record.bytes_out) == (5, 5)
    assert 0 < record.duration < 5
    assert gw.plane.in_flight == 0


async def test_stop_drains_in_flight_requests(aiohttp_server, start_gateway) -> None:
    release = asyncio.Event()
    arrived = asyncio.Event()

    async def waits(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()
        return web.Response(text="finished")

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, waits)))
    async with aiohttp.ClientSession() as client:
        pending = asyncio.ensure_future(client.get(f"{gw.url}/", headers=identity_headers()))
        await arrived.wait()
        stopping = asyncio.ensure_future(gw.plane.stop(5))
        await asyncio.sleep(0.05)
        assert not stopping.done() and gw.plane.in_flight == 1
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.get(f"{gw.url}/", headers=identity_headers(), raise_for_status=False)
        release.set()
        async with await pending as response:
            assert await response.text() == "finished"
        await stopping
    assert gw.plane.in_flight == 0


# -- bodies and early answers ------------------------------------------------------------------
async def test_body_read_while_resolving_is_forwarded_in_order(aiohttp_server, start_gateway) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await request.read())

    resolver = FakeResolver(await backend(aiohttp_server, echo))
    resolver.gate = asyncio.Event()  # the sandbox is still being created while the body arrives
    gw = await start_gateway(resolver)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"POST / HTTP/1.1\r\nHost: g\r\nX-User-Id: u\r\nX-Session-Id: s\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\nhello\r\n")
        await eventually(lambda: resolver.resolves == 1)
        writer.write(b"6\r\n world\r\n0\r\n\r\n")
        resolver.gate.set()
        status, _, body = await read_response(reader)
    assert (status, body) == (200, b"hello world")


async def test_http10_keep_alive_client(aiohttp_server, start_gateway) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, ok)))
    async with raw_client(gw.port) as (reader, writer):
        for _ in range(2):
            writer.write(request_bytes(headers={**identity_headers(), "Connection": "keep-alive"}, version="1.0"))
            status, headers, body = await read_response(reader)
            assert (status, body, headers[b"connection"]) == (200, b"ok", b"keep-alive")


async def test_interim_responses_are_not_forwarded(start_gateway) -> None:
    async def early_hints(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
        await writer.drain()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nbody")
        await writer.drain()
        await reader.read()

    async with raw_backend(early_hints) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes(headers=identity_headers()))
            status, _, body = await read_response(reader)
    assert (status, body) == (200, b"body")


async def test_idle_pooled_connections_expire(start_gateway) -> None:
    closed_by_gateway = asyncio.Event()

    async def serves_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        if await reader.read() == b"":
            closed_by_gateway.set()

    async with raw_backend(serves_one) as be:
        gw = await start_gateway(FakeResolver(be.endpoint), upstream_keepalive_timeout=0.2)
        async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
            assert await response.read() == b"ok"
        await asyncio.wait_for(closed_by_gateway.wait(), 5)
        assert not any(pool.idle for pool in gw.plane.pools.values())


async def test_pool_keeps_at_most_its_size(start_gateway) -> None:
    release = asyncio.Event()

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_head(reader)
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async with raw_backend(slow) as be:
        gw = await start_gateway(FakeResolver(be.endpoint), upstream_pool_size=2)
        async with aiohttp.ClientSession() as client:
            async def get() -> None:
                async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                    assert await response.read() == b"ok"

            pending = [asyncio.ensure_future(get()) for _ in range(5)]
            await eventually(lambda: be.connections == 5)
            release.set()
            await asyncio.gather(*pending)
        assert [len(pool.idle) for pool in gw.plane.pools.values()] == [2]


async def test_client_half_close_still_gets_its_response(aiohttp_server, start_gateway) -> None:
    async def slow_ok(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)
        return web.Response(text="answered")

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, slow_ok)))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(headers=identity_headers()))
        writer.write_eof()
        status, _, body = await read_response(reader)
        assert (status, body) == (200, b"answered")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # and then the gateway closes


async def test_upstream_transfer_coding_without_chunked_reads_until_close(start_gateway) -> None:
    async def gzip_until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nnot really gzip")

    async with raw_backend(gzip_until_close) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes(headers=identity_headers()))
            data = await asyncio.wait_for(reader.read(), 5)
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: gzip" in head and b"Connection: close" in head
    assert body == b"not really gzip"
