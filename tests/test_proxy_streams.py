"""Streams through the data plane: SSE, WebSocket, large bodies in bounded memory, stream accounting."""

from __future__ import annotations

import asyncio
import base64
import os
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from gateway.model import Endpoint
from tests.proxy_helpers import (
    CachingFakeResolver,
    FakeResolver,
    eventually,
    gateway_process,
    identity_headers,
    raw_backend,
    raw_client,
    read_head,
    request_bytes,
    rss_kib,
    start_gateway,
    ws_echo,
)

__all__ = ["start_gateway"]  # a fixture

MIB = 1024 * 1024




async def backend(aiohttp_server, handler) -> Endpoint:  # type: ignore[no-untyped-def]
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = await aiohttp_server(app)
    return Endpoint("127.0.0.1", server.port)


# -- SSE ---------------------------------------------------------------------------------
async def test_sse_events_are_flushed_one_by_one(aiohttp_server, start_gateway) -> None:
    second = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await second.wait()  # set by the test only once the client holds event one
        await response.write(b"data: two\n\n")
        await response.write_eof()
        return response

    resolver = CachingFakeResolver(await backend(aiohttp_server, events), sandbox_id="ses-sse")
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client, \
            client.get(f"{gw.url}/events", headers=identity_headers()) as response:
        assert response.headers["Content-Type"] == "text/event-stream"
        assert await response.content.readuntil(b"\n\n") == b"data: one\n\n"
        assert gw.plane.open_streams == 1 and resolver.opened["ses-sse"] == 1
        second.set()
        assert await response.content.readuntil(b"\n\n") == b"data: two\n\n"
        assert await response.content.read() == b""
    await eventually(lambda: gw.plane.open_streams == 0)
    assert resolver.closed["ses-sse"] == 1
    assert gw.records[-1].protocol == "sse" and gw.records[-1].error is None


async def test_long_request_counts_as_a_stream(aiohttp_server, start_gateway) -> None:
    release = asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        await release.wait()
        return web.Response(text="done")

    resolver = FakeResolver(await backend(aiohttp_server, slow), sandbox_id="ses-long")
    gw = await start_gateway(resolver, long_request_after=0.05)
    async with aiohttp.ClientSession() as client:
        pending = asyncio.ensure_future(client.get(f"{gw.url}/", headers=identity_headers()))
        await eventually(lambda: resolver.opened["ses-long"] == 1)
        release.set()
        async with await pending as response:
            assert await response.text() == "done"
    await eventually(lambda: resolver.closed["ses-long"] == 1)
    assert gw.plane.open_streams == 0


# -- WebSocket -----------------------------------------------------------------------------
async def test_websocket_round_trip_and_close_codes(aiohttp_server, start_gateway) -> None:
    backend_saw: list[tuple[str, object, object]] = []

    async def ws_handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        while True:
            msg = await ws.receive()
            backend_saw.append((msg.type.name, msg.data, msg.extra))
            if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                break
            if msg.type == WSMsgType.TEXT:
                if msg.data == "ping me":
                    await ws.ping(b"from-backend")
                elif msg.data == "close me":
                    await ws.close(code=4001, message=b"backend says bye")
                else:
                    await ws.send_str("echo:" + msg.data)
            elif msg.type == WSMsgType.BINARY:
                await ws.send_bytes(msg.data[::-1])
            elif msg.type == WSMsgType.PING:
                await ws.pong(msg.data)
        return ws

    resolver = CachingFakeResolver(await backend(aiohttp_server, ws_handler), sandbox_id="ses-ws")
    gw = await start_gateway(resolver)
    async with aiohttp.ClientSession() as client:
        async with client.ws_connect(f"{gw.url}/ws", headers=identity_headers(), autoping=False) as ws:
            assert gw.plane.open_streams == 1
            await ws.send_str("héllo")
            assert (await ws.receive()).data == "echo:héllo"
            await ws.send_bytes(bytes(range(256)) * 300)
            assert (await ws.receive()).data == (bytes(range(256)) * 300)[::-1]
            await ws.ping(b"from-client")
            pong = await ws.receive()
            assert (pong.type, pong.data) == (WSMsgType.PONG, b"from-client")
            await ws.send_str("ping me")
            ping = await ws.receive()
            assert (ping.type, ping.data) == (WSMsgType.PING, b"from-backend")
            await ws.pong(b"from-backend")
            await ws.close(code=1000, message=b"client says bye")
            assert ws.close_code == 1000
        async with client.ws_connect(f"{gw.url}/ws", headers=identity_headers(), autoping=False) as ws:
            await ws.send_str("close me")
            closing = await ws.receive()
            assert (closing.type, closing.data, closing.extra) == (WSMsgType.CLOSE, 4001, "backend says bye")
    assert ("PONG", b"from-backend", "") in backend_saw
    assert ("CLOSE", 1000, "client says bye") in backend_saw
    await eventually(lambda: gw.plane.open_streams == 0)
    assert resolver.opened["ses-ws"] == 2 and resolver.closed["ses-ws"] == 2
    assert [r.protocol for r in gw.records] == ["websocket", "websocket"]
    assert all(r.status == 101 for r in gw.records)


async def test_websocket_idle_timeout_closes_both_sides(aiohttp_server, start_gateway) -> None:
    requests: list[web.Request] = []

    async def ws_handler(request: web.Request) -> web.WebSocketResponse:
        requests.append(request)
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, ws_handler)), stream_idle_timeout=0.2)
    async with aiohttp.ClientSession() as client, \
            client.ws_connect(f"{gw.url}/ws", headers=identity_headers(), autoping=False) as ws:
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert msg.type in (WSMsgType.CLOSED, WSMsgType.CLOSE, WSMsgType.ERROR)
    transport = requests[0].transport
    await eventually(lambda: transport is None or transport.is_closing())  # the sandbox side is closed too
    await eventually(lambda: gw.plane.open_streams == 0)
    assert gw.records[-1].protocol == "websocket"


async def test_refused_upgrade_is_an_ordinary_response(aiohttp_server, start_gateway) -> None:
    async def no(request: web.Request) -> web.Response:
        return web.Response(status=403, text="no websockets here")

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, no)))
    async with aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.WSServerHandshakeError) as raised:
            await client.ws_connect(f"{gw.url}/ws", headers=identity_headers())
    assert raised.value.status == 403
    assert gw.plane.open_streams == 0


# -- bounded memory ----------------------------------------------------------------------------
async def _warm_up(port: int) -> None:
    async with aiohttp.ClientSession() as client, \
            client.post(f"http://127.0.0.1:{port}/", data=b"x" * 1000, headers=identity_headers()) as response:
        assert response.status == 200


async def test_200mb_upload_streams_in_bounded_memory() -> None:
    total = 200 * MIB
    started_reading = asyncio.Event()

    async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            _, headers = await read_head(reader)
            length = int(headers.get(b"content-length", b"0"))
            if length > 10_000 or headers.get(b"transfer-encoding"):
                await asyncio.sleep(0.5)  # a sandbox busy elsewhere: the gateway must not buffer meanwhile
                started_reading.set()
            received = 0
            if length:
                while received < length:
                    received += len(await reader.read(min(MIB, length - received)))
            else:  # chunked: count payload bytes
                while True:
                    size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
                    if size == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    await reader.readexactly(size)
                    await reader.readexactly(2)
                    received += size
            body = b"%d" % received
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    block = bytes(range(256)) * 4096  # 1 MiB

    async def upload() -> AsyncIterator[bytes]:
        for _ in range(total // len(block)):
            yield block

    async with raw_backend(slow_reader) as be, gateway_process(be.port) as (port, pid):
        await _warm_up(port)
        baseline = rss_kib(pid)
        async with aiohttp.ClientSession() as client, \
                client.post(f"http://127.0.0.1:{port}/upload", data=upload(), headers=identity_headers()) as response:
            assert response.status == 200
            assert int(await response.text()) == total
        peak = rss_kib(pid, "VmHWM")
    assert started_reading.is_set()
    assert (peak - baseline) * 1024 < 40 * MIB, f"gateway RSS grew by {(peak - baseline) // 1024} MiB"


async def test_200mb_download_to_a_slow_client_in_bounded_memory() -> None:
    total = 200 * MIB
    block = b"z" * MIB

    async def fast_writer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            line, _ = await read_head(reader)
            size = total if b"/big" in line else 2
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
            if size == 2:
                writer.write(b"ok")
            else:
                for _ in range(total // MIB):
                    writer.write(block)
                    await writer.drain()
            await writer.drain()

    async with raw_backend(fast_writer) as be, gateway_process(be.port) as (port, pid):
        await _warm_up(port)
        baseline = rss_kib(pid)
        async with raw_client(port) as (reader, writer):
            writer.write(request_bytes("GET", "/big", identity_headers()))
            _, headers = await read_head(reader)
            assert int(headers[b"content-length"]) == total
            await asyncio.sleep(0.5)  # the slow client: the gateway must hold the sandbox back meanwhile
            received = 0
            while received < total:
                chunk = await reader.read(4 * MIB)
                assert chunk
                received += len(chunk)
        peak = rss_kib(pid, "VmHWM")
    assert (peak - baseline) * 1024 < 40 * MIB, f"gateway RSS grew by {(peak - baseline) // 1024} MiB"


async def test_request_body_is_forwarded_before_it_is_complete(start_gateway) -> None:
    """The upstream sees the first part of a body while the client still holds back the rest."""
    first_part = asyncio.Event()

    async def reads_first_part(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_head(reader)
        assert await reader.readexactly(5) == b"hello"
        first_part.set()
        assert await reader.readexactly(6) == b" world"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        await reader.read()

    async with raw_backend(reads_first_part) as be:
        gw = await start_gateway(FakeResolver(be.endpoint))
        async with raw_client(gw.port) as (reader, writer):
            writer.write(request_bytes("POST", "/", {**identity_headers(), "Content-Length": "11"}) + b"hello")
            await asyncio.wait_for(first_part.wait(), 5)
            writer.write(b" world")
            line, _ = await read_head(reader)
            assert re.match(rb"HTTP/1.1 200", line)


async def test_websocket_frames_sent_before_the_101_are_delivered(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, ws_echo)))
    mask = b"\x01\x02\x03\x04"
    frame = b"\x81\x82" + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(b"hi"))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes("GET", "/ws", {
            **identity_headers(), "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()}) + frame)
        line, headers = await read_head(reader)
        assert line.startswith(b"HTTP/1.1 101")
        assert headers[b"upgrade"].lower() == b"websocket" and headers[b"connection"].lower() == b"upgrade"
        assert await reader.readexactly(4) == b"\x81\x02hi"
