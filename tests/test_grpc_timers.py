"""The gRPC front keeps time (gateway/grpcfront/keeper.py): a client that says nothing, never ACKs our
SETTINGS, sits idle, PINGs with no call or outstays its maximum age is closed, with the GOAWAY a gRPC
server sends, and the closing is counted by reason. Calls running are never cut short by the idle timer.

Frames are spoken raw (tests/test_grpc_hostile.RawConnection) so what the front sends is seen as sent.
Deadlines are short (fractions of a second) and each wait is for a frame or the close, bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from h2.errors import ErrorCodes
from hyperframe.frame import GoAwayFrame, PingFrame, SettingsFrame

from tests.grpc_helpers import echo_server, grpc_gateway, static_policy
from tests.test_grpc_hostile import PREFACE, RawConnection, assert_serves, describe

WAIT = 5.0  # generous: the machine is shared; every deadline under test is well below it
SETTINGS_TIMEOUT = 0x4


@pytest.fixture
async def sandbox() -> AsyncIterator[Any]:
    async with echo_server() as (service, port):
        yield service, port


def gateway_with(sandbox: Any, tmp_path: Any, **settings: Any) -> Any:
    return grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], sandbox[1]), **settings)


def closed_count(gateway: Any, reason: str) -> float:
    value = gateway.metrics.registry.get_sample_value("sgw_grpc_connections_closed_total", {"reason": reason})
    return value or 0.0


async def ending(conn: RawConnection) -> Any:
    """The first GOAWAY or the close, within WAIT (longer than RawConnection.ending's)."""
    async with asyncio.timeout(WAIT):
        while True:
            frame = await conn.frame()
            if frame is None or isinstance(frame, GoAwayFrame):
                return frame


async def said_until_closed(conn: RawConnection) -> list[Any]:
    """Every frame the front sends until it closes the connection, within WAIT."""
    said = []
    async with asyncio.timeout(WAIT):
        while (frame := await conn.frame()) is not None:
            said.append(frame)
    return said


async def closes(conn: RawConnection) -> None:
    async with asyncio.timeout(WAIT):
        while await conn.frame() is not None:
            pass


async def test_a_client_that_sends_nothing_is_closed_after_the_handshake_timeout(sandbox, tmp_path):
    async with gateway_with(sandbox, tmp_path, grpc_handshake_timeout=0.3) as gateway:
        silent = await RawConnection.open(gateway.grpc_address, handshake=False)
        half = await RawConnection.open(gateway.grpc_address, handshake=False)
        try:
            await half.send(PREFACE[:10])  # a preface that never completes
            for conn in (silent, half):
                # Not a word, not even our SETTINGS (sent once a preface arrives): a flood of connections that
                # never speak HTTP/2 costs the front no write (RFC 9113 3.4 lets the GOAWAY be omitted).
                said = await said_until_closed(conn)
                assert said == [], [describe(frame) for frame in said]
            assert closed_count(gateway, "handshake_timeout") == 2
            await assert_serves(gateway.grpc_address)
        finally:
            silent.close()
            half.close()


async def test_settings_never_acknowledged_end_with_settings_timeout(sandbox, tmp_path):
    async with gateway_with(sandbox, tmp_path, grpc_settings_ack_timeout=0.3) as gateway:
        conn = await RawConnection.open(gateway.grpc_address, handshake=False)
        try:
            await conn.send(PREFACE, SettingsFrame(0))  # and never the ACK of the front's SETTINGS
            end = await ending(conn)
            assert isinstance(end, GoAwayFrame) and end.error_code == SETTINGS_TIMEOUT, describe(end)
            assert closed_count(gateway, "settings_timeout") == 1
        finally:
            conn.close()


async def test_an_idle_connection_gets_goaway_no_error_and_a_running_call_keeps_it_open(sandbox, tmp_path):
    service, _ = sandbox
    async with gateway_with(sandbox, tmp_path, grpc_idle_timeout=0.4) as gateway:
        busy = await RawConnection.open(gateway.grpc_address)
        idle = await RawConnection.open(gateway.grpc_address)
        try:
            await idle.unary()  # a call, then nothing
            stream = busy.next_stream()
            await busy.send(*busy.call(stream, "/test.Echo/Slow"))
            await asyncio.wait_for(service.slow_started.wait(), WAIT)
            end = await ending(idle)
            assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.NO_ERROR, describe(end)
            assert b"idle" in end.additional_data
            await closes(idle)
            assert closed_count(gateway, "idle") == 1
            await busy.ping(b"stillup!")  # the connection with a call running outlived the idle timeout
        finally:
            busy.close()
            idle.close()


async def test_pings_without_calls_past_the_strikes_get_enhance_your_calm_too_many_pings(sandbox, tmp_path):
    async with gateway_with(sandbox, tmp_path) as gateway:
        conn = await RawConnection.open(gateway.grpc_address)  # its handshake sent the first PING
        try:
            await conn.ping(b"strike-1")
            await conn.ping(b"strike-2")
            await conn.send(PingFrame(0, b"strike-3"))
            end = await ending(conn)
            assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.ENHANCE_YOUR_CALM, describe(end)
            assert end.additional_data == b"too_many_pings"
            assert closed_count(gateway, "too_many_pings") == 1
            await assert_serves(gateway.grpc_address)
        finally:
            conn.close()


async def test_pings_are_free_while_a_call_runs_and_when_permitted(sandbox, tmp_path):
    service, _ = sandbox
    async with gateway_with(sandbox, tmp_path, grpc_keepalive_permit_without_calls=True,
                            grpc_keepalive_min_time=0.05) as gateway:
        calling = await RawConnection.open(gateway.grpc_address)
        spaced = await RawConnection.open(gateway.grpc_address)
        try:
            stream = calling.next_stream()
            await calling.send(*calling.call(stream, "/test.Echo/Slow"))
            await asyncio.wait_for(service.slow_started.wait(), WAIT)
            for i in range(10):
                await calling.ping(f"call-{i:03d}".encode())
            for i in range(4):  # permitted without calls, spaced past keepalive_min_time
                await asyncio.sleep(0.1)
                await spaced.ping(f"idle-{i:03d}".encode())
            assert closed_count(gateway, "too_many_pings") == 0
        finally:
            calling.close()
            spaced.close()


async def test_max_connection_age_sends_goaway_then_ends_the_calls_left_after_the_grace(sandbox, tmp_path):
    service, _ = sandbox
    async with gateway_with(sandbox, tmp_path, grpc_max_connection_age=0.3,
                            grpc_max_connection_age_grace=0.5) as gateway:
        idle = await RawConnection.open(gateway.grpc_address)
        busy = await RawConnection.open(gateway.grpc_address)
        try:
            stream = busy.next_stream()
            await busy.send(*busy.call(stream, "/test.Echo/Slow"))
            await asyncio.wait_for(service.slow_started.wait(), WAIT)
            end = await ending(idle)
            assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.NO_ERROR, describe(end)
            await closes(idle)
            end = await ending(busy)  # the GOAWAY; the call runs on through the grace
            assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.NO_ERROR, describe(end)
            assert end.last_stream_id == stream
            await closes(busy)        # and the grace ends it
            assert closed_count(gateway, "max_age") == 2
            await asyncio.wait_for(service.cancelled.wait(), WAIT)
        finally:
            idle.close()
            busy.close()


def test_timing_defaults_are_grpc_servers_and_named_settings():
    from gateway.grpcfront.keeper import Timing
    from gateway.settings import Settings

    timing = Timing.from_settings(Settings())
    assert timing.idle_timeout == 300.0 and timing.handshake_timeout == 10.0
    assert timing.keepalive_min_time == 300.0 and not timing.keepalive_permit_without_calls
    assert timing.max_connection_age is None


async def test_a_grpcio_client_calls_on_after_its_idle_connection_was_closed(sandbox, tmp_path):
    """What a real client makes of the idle GOAWAY: its next call opens a new connection and succeeds."""
    import grpc

    async with gateway_with(sandbox, tmp_path, grpc_idle_timeout=0.3) as gateway:
        host, port = gateway.grpc_address
        metadata = [("x-user-id", "u1"), ("x-session-id", "s1")]
        async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
            unary = channel.unary_unary("/test.Echo/Unary")
            assert await unary(b"first", metadata=metadata, timeout=WAIT) == b"first"
            async with asyncio.timeout(WAIT):
                while closed_count(gateway, "idle") < 1:
                    await asyncio.sleep(0.05)
            assert await unary(b"second", metadata=metadata, timeout=WAIT) == b"second"


async def test_handshake_deadlines_of_connections_made_together_are_spread_over_a_quarter():
    """A flood of connections admitted together must not time out in one loop iteration (and reconnect
    together: thousands of closes and accepts in one stall, which benchmarks/neighbours.py showed)."""
    from gateway.grpcfront.keeper import DEADLINE_SPREAD, Keeper, Timing

    class Silent:  # a connection that has said nothing yet, as its keeper sees it
        closed = False
        active = False
        loop = asyncio.get_running_loop()

    timing = Timing(handshake_timeout=10.0, settings_ack_timeout=10.0)
    keepers = [Keeper(Silent(), timing, lambda reason: None) for _ in range(200)]  # type: ignore[arg-type]
    try:
        offsets = [keeper._at - keeper._start for keeper in keepers]
    finally:
        for keeper in keepers:
            keeper.stop()
    assert all(10.0 <= offset <= 10.0 * (1 + DEADLINE_SPREAD) for offset in offsets), offsets
    assert DEADLINE_SPREAD == 0.25 and max(offsets) - min(offsets) > 1.5, offsets  # 200 draws over 2.5 s


def test_a_deadline_arms_its_timer_once_on_uvloop_whose_clock_counts_milliseconds():
    """uvloop's timers and clock count whole milliseconds: a timer for a deadline between two of them fires while
    the clock reads just short of it. The keeper must take that as due, not arm the timer again: it did, and the
    timer then fired every loop turn until the clock caught up (26 turns per deadline on average; an idle
    connection cost the front 3.6 times what it costs the data plane). keeper.CLOCK_SLACK."""
    uvloop = pytest.importorskip("uvloop", reason="serve runs on uvloop when it is installed; this is its clock")
    from gateway.grpcfront.keeper import Keeper, Timing

    async def main() -> tuple[list[float], int]:
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        ended = asyncio.Event()

        class Counting:  # the loop as a keeper sees it: every timer it arms is counted
            def time(self) -> float:
                return loop.time()

            def call_at(self, when: float, callback: Any) -> asyncio.TimerHandle:
                armed.append(when)
                return loop.call_at(when, callback)

        class Silent:  # a connection that never speaks
            active = False

            def __init__(self) -> None:
                self.closed = False
                self.loop = Counting()

            def close(self, code: int, message: str) -> None:
                self.closed = True
                if all(conn.closed for conn in conns):
                    ended.set()

        timing = Timing(handshake_timeout=0.05, idle_timeout=None)
        conns = [Silent() for _ in range(20)]
        keepers = [Keeper(conn, timing, lambda reason: None) for conn in conns]  # type: ignore[arg-type]
        await asyncio.wait_for(ended.wait(), WAIT)
        for keeper in keepers:
            keeper.stop()
        return armed, len(conns)

    armed, n = uvloop.run(main())
    assert len(armed) <= 2 * n, f"{len(armed)} timers armed for {n} deadlines"
