"""Shutdown ends streams cleanly: a WebSocket gets close 1001 Going Away (never between the bytes of a frame),
an event stream ends at an event boundary, instead of both being cut at drain_timeout."""

from __future__ import annotations

import asyncio
import base64
import hashlib

import aiohttp
from aiohttp import WSMsgType, web

from tests.proxy_helpers import (
    CachingFakeResolver,
    backend,
    eventually,
    identity_headers,
    raw_backend,
    read_head,
    start_gateway,
    ws_echo,
)

__all__ = ["start_gateway"]  # a fixture

DRAIN = 30.0  # far longer than any of these tests may take: the streams must end well before it


async def test_a_websocket_gets_1001_going_away_on_shutdown(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, ws_echo)))
    async with aiohttp.ClientSession() as client, \
            client.ws_connect(f"{gw.url}/ws", headers=identity_headers(), autoclose=False) as ws:
        await ws.send_str("hi")
        assert (await ws.receive()).data == "hi"
        stopping = asyncio.ensure_future(gw.plane.stop(DRAIN))
        msg = await asyncio.wait_for(ws.receive(), 5)
        assert (msg.type, msg.data, msg.extra) == (WSMsgType.CLOSE, 1001, "gateway shutting down")
        await asyncio.wait_for(stopping, 5)
    assert gw.records[-1].protocol == "websocket" and gw.records[-1].status == 101


async def test_a_frame_in_flight_is_completed_before_the_close(start_gateway) -> None:
    """Shutdown begins while half a frame from the sandbox has passed: the close frame waits for its end."""
    upgraded = asyncio.Event()
    send_rest = asyncio.Event()

    async def sandbox(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        _, headers = await read_head(reader)
        accept = base64.b64encode(hashlib.sha1(headers[b"sec-websocket-key"]
                                               + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n" + b"\x82\x0a" + b"01234")
        await writer.drain()
        upgraded.set()
        await send_rest.wait()
        writer.write(b"56789")
        await writer.drain()
        await reader.read()

    async with raw_backend(sandbox) as be:
        gw = await start_gateway(CachingFakeResolver(be.endpoint))
        async with aiohttp.ClientSession() as client, \
                client.ws_connect(f"{gw.url}/ws", headers=identity_headers(), autoclose=False) as ws:
            await asyncio.wait_for(upgraded.wait(), 5)
            stopping = asyncio.ensure_future(gw.plane.stop(DRAIN))
            await eventually(lambda: gw.plane.draining)
            send_rest.set()
            message = await asyncio.wait_for(ws.receive(), 5)
            assert (message.type, message.data) == (WSMsgType.BINARY, b"0123456789")
            close = await asyncio.wait_for(ws.receive(), 5)
            assert (close.type, close.data) == (WSMsgType.CLOSE, 1001)
            await asyncio.wait_for(stopping, 5)


async def test_an_event_stream_ends_at_an_event_boundary_on_shutdown(aiohttp_server, start_gateway) -> None:
    go_on = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: one\n\n")
        await go_on.wait()
        await response.write(b"data: two\n\n")
        await asyncio.Event().wait()  # the stream would go on for ever
        return response

    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, events)))
    async with aiohttp.ClientSession() as client, \
            client.get(f"{gw.url}/events", headers=identity_headers()) as response:
        assert await response.content.readuntil(b"\n\n") == b"data: one\n\n"
        stopping = asyncio.ensure_future(gw.plane.stop(DRAIN))
        await eventually(lambda: gw.plane.draining)
        go_on.set()
        # The whole second event, then a clean end of the chunked body (no error, no half event).
        assert await asyncio.wait_for(response.content.read(), 5) == b"data: two\n\n"
        await asyncio.wait_for(stopping, 5)
    assert gw.records[-1].protocol == "sse" and gw.records[-1].error is None
