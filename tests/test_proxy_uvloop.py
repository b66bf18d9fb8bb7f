"""The wire behaviour again on uvloop, the event loop the gateway runs on in production.

uvloop's transports buffer writes and call the flow-control hooks differently
from the default loop, so a representative slice runs here too. These are plain
tests that run their own loop (``uvloop.run``): pytest-asyncio's loop is the
default one, and the fake sandboxes are set up without its fixtures.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
import uvloop
from aiohttp import WSMsgType, web

from tests.proxy_helpers import (
    CachingFakeResolver,
    FakeResolver,
    StartGateway,
    aiohttp_backend,
    eventually,
    gateways,
    identity_headers,
    raw_backend,
    raw_client,
    read_head,
    read_response,
    request_bytes,
)


def on_uvloop(scenario: Callable[[StartGateway], Awaitable[None]]) -> None:
    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with gateways() as start:
            await scenario(start)

    uvloop.run(main())


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
    return web.Response(body=body)


@pytest.mark.parametrize("resolver_class", [FakeResolver, CachingFakeResolver])
def test_bodies_round_trip(resolver_class: type[FakeResolver]) -> None:
    async def scenario(start: StartGateway) -> None:
        async with aiohttp_backend(_echo) as endpoint:
            gw = await start(resolver_class(endpoint))
            async with aiohttp.ClientSession() as client:
                for size in (0, 1, 70_001, 8 * 1024 * 1024):
                    body = os.urandom(size)

                    async def chunks(body: bytes = body) -> AsyncIterator[bytes]:
                        for i in range(0, len(body), 250_000):
                            yield body[i:i + 250_000]

                    for chunked in (False, True):
                        params = {"chunked": "1"} if chunked else {}
                        data = chunks() if chunked else io.BytesIO(body)
                        async with client.post(f"{gw.url}/", data=data, params=params,
                                               headers=identity_headers()) as response:
                            got = await response.read()
                        assert hashlib.sha256(got).digest() == hashlib.sha256(body).digest(), (size, chunked)

    on_uvloop(scenario)


def test_pipelining_head_and_expect_continue() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=request.path.encode() + b":" + await request.read())

    async def scenario(start: StartGateway) -> None:
        async with aiohttp_backend(handler) as endpoint:
            gw = await start(CachingFakeResolver(endpoint))
            async with raw_client(gw.port) as (reader, writer):
                writer.write(request_bytes("GET", "/a", identity_headers())
                             + request_bytes("HEAD", "/b", identity_headers())
                             + request_bytes("POST", "/c", identity_headers(), body=b"data"))
                assert (await read_response(reader))[2] == b"/a:"
                status, headers, body = await read_response(reader, head_request=True)
                assert (status, body, headers[b"content-length"]) == (200, b"", b"3")
                assert (await read_response(reader))[2] == b"/c:data"
                writer.write(b"PUT /d HTTP/1.1\r\nHost: g\r\nX-User-Id: u\r\nX-Session-Id: s\r\nContent-Length: 2\r\n"
                             b"Expect: 100-continue\r\n\r\n")
                assert (await read_head(reader))[0] == b"HTTP/1.1 100 Continue"
                writer.write(b"ok")
                assert (await read_response(reader))[2] == b"/d:ok"

    on_uvloop(scenario)


def test_sse_and_websocket() -> None:
    second = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path == "/events":
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: one\n\n")
            await second.wait()
            await response.write(b"data: two\n\n")
            await response.write_eof()
            return response
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT and msg.data == "bye":
                await ws.close(code=4001, message=b"reason")
            elif msg.type == WSMsgType.TEXT:
                await ws.send_str(msg.data.upper())
            elif msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
        return ws

    async def scenario(start: StartGateway) -> None:
        async with aiohttp_backend(handler) as endpoint:
            resolver = CachingFakeResolver(endpoint)
            gw = await start(resolver)
            async with aiohttp.ClientSession() as client:
                async with client.get(f"{gw.url}/events", headers=identity_headers()) as response:
                    assert await response.content.readuntil(b"\n\n") == b"data: one\n\n"
                    second.set()
                    assert await response.content.readuntil(b"\n\n") == b"data: two\n\n"
                async with client.ws_connect(f"{gw.url}/ws", headers=identity_headers()) as ws:
                    await ws.send_str("hi")
                    assert (await ws.receive()).data == "HI"
                    await ws.send_bytes(b"\x00" * 100_000)
                    assert (await ws.receive()).data == b"\x00" * 100_000
                    await ws.send_str("bye")
                    msg = await ws.receive()
                    assert (msg.type, msg.data, msg.extra) == (WSMsgType.CLOSE, 4001, "reason")
            await eventually(lambda: gw.plane.open_streams == 0)
            assert resolver.opened == resolver.closed and sum(resolver.opened.values()) == 2

    on_uvloop(scenario)


def test_failures_before_and_after_the_response_started() -> None:
    async def flaky(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, _ = await read_head(reader)
        if b"/cut" in line:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
            await writer.drain()
            writer.transport.abort()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await read_head(reader)  # a second request on a pooled connection: hang up (stale connection)

    async def scenario(start: StartGateway) -> None:
        async with raw_backend(flaky) as be:
            gw = await start(CachingFakeResolver(be.endpoint), upstream_read_timeout=0.5)
            async with aiohttp.ClientSession() as client:
                for _ in range(3):
                    async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                        assert await response.read() == b"ok"
                with pytest.raises(aiohttp.ClientPayloadError):
                    async with client.get(f"{gw.url}/cut", headers=identity_headers()) as response:
                        await response.read()
                async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                    assert await response.read() == b"ok"

    on_uvloop(scenario)


def test_durations_are_finer_than_the_loop_clock() -> None:
    """uvloop's loop.time() moves in whole milliseconds: request durations (the latency histogram,
    the access log) must come from a finer clock, or sub-millisecond requests all read 0 or 1 ms."""
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def scenario(start: StartGateway) -> None:
        async with aiohttp_backend(ok) as endpoint:
            gw = await start(CachingFakeResolver(endpoint))
            async with aiohttp.ClientSession() as client:
                for _ in range(20):
                    async with client.get(f"{gw.url}/", headers=identity_headers()) as response:
                        assert response.status == 200
            await eventually(lambda: len(gw.records) == 20)
        millis = [record.duration * 1000 for record in gw.records]
        assert any(abs(ms - round(ms)) > 1e-6 for ms in millis), millis

    on_uvloop(scenario)
