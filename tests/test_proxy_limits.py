"""Tenant limits in the data plane: chunked bodies over max_body_bytes, streams per org, WebSocket messages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import WSMsgType, web

from tests.proxy_helpers import (  # noqa: F401  (start_gateway is a fixture)
    CachingFakeResolver, FakeResolver, RawResponse, backend, eventually, identity_headers, start_gateway, ws_echo)
from tests.proxy_helpers import read_response as raw_response


def chunked_head(path: str = "/upload", **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gw", "Transfer-Encoding: chunked",
             *(f"{k}: {v}" for k, v in {**identity_headers(), **headers}.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    return await asyncio.wait_for(raw_response(reader), 5)


# -- request bodies ---------------------------------------------------------------
@pytest.fixture
async def upload_backend(aiohttp_server):
    """A sandbox that records every body it read completely."""
    bodies: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        bodies.append(body)
        return web.Response(text=f"got {len(body)}")

    return await backend(aiohttp_server, handler), bodies


async def test_chunked_body_over_the_cap_gets_413_and_never_reaches_the_sandbox(upload_backend, start_gateway):
    endpoint, bodies = upload_backend
    gw = await start_gateway(CachingFakeResolver(endpoint), max_body_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(chunked_head() + chunk(b"a" * 600))
    await writer.drain()
    writer.write(chunk(b"b" * 600))  # 1200 > 1000
    status, headers, body = await read_response(reader)
    assert status == 413 and headers[b"connection"] == b"close"
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    # The client may still be sending: the gateway reads and drops it, then closes cleanly (FIN, not reset).
    writer.write(chunk(b"c" * 100_000) * 20)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert bodies == []  # the sandbox's connection was dropped mid-body: no complete request
    assert gw.records[-1].status == 413


async def test_chunked_body_at_the_cap_is_forwarded(upload_backend, start_gateway):
    endpoint, bodies = upload_backend
    gw = await start_gateway(FakeResolver(endpoint), max_body_bytes=1000)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(chunked_head() + chunk(b"a" * 600) + chunk(b"b" * 400) + b"0\r\n\r\n")
    status, _, body = await read_response(reader)
    writer.close()
    assert (status, body) == (200, b"got 1000")
    assert bodies == [b"a" * 600 + b"b" * 400]


async def test_pipelined_request_over_the_cap_is_answered_in_turn(upload_backend, start_gateway):
    """The first request is served; the one behind it, over the cap, gets 413; then the connection closes."""
    endpoint, bodies = upload_backend
    gw = await start_gateway(CachingFakeResolver(endpoint), max_body_bytes=100)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    first = chunked_head() + chunk(b"ok") + b"0\r\n\r\n"
    writer.write(first + chunked_head() + chunk(b"x" * 101))
    assert (await read_response(reader))[0] == 200
    status, _, body = await read_response(reader)
    assert status == 413 and json.loads(body)["error"]["code"] == "payload_too_large"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert bodies == [b"ok"]


# -- streams per org --------------------------------------------------------------
@pytest.fixture
async def sse_backend(aiohttp_server):
    """An SSE sandbox whose streams stay open until ``release`` is set."""
    release = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: hello\n\n")
        await release.wait()
        return response

    return await backend(aiohttp_server, events), release


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def org_headers(org: str, session: str, *, declared: bool = True) -> dict[str, str]:
    headers = identity_headers(session, **{"X-Org-Id": org})
    if declared:
        headers["Accept"] = "text/event-stream"
    return headers


async def open_stream(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
    response = await http.get(f"{url}/events", headers=headers)
    assert response.status == 200
    assert await response.content.readuntil(b"\n\n") == b"data: hello\n\n"
    return response


async def test_streams_per_org_are_capped_with_429(sse_backend, start_gateway, http):
    endpoint, release = sse_backend
    gw = await start_gateway(CachingFakeResolver(endpoint), max_streams_per_org=2)
    first = await open_stream(http, gw.url, org_headers("acme", "s1"))
    second = await open_stream(http, gw.url, org_headers("acme", "s2"))
    async with http.get(f"{gw.url}/events", headers=org_headers("acme", "s3")) as refused:
        assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
        error = (await refused.json())["error"]
        assert error["code"] == "capacity_exceeded" and "max_streams_per_org 2" in error["message"]
    other = await open_stream(http, gw.url, org_headers("globex", "s4"))  # orgs do not share slots
    async with http.get(f"{gw.url}/plain", headers=org_headers("acme", "s5", declared=False)) as plain:
        assert plain.status == 200  # a request that is not a stream is not counted (this one turns into one)
        first.close()
        await eventually(lambda: gw.plane.limits.open_streams("acme") == 2)
    await eventually(lambda: gw.plane.limits.open_streams("acme") == 1)
    third = await open_stream(http, gw.url, org_headers("acme", "s3"))  # a slot came back
    release.set()
    for response in (second, other, third):
        assert await response.content.read() == b""
        response.release()
    await eventually(lambda: gw.plane.limits.open_streams("acme") == 0 == gw.plane.limits.open_streams("globex"))


async def test_undeclared_streams_count_against_the_next_ones(sse_backend, start_gateway, http):
    """An SSE response to a request that did not ask for one cannot be refused, but it takes a slot."""
    endpoint, release = sse_backend
    gw = await start_gateway(CachingFakeResolver(endpoint), max_streams_per_org=1)
    undeclared = await open_stream(http, gw.url, org_headers("acme", "s1", declared=False))
    assert gw.plane.limits.open_streams("acme") == 1
    async with http.get(f"{gw.url}/events", headers=org_headers("acme", "s2")) as refused:
        assert refused.status == 429
    release.set()
    assert await undeclared.content.read() == b""
    undeclared.release()
    await eventually(lambda: gw.plane.limits.open_streams("acme") == 0)


async def test_websockets_count_as_streams(aiohttp_server, start_gateway, http):
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, ws_echo)), max_streams_per_org=1)
    async with http.ws_connect(f"{gw.url}/ws", headers=org_headers("acme", "s1", declared=False)) as ws:
        await ws.send_str("hi")
        assert (await ws.receive()).data == "hi"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{gw.url}/ws", headers=org_headers("acme", "s2", declared=False))
        assert refused.value.status == 429
    await eventually(lambda: gw.plane.limits.open_streams("acme") == 0)
    async with http.ws_connect(f"{gw.url}/ws", headers=org_headers("acme", "s2", declared=False)) as ws:
        await ws.close()
    assert (await ws.receive()).type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)


# -- WebSocket messages ------------------------------------------------------------
@pytest.fixture
async def ws_sandbox(aiohttp_server):
    """A WebSocket sandbox that echoes, and records how each connection ended."""
    endings: list[WSMsgType] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        try:
            async for msg in ws:
                await ws.send_bytes(msg.data if isinstance(msg.data, bytes) else msg.data.encode())
        finally:
            endings.append(ws.close_code)
        return ws

    return await backend(aiohttp_server, handler), endings


async def test_websocket_message_over_the_cap_is_closed_with_1009(ws_sandbox, start_gateway, http):
    endpoint, endings = ws_sandbox
    gw = await start_gateway(CachingFakeResolver(endpoint), ws_max_message_bytes=1000)
    async with http.ws_connect(f"{gw.url}/ws", headers=identity_headers(), max_msg_size=0) as ws:
        await ws.send_bytes(b"a" * 1000)  # exactly the cap
        assert (await ws.receive()).data == b"a" * 1000
        await ws.send_bytes(b"b" * 1001)
        closing = await ws.receive()
        assert closing.type == WSMsgType.CLOSE and closing.data == 1009 and closing.extra == "message too big"
    await eventually(lambda: len(endings) == 1)  # the sandbox's connection was dropped, not left open
    assert endings[0] != 1000 and gw.plane.open_streams == 0
    assert gw.records[-1].refused == "ws_message" and gw.records[-1].status == 101


async def _raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket upgrade by hand (no client library), answered 101: the frames after it are ours."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    headers = "".join(f"{k}: {v}\r\n" for k, v in identity_headers().items())
    writer.write(f"GET /ws HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{headers}\r\n".encode())
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 101 ")
    return reader, writer


async def test_websocket_fragments_add_up_to_one_message(ws_sandbox, start_gateway):
    """A message split into small frames is still one message: 3 x 400 bytes is over a 1000-byte cap."""
    endpoint, _ = ws_sandbox
    gw = await start_gateway(CachingFakeResolver(endpoint), ws_max_message_bytes=1000)
    reader, writer = await _raw_upgrade(gw.port)

    def frame(opcode: int, payload: bytes, fin: bool) -> bytes:  # a masked client frame, length < 65536
        size = bytes([0x80 | len(payload)]) if len(payload) < 126 else bytes([0xFE]) + len(payload).to_bytes(2, "big")
        return bytes([(0x80 if fin else 0) | opcode]) + size + b"\0\0\0\0" + payload  # zero mask key

    writer.write(frame(2, b"x" * 400, False) + frame(0, b"x" * 400, False))
    await writer.drain()
    writer.write(frame(0, b"x" * 400, True))
    close = await asyncio.wait_for(reader.read(4), 5)
    assert close[:2] == b"\x88\x11" and int.from_bytes(close[2:4], "big") == 1009  # unmasked close, 2 + 15 bytes
    assert await asyncio.wait_for(reader.read(), 5) == b"message too big"
    writer.close()


@pytest.fixture
async def deflate_sandbox(aiohttp_server):
    """A WebSocket sandbox that would negotiate permessage-deflate; records the extensions it was offered."""
    offered: list[str | None] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        offered.append(request.headers.get("Sec-WebSocket-Extensions"))
        ws = web.WebSocketResponse(max_msg_size=0, compress=True)
        await ws.prepare(request)
        async for msg in ws:
            await ws.send_bytes(msg.data if isinstance(msg.data, bytes) else msg.data.encode())
        return ws

    return await backend(aiohttp_server, handler), offered


@pytest.mark.parametrize("limit", [None, 200])
async def test_a_message_limit_counts_what_the_sandbox_receives_not_compressed_bytes(deflate_sandbox, start_gateway,
                                                                                    http, limit):
    """100,000 bytes deflate to about 100 on the wire: with a 200-byte limit the extension is declined
    (the sandbox is never offered it), so the message is counted whole and refused with 1009."""
    endpoint, offered = deflate_sandbox
    gw = await start_gateway(CachingFakeResolver(endpoint), ws_max_message_bytes=limit)
    async with http.ws_connect(f"{gw.url}/ws", headers=identity_headers(), compress=15, max_msg_size=0) as ws:
        assert ws.compress == (15 if limit is None else 0)
        await ws.send_bytes(b"x" * 100_000)
        answer = await ws.receive()
    if limit is None:
        assert answer.data == b"x" * 100_000 and offered[-1] is not None and "permessage-deflate" in offered[-1]
    else:
        assert (answer.type, answer.data) == (WSMsgType.CLOSE, 1009) and offered == [None]


async def test_a_frame_claiming_an_extension_under_a_limit_is_refused(ws_sandbox, start_gateway):
    """No extension was negotiated, so a compressed (RSV1) frame is a protocol error (1002), however small."""
    endpoint, _ = ws_sandbox
    gw = await start_gateway(CachingFakeResolver(endpoint), ws_max_message_bytes=1000)
    reader, writer = await _raw_upgrade(gw.port)
    writer.write(bytes([0xC2, 0x85]) + b"\0\0\0\0" + b"\x02\x00\x00\x00\xff")  # FIN|RSV1 binary, 5 bytes
    close = await asyncio.wait_for(reader.read(4), 5)
    assert close[:1] == b"\x88" and int.from_bytes(close[2:4], "big") == 1002
    writer.close()


@pytest.mark.parametrize("first", [
    pytest.param(lambda: chunked_head() + chunk(b"x" * 101), id="chunked over the cap"),
    pytest.param(lambda: chunked_head().replace(b"Transfer-Encoding: chunked", b"Content-Length: 101") + b"x" * 101,
                 id="declared length over the cap"),
])
@pytest.mark.parametrize("after", [
    pytest.param(b"GET /next HTTP/1.1\r\nHost: gw\r\nX-User-Id: u1\r\nX-Session-Id: s1\r\n\r\n", id="a request"),
    pytest.param(b"\x00\x01 not http at all\r\n\r\n", id="garbage"),
])
async def test_nothing_after_a_refused_body_is_served(upload_backend, start_gateway, first, after):
    """One 413, then the connection ends: requests sent behind the refused one are not served."""
    endpoint, bodies = upload_backend
    gw = await start_gateway(CachingFakeResolver(endpoint), max_body_bytes=100)
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(first() + b"0\r\n\r\n" * (b"chunked" in first()) + after)
    status, _, _ = await read_response(reader)
    assert status == 413
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert bodies == [] and [r.status for r in gw.records] == [413]


async def test_nothing_after_an_early_refusal_with_a_body_is_served(upload_backend, start_gateway):
    """A request refused at its head (here: no identity) whose small body and a pipelined request
    arrive in the same read: one 400, then a clean close; the pipelined request is not served."""
    endpoint, bodies = upload_backend
    gw = await start_gateway(CachingFakeResolver(endpoint))
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    writer.write(b"POST /a HTTP/1.1\r\nHost: gw\r\nContent-Length: 5\r\n\r\nhello"
                 b"GET /next HTTP/1.1\r\nHost: gw\r\nX-User-Id: u1\r\nX-Session-Id: s1\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_identity"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    assert bodies == [] and [r.status for r in gw.records] == [400]
