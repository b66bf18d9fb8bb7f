"""The data plane's clock: a wheel of deadlines, not a pass over every connection (gateway/proxy/_plane.py).

Each client connection sits in the bucket of the earliest moment one of its deadlines may fall; a tick looks
only at the buckets that are due. These tests check that idle connections cost the tick nothing, and that
every way a deadline becomes SOONER than a connection's bucket (a request begun on a kept-alive connection,
an X-Sandbox-Timeout, a head that does not arrive in one read) still fires on time. Real loopback sockets.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.proxy._state import NEVER
from tests.proxy_helpers import (
    FakeResolver,
    backend,
    echo_headers,
    eventually,
    identity_headers,
    raw_client,
    read_response,
    request_bytes,
    start_gateway,
)

__all__ = ["start_gateway"]  # fixture

HOUR = 3600.0


def counting_checks(plane) -> list[object]:  # type: ignore[no-untyped-def]
    """Record every connection the tick looks at (DataPlane._check_client), and still check it."""
    seen: list[object] = []
    check = plane._check_client

    def counted(client, *args):  # type: ignore[no-untyped-def]
        seen.append(client)
        check(client, *args)

    plane._check_client = counted
    return seen


async def ticks(plane, n: int) -> None:  # type: ignore[no-untyped-def]
    """Wait until the plane's wheel has moved on ``n`` ticks."""
    start = plane.wheel_at
    await eventually(lambda: plane.wheel_at >= start + n, timeout=n * plane.tick_len + 5)


async def served(port: int, path: str = "/") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that had one request answered and is kept alive."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request_bytes(path=path, headers=identity_headers()))
    assert (await asyncio.wait_for(read_response(reader), 5)).status == 200
    return reader, writer


async def test_idle_keep_alive_connections_cost_the_tick_nothing(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    plane = gw.plane
    plane.client_keepalive_timeout = HOUR
    conns = [await served(gw.port) for _ in range(50)]
    # Each is looked at once after its head deadline could have fallen, then filed under its keep-alive.
    await eventually(lambda: all(c.watch_tick > plane.wheel_at + 1000 for c in plane.clients), timeout=10)
    seen = counting_checks(plane)
    await ticks(plane, 4)
    assert seen == [] and len(plane.clients) == 50
    for _, writer in conns:
        writer.close()
    await eventually(lambda: not plane.clients)
    assert all(c.watch_tick == NEVER for c in seen)


async def test_a_kept_alive_connection_is_closed_when_idle_past_its_timeout(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    gw.plane.client_keepalive_timeout = 0.6
    reader, writer = await served(gw.port)
    started = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the gateway
    assert 0.5 < asyncio.get_running_loop().time() - started < 2.5
    writer.close()


def never_answers():  # type: ignore[no-untyped-def]
    never = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        if request.path == "/quick":
            return web.Response(text="quick")
        await never.wait()
        return web.Response()

    return handler


async def test_a_request_begun_on_a_connection_filed_far_ahead_is_still_timed(aiohttp_server, start_gateway) -> None:
    """The connection's bucket is an hour away (keep-alive); a request then begins: it is promoted to a
    long request (long_request_after) and its X-Sandbox-Timeout fires, each within a tick or two."""
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, never_answers())), header_read_timeout=1.0,
                             long_request_after=0.3)
    plane = gw.plane
    plane.client_keepalive_timeout = HOUR
    reader, writer = await served(gw.port, "/quick")
    client = next(iter(plane.clients))
    await eventually(lambda: client.watch_tick > plane.wheel_at + 1000, timeout=10)
    writer.write(request_bytes(path="/slow", headers=identity_headers()))
    await eventually(lambda: plane.streams == 1, timeout=3)  # promoted: the reaper counts it as a stream
    writer.close()

    reader, writer = await served(gw.port, "/quick")
    client = next(c for c in plane.clients if c is not client)
    await eventually(lambda: client.watch_tick > plane.wheel_at + 1000, timeout=10)
    started = asyncio.get_running_loop().time()
    writer.write(request_bytes(path="/slow", headers=identity_headers(**{"X-Sandbox-Timeout": "0.5"})))
    response = await asyncio.wait_for(read_response(reader), 5)
    assert response.status == 504 and b"X-Sandbox-Timeout" in response.body
    assert asyncio.get_running_loop().time() - started < 2.5
    writer.close()


async def test_a_head_begun_on_a_kept_alive_connection_is_timed_from_its_first_read(
        aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    plane = gw.plane
    plane.client_keepalive_timeout = HOUR
    reader, writer = await served(gw.port)
    client = next(iter(plane.clients))
    await eventually(lambda: client.watch_tick > plane.wheel_at + 1000, timeout=10)
    started = asyncio.get_running_loop().time()
    writer.write(b"GET /slow HTTP/1.1\r\nHost: gateway.test\r\n")  # half a head, and no more
    assert await asyncio.wait_for(reader.read(), 5) == b""
    assert 0.9 < asyncio.get_running_loop().time() - started < 3.0 and plane.heads_overdue == 1
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed_at_the_head_deadline(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    async with raw_client(gw.port) as (reader, _):
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reader.read(), 5) == b""
        assert 0.9 < asyncio.get_running_loop().time() - started < 3.0
    assert gw.plane.heads_overdue == 1


async def test_closed_connections_leave_only_stale_entries_that_are_skipped(aiohttp_server, start_gateway) -> None:
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    plane = gw.plane
    for _ in range(20):
        _, writer = await served(gw.port)
        writer.close()
    await eventually(lambda: not plane.clients)
    seen = counting_checks(plane)
    await ticks(plane, int(1.0 / plane.tick_len) + 3)  # past every bucket they were in
    assert seen == [] and plane.wheel == {}  # the stale entries went with their buckets: nothing held on to


async def test_a_crowded_bucket_is_checked_a_slice_at_a_time(aiohttp_server, start_gateway, monkeypatch) -> None:
    """Connections opened together share a bucket; the tick checks it CHECK_SLICE at a time, a slice every
    SLICE_EVERY, so that 4,000 slowloris heads are not all checked in one loop turn (issue 28), and still
    closes every overdue head, counted."""
    from gateway.proxy import _plane

    monkeypatch.setattr(_plane, "CHECK_SLICE", 16)
    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=1.0)
    plane = gw.plane
    seen = counting_checks(plane)
    slices: list[int] = []  # connections checked before each slice began
    check_slice = plane._check_slice

    def counted_slice() -> None:
        slices.append(len(seen))
        check_slice()

    plane._check_slice = counted_slice
    conns = [await asyncio.open_connection("127.0.0.1", gw.port) for _ in range(100)]
    await eventually(lambda: len(plane.clients) == 100)
    try:
        for reader, _ in conns:  # every one closed at its head deadline
            assert await asyncio.wait_for(reader.read(), 10) == b""
        assert plane.heads_overdue == 100
        slices.append(len(seen))
        per_slice = [b - a for a, b in zip(slices, slices[1:])]
        assert max(per_slice) == 16  # full slices, and none larger
        assert sum(1 for n in per_slice if n) >= 100 // 16  # the bucket's checks spread over loop turns
        assert not plane.checking and not plane.due_buckets and not plane.overdue
    finally:
        for _, writer in conns:
            writer.close()


async def test_head_deadlines_of_connections_opened_together_are_spread_over_a_quarter(
        aiohttp_server, start_gateway) -> None:
    """Each connection's head deadline falls at a random point of the quarter past header_read_timeout, and
    is kept: a slowloris's connections admitted together were closed together, reconnected together and sent
    their lines together, a wave every 10 s that doubled a victim's p99 (issue 28; _state.HEAD_DEADLINE_SPREAD)."""
    from gateway.proxy._state import HEAD_DEADLINE_SPREAD

    gw = await start_gateway(FakeResolver(await backend(aiohttp_server, echo_headers)), header_read_timeout=2.0)
    plane, loop = gw.plane, asyncio.get_running_loop()
    conns = []
    for i in range(40):
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
        if i % 2:
            writer.write(b"GET /slow HTTP/1.1\r\nHost: gateway.test\r\n")  # half a head; the others say nothing
        conns.append((reader, writer, writer.get_extra_info("sockname")[1], loop.time()))
    await eventually(lambda: len(plane.clients) == 40)
    timeout_of = {c.transport.get_extra_info("peername")[1]: c.head_timeout for c in plane.clients}
    try:
        timeouts = sorted(timeout_of.values())
        assert HEAD_DEADLINE_SPREAD == 0.25 and 2.0 <= timeouts[0] and timeouts[-1] <= 2.5, timeouts
        assert timeouts[-1] - timeouts[0] > 0.25, timeouts  # 40 draws over 0.5 s
        async def closed_after(reader: asyncio.StreamReader, opened: float) -> float:
            assert await asyncio.wait_for(reader.read(), 10) == b""
            return loop.time() - opened

        waited = await asyncio.gather(*(closed_after(reader, opened) for reader, _, _, opened in conns))
        for (_, _, port, _), took in zip(conns, waited):  # each closed at its own deadline: not before, a tick after
            assert timeout_of[port] - 0.05 <= took <= timeout_of[port] + 2 * plane.tick_len + 0.5, (took, port)
        assert plane.heads_overdue == 40
    finally:
        for _, writer, _, _ in conns:
            writer.close()
