"""The data plane's failure contract: every problem becomes the documented JSON error, never a 500.

Bad identities, resolver errors (capacity, unknown session), unreachable,
slow, vanished or misbehaving sandboxes, malformed requests, and failures after
the response started (which can only cut the connection).
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from gateway.errors import CapacityExceeded, NotFound
from gateway.model import Endpoint
from tests.proxy_helpers import (
    CachingFakeResolver,
    FakeResolver,
    answers,
    backend,
    closed_by_server,
    dead_port,
    echo_headers,
    eventually,
    identity_headers,
    raw_backend,
    raw_client,
    read_head,
    read_response,
    release_port,
    request_bytes,
    resolver_class,
    start_gateway,
)

__all__ = ["resolver_class", "start_gateway"]  # fixtures




# -- identity and resolver errors -----------------------------------------------------------
@pytest.mark.parametrize(("headers", "names"), [
    pytest.param({"X-Session-Id": "s"}, "X-User-Id: is required", id="missing user"),
    pytest.param({"X-User-Id": "u"}, "X-Session-Id: is required", id="missing session"),
    pytest.param({"X-User-Id": "", "X-Session-Id": "s"}, "X-User-Id: must not be empty", id="empty user"),
    pytest.param({"X-User-Id": "u", "X-Session-Id": "s" * 300}, "X-Session-Id: must be at most", id="long session"),
])
async def test_invalid_identity_is_400_naming_the_header(start_gateway, resolver_class, headers, names) -> None:
    gw = await start_gateway(resolver_class(Endpoint("127.0.0.1", dead_port())))
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=headers) as response:
        assert response.status == 400
        body = await response.json()
    assert body["error"]["code"] == "invalid_identity"
    assert body["error"]["message"].startswith(names)
    assert gw.records[-1].status == 400 and gw.records[-1].error is None  # not the sandbox's fault


async def test_duplicate_identity_header_is_400(start_gateway) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"GET / HTTP/1.1\r\nHost: g\r\nX-User-Id: a\r\nX-User-Id: b\r\nX-Session-Id: s\r\n\r\n")
        status, _, body = await read_response(reader)
    assert status == 400
    assert json.loads(body)["error"]["message"] == "X-User-Id: must be given once"


async def test_empty_bot_id_is_absent(aiohttp_server, start_gateway) -> None:
    resolver = CachingFakeResolver(await backend(aiohttp_server, echo_headers))
    seen = []
    original = resolver._route

    def spy(identity):  # type: ignore[no-untyped-def]
        seen.append(identity)
        return original(identity)

    resolver._route = spy  # type: ignore[method-assign]
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client, \
            client.get(f"{gw.url}/", headers=identity_headers(**{"X-Bot-Id": ""})) as response:
        assert response.status == 200
    assert seen[0].bot_id is None


async def test_capacity_exceeded_is_429_with_retry_after(start_gateway, resolver_class) -> None:
    resolver = resolver_class(Endpoint("127.0.0.1", dead_port()))
    resolver.error = CapacityExceeded("pool small is full (400 sandboxes)", scope="pool", retry_after=7)
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 429
        assert response.headers["Retry-After"] == "7"
        body = await response.json()
    assert body == {"error": {"code": "capacity_exceeded", "message": "pool small is full (400 sandboxes)"}}


async def test_not_found_from_resolver_keeps_connection(start_gateway) -> None:
    resolver = FakeResolver(Endpoint("127.0.0.1", dead_port()))
    resolver.error = NotFound("no such session for this identity")
    gw = await start_gateway(resolver)
    async with raw_client(gw.port) as (reader, writer):
        for _ in range(2):
            writer.write(request_bytes(headers=identity_headers()))
            status, headers, body = await read_response(reader)
            assert status == 404 and json.loads(body)["error"]["code"] == "not_found"
            assert b"x-request-id" in headers


async def test_first_request_waits_for_sandbox_creation(aiohttp_server, start_gateway, resolver_class) -> None:
    resolver = resolver_class(await backend(aiohttp_server, echo_headers))
    resolver.gate = asyncio.Event()
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client:
        pending = asyncio.ensure_future(client.get(f"{gw.url}/", headers=identity_headers()))
        await asyncio.sleep(0.05)
        assert not pending.done() and gw.plane.in_flight == 1
        resolver.gate.set()
        async with await pending as response:
            assert response.status == 200


# -- upstream failures ---------------------------------------------------------------------
async def test_unreachable_sandbox_is_502_with_sandbox_id(start_gateway, resolver_class) -> None:
    gw = await start_gateway(resolver_class(Endpoint("127.0.0.1", dead_port()), sandbox_id="ses-gone"))
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 502
        body = await response.json()
    assert body["error"]["code"] == "upstream_unreachable"
    assert body["error"]["sandbox_id"] == "ses-gone"
    assert gw.records[-1].error == "upstream_unreachable"


async def test_slow_sandbox_is_504(aiohttp_server, start_gateway) -> None:
    never = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await never.wait()
        return web.Response()

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, slow), sandbox_id="ses-slow"),
                             upstream_read_timeout=0.3)
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 504
        body = await response.json()
    assert body["error"]["code"] == "upstream_timeout" and body["error"]["sandbox_id"] == "ses-slow"


async def test_vanished_sandbox_is_re_resolved_once(aiohttp_server, start_gateway) -> None:
    live = await backend(aiohttp_server, echo_headers)
    resolver = FakeResolver(Endpoint("127.0.0.1", dead_port()))
    resolver.moves["s1"] = live
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 200
    assert resolver.invalidated == ["s1"]


async def test_vanished_sandbox_at_the_same_endpoint_is_502(start_gateway) -> None:
    resolver = CachingFakeResolver(Endpoint("127.0.0.1", dead_port()))
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 502
    assert resolver.invalidated == ["s1"]


async def test_connect_is_retried_until_the_server_binds(start_gateway) -> None:
    port = dead_port()
    resolver = FakeResolver(Endpoint("127.0.0.1", port))
    gw = await start_gateway(resolver, upstream_connect_retries=8, upstream_connect_backoff=0.02)

    async def ok(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nup")
        await writer.drain()
        writer.close()

    async def bind_late() -> asyncio.Server:
        await asyncio.sleep(0.1)
        release_port(port)
        return await asyncio.start_server(ok, "127.0.0.1", port)

    binding = asyncio.ensure_future(bind_late())
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/", headers=identity_headers()) as response:
        assert response.status == 200 and await response.read() == b"up"
    server = await binding
    server.close()
    await server.wait_closed()


async def test_stale_pooled_connection_is_retried_for_idempotent_requests(start_gateway) -> None:
    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_head(reader)  # the next request on this connection: hang up without answering

    async with raw_backend(one_per_connection) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with aiohttp.ClientSession() as client:
            for _ in range(3):
                async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                    assert response.status == 200
            async with client.post(f"{gw.url}/", data=b"body", headers=identity_headers()) as response:
                assert response.status == 502  # a request with a body is never sent twice
                assert (await response.json())["error"]["code"] == "upstream_error"


async def test_backend_killed_mid_stream_ends_the_client_stream(aiohttp_server, start_gateway) -> None:
    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 1000)
        await writer.drain()
        writer.transport.abort()

    async with raw_backend(dies) as be:
        resolver = FakeResolver(be.endpoint)
        resolver.route_to("healthy", await backend(aiohttp_server, echo_headers))
        gw = await start_gateway(resolver)
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes(headers=identity_headers()))
            _, headers = await read_head(reader)
            assert headers[b"content-length"] == b"1000000"
            rest = await reader.read()  # the stream ends: EOF, short of the promised length
            assert len(rest) < 1_000_000
        async with aiohttp.ClientSession() as client, \
                client.get(f"{gw.url}/", headers=identity_headers("healthy")) as response:
            assert response.status == 200
    failed = [r for r in gw.records if r.error]
    assert failed and failed[0].status == 200 and failed[0].error == "upstream_closed"


@pytest.mark.parametrize("garbage", [
    pytest.param(b"NOT HTTP AT ALL\r\n\r\n", id="request line"),
    pytest.param(b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", id="header"),
    pytest.param(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", id="smuggling"),
])
async def test_malformed_request_is_400_and_closed(start_gateway, garbage) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(garbage)
        data = await reader.read()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["error"]["code"] == "bad_request"
    assert b"Traceback" not in data


class _FailingAuthenticator:
    """An authenticator with a bug: what our code raising while a head is read looks like."""

    memoizable = False

    def identify(self, org, user, session, bot, authorization):  # type: ignore[no-untyped-def]
        raise RuntimeError("a bug in the authenticator")


async def test_a_callback_that_fails_is_logged_answered_and_closed(start_gateway, caplog) -> None:
    """A plain head (the compiled build reads it without llhttp, the pure one with it) whose reading raises in
    our code: logged, answered as an internal error, the connection closed; the next connection is served."""
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())))
    authenticator = gw.plane.admission.authenticator
    gw.plane.admission.authenticator = _FailingAuthenticator()
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(headers=identity_headers()))
        status, _, body = await read_response(reader)
        assert status == 500 and json.loads(body)["error"]["message"] == "internal error while reading the request"
        assert await closed_by_server(reader)
    assert "proxy callback failed" in caplog.text and "a bug in the authenticator" in caplog.text
    gw.plane.admission.authenticator = authenticator
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(headers=identity_headers()))
        assert (await read_response(reader)).status == 502  # the sandbox's port is dead: reached it


async def test_oversized_head_is_431(start_gateway) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), max_header_bytes=2048)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(headers={**identity_headers(), "X-Big": "y" * 5000}))
        data = await reader.read()
    assert data.startswith(b"HTTP/1.1 431 ") and b"header_too_large" in data


async def test_oversized_uri_is_414(start_gateway) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), max_header_bytes=2048)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(path="/" + "q" * 5000, headers=identity_headers()))
        response = await read_response(reader)
    assert response.status == 414 and response.json()["error"]["code"] == "uri_too_long"
    assert "max_header_bytes" in response.json()["error"]["message"]


async def test_an_oversized_head_is_answered_with_a_lingering_close(start_gateway) -> None:
    """The client is still sending its head when the 431 leaves: the gateway reads and drops the rest,
    then closes with a FIN, so the client reads its answer instead of losing it to a reset."""
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), max_header_bytes=2048)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    # Far more than one read: unread bytes at a plain close make the kernel send a reset.
    writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\nX-User-Id: u\r\nX-Session-Id: s\r\nX-Big: " + b"a" * 4_000_000)
    response = await asyncio.wait_for(read_response(reader), 5)
    assert response.status == 431 and response.headers[b"connection"] == b"close"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_header_split_across_reads_is_counted(start_gateway) -> None:
    """A header whose value spans reads is never seen whole by a callback of the first read: a large
    first read that leaves the head incomplete is refused at once, not after the small rest arrives."""
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), max_header_bytes=2048)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\nX-User-Id: u\r\nX-Session-Id: s\r\nX-Big: " + b"a" * 6000)
    data = await asyncio.wait_for(reader.read(), 5)  # the rest of the head is never sent
    writer.close()
    assert data.startswith(b"HTTP/1.1 431 ") and b"header_too_large" in data


async def test_head_growing_over_the_limit_in_small_reads_is_431(start_gateway) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), max_header_bytes=2048)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"GET / HTTP/1.1\r\nHost: gw\r\nX-Big: " + b"a" * 1500)
    await writer.drain()
    writer.write(b"a" * 1500 + b"\r\nX-User-Id: u\r\nX-Session-Id: s\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert data.startswith(b"HTTP/1.1 431 ") and b"header_too_large" in data


async def test_early_response_before_the_body_ends_closes_the_client(start_gateway) -> None:
    async with raw_backend(answers(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\n\r\ntoo long")) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes("POST", "/", {**identity_headers(), "Content-Length": "1000000"}) + b"x" * 1000)
            status, headers, body = await read_response(reader)
            assert (status, body) == (413, b"too long")
            assert headers[b"connection"] == b"close"
            assert await reader.read() == b""
    assert gw.records[-1].status == 413


async def test_client_leaving_mid_request_is_recorded_and_frees_the_upstream(start_gateway) -> None:
    closed = asyncio.Event()

    async def waits(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        await reader.read()  # until the gateway drops the connection
        closed.set()

    async with raw_backend(waits) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes("POST", "/", {**identity_headers(), "Content-Length": "100"}) + b"partial")
            await eventually(lambda: be.connections == 1)
        await asyncio.wait_for(closed.wait(), 5)
    await eventually(lambda: gw.plane.in_flight == 0)
    assert (gw.records[-1].status, gw.records[-1].error) == (499, None)


async def test_malformed_upstream_response_is_502(start_gateway) -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with raw_backend(garbage) as be:
        gw = await start_gateway(FakeResolver(be.endpoint, sandbox_id="ses-bad"))
        async with aiohttp.ClientSession() as client, \
                client.get(f"{gw.url}/", headers=identity_headers()) as response:
            assert response.status == 502
            assert (await response.json())["error"] == {
                "code": "upstream_error", "message": "sandbox ses-bad sent a malformed response", "sandbox_id": "ses-bad"}


@pytest.mark.parametrize("sent", [b"", b"GET / HTTP/1.1\r\nX-User-Id: u\r\n"], ids=["nothing", "half a head"])
async def test_slow_request_head_is_cut_off(start_gateway, sent) -> None:
    gw = await start_gateway(FakeResolver(Endpoint("127.0.0.1", dead_port())), header_read_timeout=0.2)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(sent)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the gateway
