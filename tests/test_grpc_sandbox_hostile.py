"""A hostile or broken sandbox behind the gRPC front: it costs its own calls a clear status (UNAVAILABLE or
INTERNAL) and its own connection, never a hang, a busy loop or resources the gateway keeps.

A sandbox runs untrusted code, and its gRPC server is whatever that code is: so the sandbox here is a raw
server speaking HTTP/2 frame by frame (hyperframe frames, hpack header blocks), told per test what to do
on each connection the gateway opens. Clients are grpclib's, through the gateway.

No sleeps: each wait is for a frame, a connection or its end, bounded by ``IO``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h2.connection
import h2.events
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from h2.config import H2Configuration
from hpack import Decoder, Encoder
from hyperframe.frame import DataFrame, Frame, GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame

from tests.grpc_helpers import UNARY, RawCodec, grpc_gateway, ident, static_policy

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
IO = 1.5  # the longest any one wait may take; a gateway that behaves answers in milliseconds


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + len(body).to_bytes(4, "big") + body


class SandboxSide:
    """One connection the gateway opened to the fake sandbox, spoken frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder, self.decoder = Encoder(), Decoder()
        self.closed = asyncio.Event()  # the gateway closed the connection (we read its end)

    async def frame(self) -> Frame | None:
        """The gateway's next frame, None at the end of the connection."""
        try:
            head = await self.reader.readexactly(9)
            frame, length = Frame.parse_frame_header(memoryview(head))
            frame.parse_body(memoryview(await self.reader.readexactly(length)))
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
            return None
        return frame

    async def send(self, *frames: Frame | bytes) -> None:
        self.writer.write(b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))
        await self.writer.drain()

    async def open(self, **settings: int) -> None:
        """The gateway's preface read; our SETTINGS sent."""
        assert await self.reader.readexactly(len(PREFACE)) == PREFACE
        await self.send(SettingsFrame(0, settings={getattr(SettingsFrame, k): v for k, v in settings.items()}))

    async def request(self) -> tuple[int, dict[bytes, bytes], bytes]:
        """Reads up to the end of the next request: (stream, its head, its body). SETTINGS are ACKed."""
        head: dict[int, dict[bytes, bytes]] = {}
        body: dict[int, bytes] = {}
        while True:
            frame = await self.frame()
            assert frame is not None, "the gateway closed the connection before a whole request"
            if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                await self.send(SettingsFrame(0, flags=["ACK"]))
            elif isinstance(frame, HeadersFrame):
                head[frame.stream_id] = dict(self.decoder.decode(frame.data, raw=True))
            elif isinstance(frame, DataFrame):
                body[frame.stream_id] = body.get(frame.stream_id, b"") + frame.data
            if isinstance(frame, (HeadersFrame, DataFrame)) and "END_STREAM" in frame.flags:
                return frame.stream_id, head[frame.stream_id], body.get(frame.stream_id, b"")

    async def answer(self, stream: int, message: bytes) -> None:
        """A whole unary answer: head, one message, trailers with status 0."""
        await self.send(
            HeadersFrame(stream, self.encoder.encode([(":status", "200"), ("content-type", "application/grpc")]),
                         flags=["END_HEADERS"]),
            DataFrame(stream, grpc_message(message)),
            HeadersFrame(stream, self.encoder.encode([("grpc-status", "0")]), flags=["END_HEADERS", "END_STREAM"]))

    async def until_closed(self) -> None:
        """Reads (and drops) what the gateway sends until it closes the connection."""
        while await self.frame() is not None:
            pass


Behaviour = Callable[[SandboxSide], Awaitable[None]]


class FakeSandbox:
    """A listener on 127.0.0.1 that hands each connection to ``behaviour``; keeps every connection's side."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sides: list[SandboxSide] = []
        self.connected = asyncio.Event()  # set at each new connection
        self._tasks: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        side = SandboxSide(reader, writer)
        self.sides.append(side)
        self.connected.set()
        task = asyncio.current_task()
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self.behaviour(side)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()


@asynccontextmanager
async def fake_sandbox(behaviour: Behaviour, *, rcvbuf: int | None = None) -> AsyncIterator[tuple[FakeSandbox, int]]:
    sandbox = FakeSandbox(behaviour)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if rcvbuf is not None:  # inherited by accepted connections: the gateway's writes back up sooner
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(sandbox._serve, sock=sock)
    try:
        yield sandbox, sock.getsockname()[1]
    finally:
        server.close()
        for task in list(sandbox._tasks):
            task.cancel()
        await asyncio.gather(*sandbox._tasks, return_exceptions=True)
        await server.wait_closed()


@asynccontextmanager
async def gateway_to(port: int, tmp_path: Path, **settings: Any) -> AsyncIterator[Channel]:
    """A gateway whose sandboxes answer gRPC on ``port``, and a grpclib channel to it."""
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port), **settings) as gw:
        channel = Channel(*gw.grpc_address, codec=RawCodec())
        try:
            yield channel
        finally:
            channel.close()


async def unary(channel: Channel, message: bytes = b"ping") -> tuple[Status | None, bytes | str | None]:
    """(status, the answer or the status message) of a unary call; (None, why) with no answer within ``IO``."""
    try:
        async with asyncio.timeout(IO):
            async with channel.request("/test.Echo/Unary", UNARY, bytes, bytes, metadata=ident()) as stream:
                await stream.send_message(message, end=True)
                return Status.OK, await stream.recv_message()
    except GRPCError as exc:
        return exc.status, exc.message
    except TimeoutError:
        return None, f"no answer within {IO} s"


async def serve_unary(side: SandboxSide) -> int:
    """Answers one unary call with its own request message; returns its stream."""
    stream, _, body = await side.request()
    await side.answer(stream, body[5:])
    return stream


# -- a sandbox that takes no streams -----------------------------------------------------------------------

async def no_streams(side: SandboxSide) -> None:
    await side.open(MAX_CONCURRENT_STREAMS=0)
    await side.until_closed()


async def goaway_at_once(side: SandboxSide) -> None:
    await side.open()
    await side.send(GoAwayFrame(0, last_stream_id=0, error_code=0))
    await side.until_closed()


async def close_at_once(side: SandboxSide) -> None:
    await side.open()


@pytest.mark.parametrize("behaviour", [
    pytest.param(no_streams, id="SETTINGS_MAX_CONCURRENT_STREAMS 0"),
    pytest.param(goaway_at_once, id="GOAWAY after its SETTINGS"),
    pytest.param(close_at_once, id="closes after its SETTINGS"),
])
async def test_a_sandbox_that_takes_no_streams_is_unavailable_at_once(tmp_path, behaviour):
    """Each connection the gateway opens is useless at once. The call must end UNAVAILABLE, after a bounded
    number of connections: not loop, opening connection after connection, until the client gives up."""
    async with fake_sandbox(behaviour) as (sandbox, port), gateway_to(port, tmp_path) as channel:
        status, message = await unary(channel)
        opened = len(sandbox.sides)
        assert status is Status.UNAVAILABLE, f"{status}: {message} ({opened} connections opened meanwhile)"
        assert opened <= 2, f"the gateway opened {opened} connections for one call"


# -- connections the gateway must not keep ------------------------------------------------------------------

async def silent(side: SandboxSide) -> None:
    await side.until_closed()  # accepts, reads, never sends a byte (not even SETTINGS)


async def test_a_sandbox_that_never_sends_settings_is_unavailable_and_its_connection_closed(tmp_path):
    """UNAVAILABLE within upstream_connect_timeout, and the connection that never settled is closed: a
    sandbox that accepts and stays silent must not leave the gateway a socket per call."""
    async with fake_sandbox(silent) as (sandbox, port), gateway_to(port, tmp_path,
                                                                  upstream_connect_timeout=0.3) as channel:
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, message = await unary(channel)
        assert status is Status.UNAVAILABLE and loop.time() - started < 1.0, (status, message)
        [side] = sandbox.sides
        try:
            await asyncio.wait_for(side.closed.wait(), IO)
        except TimeoutError:
            raise AssertionError("the gateway kept the connection that never settled open") from None


async def answer_then_goaway(side: SandboxSide) -> None:
    """Takes one unary call, sends GOAWAY (NO_ERROR, that stream the last), answers the call and keeps the
    connection open, as a server draining for a graceful stop may: it is for the client to close it once its
    streams are done."""
    await side.open()
    stream, _, body = await side.request()
    await side.send(GoAwayFrame(0, last_stream_id=stream, error_code=0))
    await side.answer(stream, body[5:])
    await side.until_closed()


async def test_a_connection_the_sandbox_sent_goaway_on_is_closed_once_its_calls_end(tmp_path):
    """Three calls, each on a new connection (the last one's had GOAWAY): each must be closed by the gateway
    once its call has ended, not kept open for the life of the sandbox, one more per GOAWAY."""
    async with fake_sandbox(answer_then_goaway) as (sandbox, port), gateway_to(port, tmp_path) as channel:
        for i in range(3):
            assert await unary(channel, b"call %d" % i) == (Status.OK, b"call %d" % i)
        assert len(sandbox.sides) == 3
        try:
            async with asyncio.timeout(IO):
                for side in sandbox.sides:
                    await side.closed.wait()
        except TimeoutError:
            kept = sum(not side.closed.is_set() for side in sandbox.sides)
            raise AssertionError(f"{kept} connections that had GOAWAY were kept open after their calls") from None


# -- a sandbox that refuses a request unprocessed ----------------------------------------------------------

class GoawayFirst:
    """Its first connection: GOAWAY below the first request (a server restarting); later ones serve."""

    def __init__(self) -> None:
        self.connections = 0

    async def __call__(self, side: SandboxSide) -> None:
        self.connections += 1
        await side.open()
        if self.connections == 1:
            await side.request()
            await side.send(GoAwayFrame(0, last_stream_id=0))
        else:
            await serve_unary(side)
        await side.until_closed()


async def refused_first(side: SandboxSide) -> None:
    """One connection: the first request refused (REFUSED_STREAM: a server shedding load), the next served."""
    await side.open()
    stream, _, _ = await side.request()
    await side.send(RstStreamFrame(stream, error_code=0x7))
    await serve_unary(side)
    await side.until_closed()


@pytest.mark.parametrize("behaviour, connections", [
    pytest.param(GoawayFirst, 2, id="GOAWAY below the stream"),
    pytest.param(lambda: refused_first, 1, id="REFUSED_STREAM"),
])
async def test_a_request_the_sandbox_refused_unprocessed_is_sent_again(tmp_path, behaviour, connections):
    """RFC 9113 8.7: a stream refused unprocessed may be retried. The gateway has the whole unary request,
    so the client gets the answer of the second try and never sees the first."""
    async with fake_sandbox(behaviour()) as (sandbox, port):
        async with gateway_to(port, tmp_path) as channel:
            assert await unary(channel, b"once more") == (Status.OK, b"once more")
        assert len(sandbox.sides) == connections


async def refuses_twice(side: SandboxSide) -> None:
    await side.open()
    for _ in range(2):
        stream, _, _ = await side.request()
        await side.send(RstStreamFrame(stream, error_code=0x7))
    await side.until_closed()


async def test_a_request_refused_twice_is_unavailable(tmp_path):
    """Sent again once only: a sandbox that refuses it again costs the call UNAVAILABLE (which clients may
    retry), not a loop, and not the CANCELLED a sandbox's other resets become."""
    async with fake_sandbox(refuses_twice) as (sandbox, port):
        async with gateway_to(port, tmp_path) as channel:
            status, message = await unary(channel)
            assert status is Status.UNAVAILABLE and "refused" in str(message)
        assert len(sandbox.sides) == 1


async def data_on_stream_0(side: SandboxSide) -> None:
    """Answers the first request with DATA on stream 0: a protocol error that ends its connection."""
    await side.open()
    await side.request()
    await side.send(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")  # hyperframe will not build DATA on stream 0
    await side.until_closed()


async def test_a_sandbox_breaking_the_protocol_costs_its_call_and_is_counted(tmp_path):
    """Its connection ends (GOAWAY PROTOCOL_ERROR), its call gets UNAVAILABLE, and the metric an operator
    alerts on counts it by peer and code."""
    async with fake_sandbox(data_on_stream_0) as (_, port):
        async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port)) as gw:
            channel = Channel(*gw.grpc_address, codec=RawCodec())
            try:
                status, _ = await unary(channel)
            finally:
                channel.close()
            assert status is Status.UNAVAILABLE
            metrics = gw.metrics.exposition()[0].decode()
            assert 'sgw_grpc_connection_errors_total{code="PROTOCOL_ERROR",peer="sandbox"} 1.0' in metrics


# -- a call served by callbacks (Call.start: its route cached, its connection ready) keeps every edge ----------

class AfterOne:
    """One connection: the first call is answered (route and connection then warm); the next request is read,
    ``held`` is set, and ``then(side, stream)`` does the rest once ``go`` is set. ``reset``: the gateway reset
    the stream held (its code in ``reset_code``)."""

    def __init__(self, then: Callable[[AfterOne, SandboxSide, int], Awaitable[None]]) -> None:
        self.then = then
        self.held = asyncio.Event()
        self.go = asyncio.Event()
        self.reset = asyncio.Event()
        self.reset_code: int | None = None
        self.gateway: Any = None

    async def __call__(self, side: SandboxSide) -> None:
        await side.open()
        await serve_unary(side)
        stream, _, _ = await side.request()
        self.held.set()
        await self.go.wait()
        await self.then(self, side, stream)
        while (frame := await side.frame()) is not None:
            if isinstance(frame, RstStreamFrame) and frame.stream_id == stream:
                self.reset_code = frame.error_code
                self.reset.set()

    def served_by_callbacks(self) -> bool:
        """The calls in flight on the front are served without a task (gateway/grpcfront/call.py, Call.start)."""
        calls = self.gateway.grpc_front.calls
        return bool(calls) and all(call.task is None for call in calls)


async def refuse(behaviour: AfterOne, side: SandboxSide, stream: int) -> None:
    await side.send(RstStreamFrame(stream, error_code=0x7))
    await serve_unary(side)


async def head_then_rest(behaviour: AfterOne, side: SandboxSide, stream: int) -> None:
    """The head alone; once the gateway has handled it (its call then has a task), the message and trailers."""
    await side.send(HeadersFrame(stream, side.encoder.encode([(":status", "200"), ("content-type", "application/grpc")]),
                                 flags=["END_HEADERS"]))
    async with asyncio.timeout(IO):
        while behaviour.served_by_callbacks():  # no event to wait for: the loop's next turns (not a timed sleep)
            await asyncio.sleep(0)
    await side.send(DataFrame(stream, grpc_message(b"later")),
                    HeadersFrame(stream, side.encoder.encode([("grpc-status", "0")]), flags=["END_HEADERS", "END_STREAM"]))


async def hold(behaviour: AfterOne, side: SandboxSide, stream: int) -> None:
    """Never answers the call held."""


@asynccontextmanager
async def warm_call(tmp_path: Path, then: Callable[[AfterOne, SandboxSide, int], Awaitable[None]],
                    call: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[tuple[AfterOne, asyncio.Task[Any]]]:
    """A gateway to a sandbox behaving as ``AfterOne(then)``, a warm call, then ``call(gateway)`` in flight (its
    task), checked to be served by callbacks while the sandbox holds it."""
    behaviour = AfterOne(then)
    async with fake_sandbox(behaviour) as (_, port):
        async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port)) as gw:
            behaviour.gateway = gw
            channel = Channel(*gw.grpc_address, codec=RawCodec())
            try:
                assert await unary(channel, b"warm") == (Status.OK, b"warm")
                task = asyncio.create_task(call(gw))
                await asyncio.wait_for(behaviour.held.wait(), IO)
                assert behaviour.served_by_callbacks()
                behaviour.go.set()
                yield behaviour, task
            finally:
                channel.close()


async def _unary_call(gateway: Any, message: bytes = b"held") -> tuple[Status | None, bytes | str | None]:
    channel = Channel(*gateway.grpc_address, codec=RawCodec())
    try:
        return await unary(channel, message)
    finally:
        channel.close()


async def _raw_call(gateway: Any, *extra: tuple[bytes, bytes]) -> dict[bytes, bytes]:
    """One unary call written with h2 (its head may carry grpc-timeout, which grpclib's metadata may not) and read
    frame by frame (h2 and grpclib give up a connection's calls at its GOAWAY): the response's head and trailers."""
    reader, writer = await asyncio.open_connection(*gateway.grpc_address)
    client = h2.connection.H2Connection(H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    client.send_headers(1, [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/test.Echo/Unary"),
                            (b":authority", b"gw"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                            (b"x-user-id", b"u1"), (b"x-session-id", b"s1"), *extra])
    client.send_data(1, grpc_message(b"held"), end_stream=True)
    writer.write(client.data_to_send())
    side = SandboxSide(reader, writer)  # its frame reader and HPACK decoder serve a client as well
    heads: dict[bytes, bytes] = {}
    try:
        while (frame := await side.frame()) is not None:
            if isinstance(frame, HeadersFrame) and frame.stream_id == 1:
                heads.update(side.decoder.decode(frame.data, raw=True))
                if "END_STREAM" in frame.flags:
                    return heads
        raise AssertionError("the gateway closed the connection before the call's end")
    finally:
        writer.close()


async def test_a_call_served_by_callbacks_and_refused_unprocessed_is_sent_again(tmp_path):
    async with warm_call(tmp_path, refuse, _unary_call) as (_, call):
        assert await asyncio.wait_for(call, IO) == (Status.OK, b"held")


async def test_a_call_served_by_callbacks_whose_answer_comes_in_pieces_is_relayed_whole(tmp_path):
    async with warm_call(tmp_path, head_then_rest, _unary_call) as (_, call):
        assert await asyncio.wait_for(call, IO) == (Status.OK, b"later")


async def test_a_call_served_by_callbacks_ends_at_its_deadline_and_resets_the_sandbox_stream(tmp_path):
    """The gateway's own timer for the client's grpc-timeout: DEADLINE_EXCEEDED, the sandbox's stream CANCELled."""
    async with warm_call(tmp_path, hold, lambda gw: _raw_call(gw, (b"grpc-timeout", b"200m"))) as (behaviour, call):
        assert (await asyncio.wait_for(call, IO))[b"grpc-status"] == b"4"
        await asyncio.wait_for(behaviour.reset.wait(), IO)
        assert behaviour.reset_code == 0x8 and not behaviour.gateway.grpc_front.calls


async def test_a_call_served_by_callbacks_cancelled_by_its_client_resets_the_sandbox_stream(tmp_path):
    async with warm_call(tmp_path, hold, _unary_call) as (behaviour, call):
        call.cancel()  # grpclib's client resets its stream (RST_STREAM CANCEL) as the request is left
        with contextlib.suppress(asyncio.CancelledError):
            await call
        await asyncio.wait_for(behaviour.reset.wait(), IO)
        assert behaviour.reset_code == 0x8 and not behaviour.gateway.grpc_front.calls


async def test_a_call_served_by_callbacks_ends_unavailable_when_the_drain_time_is_over(tmp_path):
    """The front's stop waits for it (it has no task to wait for), then ends it: UNAVAILABLE, the sandbox's
    stream CANCELled. (h2's client: grpclib's gives up its calls at the GOAWAY.)"""
    async with warm_call(tmp_path, hold, _raw_call) as (behaviour, call):
        await behaviour.gateway.grpc_front.stop(0.1)
        answer = await asyncio.wait_for(call, IO)
        assert answer[b"grpc-status"] == b"14" and b"shutting down" in answer[b"grpc-message"]
        await asyncio.wait_for(behaviour.reset.wait(), IO)
        assert behaviour.reset_code == 0x8 and not behaviour.gateway.grpc_front.calls
