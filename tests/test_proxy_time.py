"""Time limits on a proxied request, over real loopback sockets.

No total-time cap by default (a 10-minute build must run through); a pool may cap the time to the
response head (``request_timeout``), a client may ask for less (``X-Sandbox-Timeout``, what the
agent-sandbox SDK sends) but never more; a streaming body keeps only its idle limit between bytes;
a client that stops sending its body gets 408, not a 504 that blames the sandbox. Every 504 names
the setting that fired and how to raise it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import Gateway as App
from gateway.policy import parse_policy, request_timeouts
from gateway.proxy import PlaneOptions
from gateway.settings import Settings
from tests.proxy_helpers import (
    CachingFakeResolver,
    FakeResolver,
    backend,
    echo_headers,
    eventually,
    identity_headers,
    listening_socket,
    raw_client,
    read_response,
    request_bytes,
    resolver_class,
    start_gateway,
)

__all__ = ["resolver_class", "start_gateway"]  # fixtures

# Every other limit small: only the absence of a total cap lets the slow answer through.
SMALL_LIMITS = {"stream_idle_timeout": 0.3, "header_read_timeout": 0.3}


def never_answers(started: asyncio.Event | None = None):  # type: ignore[no-untyped-def]
    never = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        if started is not None:
            started.set()
        await never.wait()  # a command that outlives every limit in the test
        return web.Response()

    return handler


async def get(url: str, headers: dict[str, str]) -> tuple[int, dict]:  # type: ignore[type-arg]
    async with aiohttp.ClientSession() as client, client.get(url, headers=headers) as response:
        return response.status, await response.json()


def test_there_is_no_total_cap_by_default() -> None:
    assert Settings().upstream_read_timeout is None
    assert PlaneOptions().upstream_read_timeout is None


async def test_a_slow_answer_outlives_every_other_limit(aiohttp_server, start_gateway, resolver_class) -> None:
    """With defaults, nothing but the sandbox ends a request waiting for its answer: the old 60 s
    upstream_read_timeout cut every long /execute with a 504."""
    async def slow(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(1.2)  # four times the idle and head limits below
        return web.Response(text="built")

    gw = await start_gateway(resolver_class(await backend(aiohttp_server, slow)), **SMALL_LIMITS)
    async with aiohttp.ClientSession() as client:
        async with client.post(f"{gw.url}/execute", data=b'{"command": "make"}', headers=identity_headers()) as r:
            assert (r.status, await r.text()) == (200, "built")
    assert gw.records[-1].status == 200 and gw.records[-1].error is None


async def test_x_sandbox_timeout_gives_504_naming_the_header(aiohttp_server, start_gateway) -> None:
    """What the issue asks: X-Sandbox-Timeout: 2 on a command of 5 s (here: one that never ends)."""
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, never_answers()), sandbox_id="ses-t"))
    loop = asyncio.get_running_loop()
    began = loop.time()
    status, body = await get(f"{gw.url}/execute", identity_headers(**{"X-Sandbox-Timeout": "2"}))
    elapsed = loop.time() - began
    assert status == 504 and body["error"]["code"] == "upstream_timeout", body
    assert "X-Sandbox-Timeout" in body["error"]["message"] and "within 2s" in body["error"]["message"], body
    assert body["error"]["sandbox_id"] == "ses-t"
    assert 1.9 < elapsed < 4.5, elapsed
    assert gw.records[-1].error == "upstream_timeout"


async def test_x_sandbox_timeout_never_reaches_the_sandbox(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, echo_headers)))
    status, body = await get(f"{gw.url}/x", identity_headers(**{"X-Sandbox-Timeout": "130"}))
    assert status == 200
    assert not any(name.lower() == "x-sandbox-timeout" for name in body["headers"]), body


@pytest.mark.parametrize("value", [b"soon", b"0", b"-1", b"nan", b"inf", b""], ids=lambda v: v.decode() or "empty")
async def test_a_bad_x_sandbox_timeout_is_400(aiohttp_server, start_gateway, value: bytes) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, echo_headers)))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"GET / HTTP/1.1\r\nHost: g\r\nX-User-Id: u\r\nX-Session-Id: s\r\nX-Sandbox-Timeout: "
                     + value + b"\r\n\r\n")
        response = await read_response(reader)
    assert response.status == 400 and response.json()["error"]["code"] == "invalid_timeout"
    assert "X-Sandbox-Timeout" in response.json()["error"]["message"]


async def test_two_x_sandbox_timeouts_are_400(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, echo_headers)))
    async with raw_client(gw.port) as (reader, writer):
        writer.write(request_bytes(headers={**identity_headers(), "X-Sandbox-Timeout": "5", "x-sandbox-timeout": "9"}))
        response = await read_response(reader)
    assert response.status == 400 and response.json()["error"]["code"] == "invalid_timeout"


@pytest.mark.parametrize(("client", "named", "not_named"), [
    pytest.param(None, "pools.small.request_timeout", "X-Sandbox-Timeout", id="the pool's limit"),
    pytest.param("30", "pools.small.request_timeout", "send a larger", id="a client cannot ask for more"),
])
async def test_a_pool_request_timeout_gives_504_naming_the_pool_option(aiohttp_server, start_gateway, resolver_class,
                                                                        client: str | None, named: str,
                                                                        not_named: str) -> None:
    gw = await start_gateway(resolver_class(await backend(aiohttp_server, never_answers()), pool="small"))
    gw.plane.request_timeouts = {"small": 0.5, "shared": 60.0}
    headers = identity_headers(**({"X-Sandbox-Timeout": client} if client else {}))
    status, body = await get(f"{gw.url}/execute", headers)
    assert status == 504 and body["error"]["code"] == "upstream_timeout", body
    assert named in body["error"]["message"] and not_named not in body["error"]["message"], body


async def test_a_client_may_ask_for_less_than_its_pool_allows(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, never_answers()), pool="small"))
    gw.plane.request_timeouts = {"small": 30.0}
    status, body = await get(f"{gw.url}/x", identity_headers(**{"X-Sandbox-Timeout": "0.4"}))
    assert status == 504
    message = body["error"]["message"]
    assert "X-Sandbox-Timeout" in message and "pool small allows up to 30s" in message, message


async def test_request_timeout_bounds_the_head_not_a_streaming_body(aiohttp_server, start_gateway) -> None:
    """Past its head, a body streams for as long as bytes keep coming (each gap under the idle limit)."""
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(6):  # 1.2 s in all: longer than request_timeout, each gap shorter than the idle limit
            await response.write(b"line %d\n" % i)
            await asyncio.sleep(0.2)
        await response.write_eof()
        return response

    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, stream), pool="small"),
                             stream_idle_timeout=0.6)
    gw.plane.request_timeouts = {"small": 0.5}
    async with aiohttp.ClientSession() as client, client.get(f"{gw.url}/logs", headers=identity_headers()) as r:
        assert r.status == 200
        assert await r.read() == b"".join(b"line %d\n" % i for i in range(6))


async def test_a_client_that_stops_sending_its_body_gets_408(aiohttp_server, start_gateway, resolver_class) -> None:
    """Its own timeout, its own code: not a 504 upstream_timeout that blames the sandbox."""
    reading = asyncio.Event()

    async def reads_the_body(request: web.Request) -> web.Response:
        reading.set()
        await request.read()  # waits for the 10 bytes announced; 3 ever come
        return web.Response()

    gw = await start_gateway(resolver_class(await backend(aiohttp_server, reads_the_body)), stream_idle_timeout=0.3)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"POST /upload HTTP/1.1\r\nHost: g\r\nX-User-Id: u\r\nX-Session-Id: s\r\n"
                     b"Content-Length: 10\r\n\r\nabc")
        await asyncio.wait_for(reading.wait(), 5)
        response = await asyncio.wait_for(read_response(reader), 5)
    assert response.status == 408, response
    error = response.json()["error"]
    assert error["code"] == "request_body_timeout" and "stream_idle_timeout" in error["message"], error
    assert gw.records[-1].status == 408 and gw.records[-1].error is None  # not counted against the sandbox


async def test_upstream_read_timeout_when_set_names_itself(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(CachingFakeResolver(await backend(aiohttp_server, never_answers())),
                             upstream_read_timeout=0.3)
    status, body = await get(f"{gw.url}/x", identity_headers())
    assert status == 504 and "upstream_read_timeout" in body["error"]["message"], body


# -- the pool option ---------------------------------------------------------------------------------
def test_request_timeout_is_a_pool_option() -> None:
    policy = parse_policy("pools:\n  small: {request_timeout: 10m}\n  shared: {}\n")
    assert request_timeouts(policy) == {"small": 600.0}
    with pytest.raises(ValueError, match=r"pools\.small\.request_timeout"):
        parse_policy("pools:\n  small: {request_timeout: 0}\n  shared: {}\n")


async def test_the_data_plane_follows_the_policy_and_its_reloads(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {request_timeout: 90s}\n  shared: {}\n")
    app = App.create(Settings(data_dir=tmp_path / "data", policy_file=policy))
    await app.start(listening_socket(), listening_socket())
    try:
        assert app.data_plane.request_timeouts == {"small": 90.0}
        policy.write_text("pools:\n  small: {}\n  shared: {request_timeout: 5m}\n")
        os.utime(policy, (1.0, 1.0))  # a new mtime whatever the file system's granularity
        await app._reload_policy()
        assert app.data_plane.request_timeouts == {"shared": 300.0}
        assert app.lifecycle.view is app.router.view  # one view: the reaper reads the reloaded pools too
    finally:
        await app.stop()


# -- slow heads (slowloris): held between ticks, read a slice per loop turn, closed in slices -----------------

async def test_a_slow_head_is_held_between_ticks_and_still_served(aiohttp_server, start_gateway) -> None:
    """A head still incomplete SLOW_HEAD_AFTER after it began is not read at once any more: the connection
    is paused (a slowloris's thousands of lines sent together would otherwise all be read in one loop turn)
    and the tick wakes it each pass. A slow but honest client still gets its answer."""
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=4.0)
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"GET /slow HTTP/1.1\r\nHost: gateway.test\r\nX-User-Id: u1\r\n")
        await eventually(lambda: len(gw.plane.slow_heads) == 1)  # held by the tick, before its next line
        client = next(iter(gw.plane.slow_heads))
        seen = client.head_seen
        writer.write(b"X-Session-Id: s1\r\n")
        # Woken by the tick for a loop turn: the line is read, and the head, still slow, held again.
        await eventually(lambda: client.head_seen > seen and client in gw.plane.slow_heads)
        writer.write(b"\r\n")
        response = await asyncio.wait_for(read_response(reader), 5)
    assert response.status == 200 and json.loads(response.body)["raw_path"] == "/slow"
    await eventually(lambda: not gw.plane.slow_heads)
    assert gw.plane.heads_overdue == 0


async def test_a_held_slow_head_is_woken_only_once_it_has_sent_something(aiohttp_server, start_gateway) -> None:
    """The tick wakes a held head only when bytes wait on its socket (gateway/proxy/_ready.py): a slowloris
    that sends a line every few seconds costs nothing in the ticks between, where waking every held head
    each tick cost a resume, a read and a pause each (an eighth of a core at 4,000 heads)."""
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=4.0)
    plane = gw.plane
    async with raw_client(gw.port) as (reader, writer):
        writer.write(b"GET /quiet HTTP/1.1\r\nHost: gateway.test\r\n")
        await eventually(lambda: len(plane.slow_heads) == 1)
        client = next(iter(plane.slow_heads))
        seen, tick = client.head_seen, plane.wheel_at
        await eventually(lambda: plane.wheel_at >= tick + 2)  # two ticks with nothing sent
        assert plane.heads_woken == 0 and client in plane.slow_heads and client.head_seen == seen
        writer.write(b"X-User-Id: u1\r\n")
        await eventually(lambda: client.head_seen > seen and client in plane.slow_heads)
        assert plane.heads_woken == 1
        writer.write(b"X-Session-Id: s1\r\n\r\n")
        response = await asyncio.wait_for(read_response(reader), 5)
        assert plane.heads_woken == 2 and len(plane.ready_heads) == 1  # still open: still in the set
    assert response.status == 200 and json.loads(response.body)["raw_path"] == "/quiet"
    await eventually(lambda: len(plane.ready_heads) == 0)  # closed: out of it


async def test_heads_past_their_deadline_together_are_closed_and_counted_in_one_line(
        aiohttp_server, start_gateway, caplog) -> None:
    """Connections opened together reach header_read_timeout in the same tick: all are closed (in slices of
    SLICE a loop turn), counted, and logged in one line, not one line each."""
    from gateway.proxy._plane import SLICE

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=2.0)
    n = SLICE + 20  # more than one slice
    conns = []
    for i in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        if i % 2:
            writer.write(b"GET /slow HTTP/1.1\r\nHost: gateway.test\r\n")  # half a head; the others say nothing
        conns.append((reader, writer))
    with caplog.at_level(logging.INFO, logger="gateway.proxy"):
        closed = await asyncio.wait_for(asyncio.gather(*(reader.read() for reader, _ in conns)), 10)
    assert closed == [b""] * n and gw.plane.heads_overdue == n and not gw.plane.clients
    lines = [r.getMessage() for r in caplog.records if "no complete request head" in r.getMessage()]
    # Opened within a tick or two (0.5 s apart here): a line per tick, not one per connection.
    assert 1 <= len(lines) <= 4 and sum(int(line.split()[1]) for line in lines) == n, lines
    for _, writer in conns:
        writer.close()
