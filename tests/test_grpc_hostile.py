"""Hostile and broken HTTP/2 from a client at the gRPC front: it costs that client its stream or its
connection, with the RFC 9113 error code, and never costs the gateway anything.

The front's HTTP/2 layer is what is under test, whichever it is (grpclib over h2, or the gateway's own
frame layer), so nothing here goes through an HTTP/2 library's client: frames are built with hyperframe
(or as raw bytes where they must be malformed), header blocks with hpack, and what the front answers is
parsed frame by frame. A connection error is a GOAWAY with its code and then the close; a stream error is
an RST_STREAM on that stream, and the same connection then still serves a unary call. After any connection
error a new connection must still serve one (:func:`assert_serves`).

Reads use ``loop.sock_recv`` on a plain socket, not asyncio streams: a front that closes while our data is
unread makes the kernel reset the connection, and a StreamReader then raises before handing over the
GOAWAY that arrived just ahead of the reset, where recv() returns the queued bytes first.

No sleeps: each wait is for a frame, the close or a PING's ACK, bounded by ``IO``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import struct
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from h2.errors import ErrorCodes
from hpack import Decoder, Encoder
from hpack.hpack import encode_integer
from hyperframe.frame import (ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame, PingFrame,
                              PushPromiseFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame)

from tests.grpc_helpers import echo_server, grpc_gateway, ident, static_policy

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
IO = 1.5                 # the longest any one wait may take; a front that behaves answers in milliseconds
MAX_WINDOW = 2**31 - 1   # the largest flow-control window (RFC 9113 6.9.1)
DEFAULT_MAX_FRAME = 16_384
Address = tuple[str, int]


def frame_bytes(kind: int, stream_id: int, payload: bytes, flags: int = 0) -> bytes:
    """A frame as raw bytes, whatever its length or contents (hyperframe will not build malformed ones)."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack("!I", len(body)) + body


def request_head(path: str) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "gateway"),
            ("content-type", "application/grpc"), ("te", "trailers"), *ident().items()]


def code_name(code: int) -> str:
    try:
        return ErrorCodes(code).name
    except ValueError:
        return f"unknown code {code:#x}"


def describe(frame: Frame | None) -> str:
    """What ended a stream or connection, for assertion messages."""
    if frame is None:
        return "the close, with no GOAWAY before it"
    if isinstance(frame, GoAwayFrame):
        return f"GOAWAY {code_name(frame.error_code)} ({frame.additional_data[:80]!r})"
    if isinstance(frame, RstStreamFrame):
        return f"RST_STREAM {code_name(frame.error_code)} on stream {frame.stream_id}"
    return repr(frame)


class RawConnection:
    """One client connection to the front, spoken frame by frame over a plain non-blocking socket."""

    def __init__(self, sock: socket.socket, address: Address) -> None:
        self.sock = sock
        self.address = address
        self.loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.settings: dict[int, int] = {}   # the front's SETTINGS, as received
        self.encoder, self.decoder = Encoder(), Decoder()
        self.heads: dict[int, list[dict[bytes, bytes]]] = {}  # per stream: each header block the front sent
        self.bodies: dict[int, bytes] = {}
        self.resets: dict[int, int] = {}     # stream: the error code of the front's RST_STREAM
        self.opened: dict[int, int] = {}     # stream (0: the connection): the sum of the front's WINDOW_UPDATEs
        self.ids = itertools.count(1, 2)

    @classmethod
    async def open(cls, address: Address, *, handshake: bool = True) -> RawConnection:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, address), IO)
            conn = cls(sock, address)
            if handshake:
                await conn.handshake()
        except BaseException:
            sock.close()
            raise
        return conn

    def close(self) -> None:
        self.sock.close()

    async def handshake(self) -> None:
        """The preface and an empty SETTINGS, then a PING: every SETTINGS the front opens with arrives before
        the PING's ACK, so once that is in, the front's settings are known (and ACKed)."""
        await self.send(PREFACE, SettingsFrame(0))
        await self.ping(b"hndshake")

    async def ping(self, opaque: bytes) -> None:
        """Sends a PING and reads up to its ACK, which must echo ``opaque``; by then the front has handled all
        that was sent before it (frames are handled in order). SETTINGS met on the way are ACKed here, and only
        here: no flood is writing while this runs, and two writers would interleave their frames."""
        await self.send(PingFrame(0, opaque))
        try:
            async with asyncio.timeout(IO):
                while True:
                    frame = await self.frame()
                    if frame is None:
                        raise ConnectionError(f"the front closed the connection before answering PING {opaque!r}")
                    if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                        await self.send(SettingsFrame(0, flags=["ACK"]))
                    elif isinstance(frame, PingFrame) and "ACK" in frame.flags:
                        assert frame.opaque_data == opaque, f"PING {opaque!r} was answered with {frame.opaque_data!r}"
                        return
        except TimeoutError:
            raise AssertionError(f"no answer to PING {opaque!r} within {IO} s") from None

    def next_stream(self) -> int:
        return next(self.ids)

    async def send(self, *frames: Frame | bytes) -> None:
        await self.loop.sock_sendall(self.sock, b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames))

    def head(self, stream: int, path: str = "/test.Echo/Unary", *, end_stream: bool = False) -> HeadersFrame:
        flags = ["END_HEADERS", "END_STREAM"] if end_stream else ["END_HEADERS"]
        return HeadersFrame(stream, self.encoder.encode(request_head(path)), flags=flags)

    def call(self, stream: int, path: str = "/test.Echo/Unary", message: bytes = b"ping") -> list[Frame]:
        """A whole request (one message, then the end of the stream)."""
        return [self.head(stream, path), DataFrame(stream, grpc_message(message), flags=["END_STREAM"])]

    async def frame(self) -> Frame | None:
        """The next frame from the front (a header block is decoded into ``heads``), None once it has closed."""
        while len(self.buffer) < 9 or len(self.buffer) < 9 + int.from_bytes(self.buffer[:3], "big"):
            try:
                data = await self.loop.sock_recv(self.sock, 1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.buffer += data
        frame, length = Frame.parse_frame_header(memoryview(bytes(self.buffer[:9])))
        frame.parse_body(memoryview(bytes(self.buffer[9:9 + length])))
        del self.buffer[:9 + length]
        if isinstance(frame, HeadersFrame):
            assert "END_HEADERS" in frame.flags, "the front split a header block (this client does not join them)"
            self.heads.setdefault(frame.stream_id, []).append(dict(self.decoder.decode(frame.data, raw=True)))
        elif isinstance(frame, DataFrame):
            self.bodies[frame.stream_id] = self.bodies.get(frame.stream_id, b"") + frame.data
        elif isinstance(frame, RstStreamFrame):
            self.resets[frame.stream_id] = frame.error_code
        elif isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            self.settings.update(frame.settings)
        elif isinstance(frame, WindowUpdateFrame):
            self.opened[frame.stream_id] = self.opened.get(frame.stream_id, 0) + frame.window_increment
        return frame

    async def ending(self, stream: int | None = None) -> Frame | None:
        """The first GOAWAY, RST_STREAM (on ``stream`` if given), or the close (None) from the front."""
        try:
            async with asyncio.timeout(IO):
                while True:
                    frame = await self.frame()
                    if frame is None or isinstance(frame, GoAwayFrame) or (
                            isinstance(frame, RstStreamFrame) and stream in (None, frame.stream_id)):
                        return frame
        except TimeoutError:
            raise AssertionError(f"no GOAWAY, RST_STREAM or close from the front within {IO} s") from None

    async def finish(self, stream: int) -> Frame | None:
        """Reads until ``stream`` ends; returns the frame that ended it (END_STREAM, RST_STREAM), a GOAWAY, or
        None if the connection closed."""
        try:
            async with asyncio.timeout(IO):
                while True:
                    frame = await self.frame()
                    if frame is None or isinstance(frame, GoAwayFrame):
                        return frame
                    if frame.stream_id == stream and (isinstance(frame, RstStreamFrame) or "END_STREAM" in frame.flags):
                        return frame
        except TimeoutError:
            raise AssertionError(f"stream {stream} was still open after {IO} s") from None

    async def closes(self) -> None:
        """The front closes the connection (whatever it sends first)."""
        try:
            async with asyncio.timeout(IO):
                while await self.frame() is not None:
                    pass
        except TimeoutError:
            raise AssertionError(f"the front kept the connection open {IO} s after ending it") from None

    async def unary(self, message: bytes = b"still serving") -> None:
        """A unary call on this connection: the sandbox's echo comes back with grpc-status 0."""
        stream = self.next_stream()
        await self.send(*self.call(stream, message=message))
        end = await self.finish(stream)
        assert isinstance(end, (HeadersFrame, DataFrame)), f"a unary call got {describe(end)}"
        status = self.heads.get(stream, [{}])[-1].get(b"grpc-status")
        assert (status, self.bodies.get(stream)) == (b"0", grpc_message(message)), self.heads.get(stream)


async def assert_serves(address: Address) -> None:
    """The gateway still serves a normal unary call, on a new connection."""
    conn = await RawConnection.open(address)
    try:
        await conn.unary()
    finally:
        conn.close()


async def assert_connection_error(conn: RawConnection, code: ErrorCodes) -> None:
    """GOAWAY with ``code``, then the close; and the gateway still serves new connections (checked before the
    code, so a failure on the code says the rest held)."""
    end = await conn.ending()
    if end is not None:
        await conn.closes()
    await assert_serves(conn.address)
    assert isinstance(end, GoAwayFrame) and end.error_code == code, f"expected GOAWAY {code.name}, got {describe(end)}"


async def assert_stream_error(conn: RawConnection, stream: int, code: ErrorCodes) -> None:
    """RST_STREAM with ``code`` on ``stream``; the connection goes on serving."""
    end = await conn.ending(stream)
    assert isinstance(end, RstStreamFrame) and end.error_code == code, \
        f"expected RST_STREAM {code.name} on stream {stream}, got {describe(end)}"
    await conn.unary()


async def flood(conn: RawConnection, chunks: Iterable[bytes], stream: int | None = None) -> tuple[Frame | None, int]:
    """Writes ``chunks`` while reading, until the front ends ``stream`` or the connection: returns what ended
    it and how many bytes had been written by then (all of them if the front took everything). Our send
    buffer is made small (64 KiB; Linux doubles it) so that what was written is close to what the front
    read: the rest of the gap is its receive buffer, which stays small while it reads as fast as we write."""
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
    written = 0

    async def write() -> None:
        nonlocal written
        for chunk in chunks:
            await conn.loop.sock_sendall(conn.sock, chunk)
            written += len(chunk)

    writer = asyncio.create_task(write())
    try:
        return await conn.ending(stream), written
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)  # a write refused once the front closed: expected


@pytest.fixture
async def sandbox() -> AsyncIterator[Any]:
    async with echo_server() as (service, port):
        yield service, port


@pytest.fixture
async def gateway(sandbox, tmp_path) -> AsyncIterator[Any]:
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], sandbox[1])) as gw:
        yield gw


@pytest.fixture
async def conn(gateway) -> AsyncIterator[RawConnection]:
    """A connection past the handshake; closed before the gateway stops, so its open calls end at once."""
    connection = await RawConnection.open(gateway.grpc_address)
    yield connection
    connection.close()


def max_frame(conn: RawConnection) -> int:
    return conn.settings.get(SettingsFrame.MAX_FRAME_SIZE, DEFAULT_MAX_FRAME)


# -- frame sizes -------------------------------------------------------------------------------------------

async def test_a_frame_over_max_frame_size_is_frame_size_error(conn):
    stream = conn.next_stream()
    await conn.send(conn.head(stream, "/test.Echo/Sink"),
                    frame_bytes(DataFrame.type, stream, b"\x00" * (max_frame(conn) + 1)))
    await assert_connection_error(conn, ErrorCodes.FRAME_SIZE_ERROR)


async def test_a_continuation_flood_is_cut_off_within_1_mib(conn):
    """HEADERS without END_HEADERS, then 2,000 CONTINUATIONs of 16 KiB (32 MiB of one header block: a single
    valid HPACK literal whose value never ends). A front that buffers header blocks without a bound would
    take them all. It must end the connection once it holds 1 MiB of the block; seen from here, the close
    (or GOAWAY) comes before 4 MiB could be written (1 MiB, plus what the kernel buffers between us, plus
    one 64 KiB write), far short of the 32 MiB."""
    frames, size = 2000, 16_384
    block = conn.encoder.encode(request_head("/test.Echo/Unary"))
    block += b"\x00" + bytes(encode_integer(5, 7)) + b"x-pad" + bytes(encode_integer(frames * size, 7))
    first = HeadersFrame(1, block).serialize()
    pad = ContinuationFrame(1, b"a" * size).serialize()
    chunks = itertools.chain([first], itertools.repeat(pad * 4, frames // 4))  # 64 KiB per write
    end, written = await flood(conn, chunks)
    assert written < 4 * 2**20, f"the front took {written / 2**20:.1f} MiB of one header block before ending it"
    assert end is None or (isinstance(end, GoAwayFrame) and end.error_code in (
        ErrorCodes.PROTOCOL_ERROR, ErrorCodes.ENHANCE_YOUR_CALM, ErrorCodes.COMPRESSION_ERROR)), describe(end)
    if end is not None:
        await conn.closes()
    await assert_serves(conn.address)


@pytest.mark.parametrize(("payload", "code"), [
    pytest.param(struct.pack("!HI", SettingsFrame.INITIAL_WINDOW_SIZE, 2**31), ErrorCodes.FLOW_CONTROL_ERROR,
                 id="INITIAL_WINDOW_SIZE 2^31"),
    pytest.param(struct.pack("!HI", SettingsFrame.MAX_FRAME_SIZE, 100), ErrorCodes.PROTOCOL_ERROR,
                 id="MAX_FRAME_SIZE 100"),
    pytest.param(struct.pack("!HI", SettingsFrame.ENABLE_PUSH, 2), ErrorCodes.PROTOCOL_ERROR, id="ENABLE_PUSH 2"),
    pytest.param(struct.pack("!HI", SettingsFrame.ENABLE_PUSH, 0) + b"\x00", ErrorCodes.FRAME_SIZE_ERROR,
                 id="length not a multiple of 6"),
])
async def test_bad_settings_are_connection_errors(conn, payload, code):
    await conn.send(frame_bytes(SettingsFrame.type, 0, payload))
    await assert_connection_error(conn, code)


async def test_ping_is_answered_with_its_own_bytes(conn):
    await conn.ping(b"\x00\xffhost!\x01")
    await conn.unary()


async def test_a_ping_of_7_bytes_is_frame_size_error(conn):
    await conn.send(frame_bytes(PingFrame.type, 0, b"1234567"))
    await assert_connection_error(conn, ErrorCodes.FRAME_SIZE_ERROR)


# -- streams -----------------------------------------------------------------------------------------------

async def test_rapid_reset_starts_no_more_calls_than_max_concurrent_streams(conn, gateway):
    """CVE-2023-44487: 5,000 streams, each a valid request head at once reset (CANCEL). Each is closed as
    soon as it is opened, so the HTTP/2 stream limit never binds; what must not follow is the gateway
    starting 5,000 calls (a task, a sandbox stream each). ``begin`` is sampled: the peak of open calls."""
    limit = conn.settings.get(SettingsFrame.MAX_CONCURRENT_STREAMS)
    assert limit is not None, "the front advertises no SETTINGS_MAX_CONCURRENT_STREAMS"
    front, peak = gateway.grpc_front, 0
    begin = front.begin

    def counted(call: Any) -> None:
        nonlocal peak
        begin(call)
        peak = max(peak, len(front.calls))

    front.begin = counted
    requests = (conn.head(s).serialize() + RstStreamFrame(s, ErrorCodes.CANCEL).serialize()
                for s in itertools.islice(conn.ids, 5000))
    batches = (b"".join(itertools.islice(requests, 500)) for _ in range(10))
    try:
        for batch in batches:
            await conn.send(batch)
        await conn.ping(b"reset-ok")  # answered once every reset was handled
    except OSError:
        pass  # the front ended the connection (GOAWAY ENHANCE_YOUR_CALM, say): also a defence
    await assert_serves(conn.address)
    assert 0 < peak <= limit, f"{peak} calls were open at once; the front advertises {limit} concurrent streams"


async def test_one_stream_over_max_concurrent_streams_is_refused(conn, sandbox):
    """As many Slow calls as the front allows, then one more: that one is refused (REFUSED_STREAM, which
    tells the client it may retry, preferred; a gRPC RESOURCE_EXHAUSTED or UNAVAILABLE accepted), the
    open ones stay open, and once one ends the connection takes calls again."""
    limit = conn.settings.get(SettingsFrame.MAX_CONCURRENT_STREAMS)
    assert limit is not None, "the front advertises no SETTINGS_MAX_CONCURRENT_STREAMS: any client opens any number"
    slow = [conn.next_stream() for _ in range(limit)]
    await conn.send(*(frame for stream in slow for frame in conn.call(stream, "/test.Echo/Slow")))
    extra = conn.next_stream()
    await conn.send(*conn.call(extra))
    end = await conn.finish(extra)
    if isinstance(end, RstStreamFrame):
        assert end.error_code == ErrorCodes.REFUSED_STREAM, describe(end)
    else:
        assert isinstance(end, HeadersFrame), f"the call over the limit got {describe(end)}"
        assert conn.heads[extra][-1].get(b"grpc-status") in (b"8", b"14"), conn.heads[extra]
    assert not {s for s in slow if s in conn.heads or s in conn.resets}, "a Slow call within the limit ended"
    await conn.send(RstStreamFrame(slow[0], ErrorCodes.CANCEL))
    await conn.unary()


@pytest.mark.parametrize("kind", ["even stream id", "stream id lower than one used"])
async def test_headers_on_a_bad_stream_id_is_protocol_error(conn, kind):
    if kind == "even stream id":
        stream = 2
    else:
        conn.ids = itertools.count(5, 2)
        await conn.unary()  # stream 5
        stream = 3
    await conn.send(conn.head(stream, end_stream=True))
    await assert_connection_error(conn, ErrorCodes.PROTOCOL_ERROR)


async def test_a_header_block_that_is_not_hpack_is_compression_error(conn, gateway, caplog):
    # An indexed field, index 200 (7-bit prefix: 127, then 73), with an empty dynamic table: 61 static entries.
    caplog.set_level("INFO", logger="gateway.grpc")
    await conn.send(HeadersFrame(conn.next_stream(), b"\xff\x49", flags=["END_HEADERS", "END_STREAM"]))
    await assert_connection_error(conn, ErrorCodes.COMPRESSION_ERROR)
    assert any("COMPRESSION_ERROR: the header block is not valid HPACK" in r.getMessage() for r in caplog.records)
    metrics = gateway.metrics.exposition()[0].decode()
    assert 'sgw_grpc_connection_errors_total{code="COMPRESSION_ERROR",peer="client"} 1.0' in metrics


@pytest.mark.parametrize("stream", ["0", "idle"])
async def test_data_on_stream_0_or_an_idle_stream_is_protocol_error(conn, stream):
    stream_id = 0 if stream == "0" else conn.next_stream()
    await conn.send(frame_bytes(DataFrame.type, stream_id, grpc_message(b"x")))
    await assert_connection_error(conn, ErrorCodes.PROTOCOL_ERROR)


async def test_push_promise_from_a_client_is_protocol_error(conn):
    stream = conn.next_stream()
    await conn.send(conn.head(stream, "/test.Echo/Slow"),
                    PushPromiseFrame(stream, promised_stream_id=2, data=conn.encoder.encode(request_head("/x.Y/Z")),
                                     flags=["END_HEADERS"]))
    await assert_connection_error(conn, ErrorCodes.PROTOCOL_ERROR)


async def test_no_preface_gets_the_connection_closed(gateway):
    conn = await RawConnection.open(gateway.grpc_address, handshake=False)
    try:
        await conn.send(b"GET / HTTP/1.1\r\nHost: gateway\r\n\r\n")
        await conn.closes()  # a GOAWAY first is allowed
    finally:
        conn.close()
    await assert_serves(gateway.grpc_address)


# -- flow control ------------------------------------------------------------------------------------------

async def test_window_update_of_0_on_the_connection_is_protocol_error(conn):
    await conn.send(frame_bytes(WindowUpdateFrame.type, 0, struct.pack("!I", 0)))
    await assert_connection_error(conn, ErrorCodes.PROTOCOL_ERROR)


async def test_window_update_past_2_31_on_the_connection_is_flow_control_error(conn):
    await conn.send(WindowUpdateFrame(0, MAX_WINDOW))  # on top of the initial 65,535
    await assert_connection_error(conn, ErrorCodes.FLOW_CONTROL_ERROR)


async def test_window_update_past_2_31_on_a_stream_is_a_stream_error(conn, sandbox):
    stream = conn.next_stream()
    await conn.send(*conn.call(stream, "/test.Echo/Slow"), WindowUpdateFrame(stream, MAX_WINDOW))
    await assert_stream_error(conn, stream, ErrorCodes.FLOW_CONTROL_ERROR)


async def test_data_beyond_the_advertised_window_is_flow_control_error(conn, sandbox):
    """DATA on a Sink call (the sandbox reads nothing), ignoring every window. What the front may take is
    what it advertised plus what it acknowledged while relaying to the sandbox until the sandbox's own
    windows filled: a few MiB. 64 MiB is far past any of it; FLOW_CONTROL_ERROR, on the stream or the
    connection, must come before."""
    stream, size = conn.next_stream(), max_frame(conn)
    total = 64 * 1024 * 1024
    batch = DataFrame(stream, b"d" * size).serialize() * (256 * 1024 // size)
    chunks = itertools.chain([conn.head(stream, "/test.Echo/Sink").serialize()],
                             itertools.repeat(batch, total // (256 * 1024)))
    end, written = await flood(conn, chunks, stream)
    assert end is not None and end.error_code == ErrorCodes.FLOW_CONTROL_ERROR, \
        f"after {written / 2**20:.1f} MiB of DATA written: {describe(end)}"
    await assert_serves(conn.address)



async def test_streams_reset_while_they_wait_give_the_connection_window_back(conn):
    """Rapid reset with request bytes: in one write, as many streams as the front runs calls (each opened and
    reset at once: their calls have not ended yet, so they count), then one more than that again, each with a
    705-byte message, each reset while it waits for a call to end (the waiting queue fills, and the reset
    ones are dropped from it). Sixteen such writes, then a unary call: every byte sent was taken or dropped,
    so the connection's window must be open again but for what the front may hold back before a
    WINDOW_UPDATE (a quarter of it). A window that leaks stalls the connection for good."""
    limit = conn.settings[SettingsFrame.MAX_CONCURRENT_STREAMS]
    message = grpc_message(b"w" * 700)
    sent = 0
    for _ in range(16):
        batch = [conn.head(stream).serialize() + RstStreamFrame(stream, ErrorCodes.CANCEL).serialize()
                 for stream in itertools.islice(conn.ids, limit)]
        batch += [conn.head(stream).serialize() + DataFrame(stream, message).serialize() +
                  RstStreamFrame(stream, ErrorCodes.CANCEL).serialize()
                  for stream in itertools.islice(conn.ids, limit + 1)]
        await conn.send(b"".join(batch))
        sent += (limit + 1) * len(message)
        await conn.ping(b"batch ok")
    await conn.unary()
    sent += len(grpc_message(b"still serving"))
    await conn.ping(b"windowed")  # a WINDOW_UPDATE queued by then has arrived
    window = 65_535 + conn.opened.get(0, 0) - sent
    assert window > 3 * 2**20, f"the connection's window is {window} bytes once every call ended ({sent} sent)"


async def test_a_stopping_gateway_sends_goaway_first_and_lets_open_calls_finish(conn, gateway, sandbox):
    """Not hostile, but told the same way: stop() sends GOAWAY (NO_ERROR) at once, so a client opens new
    calls elsewhere; a stream it opens before it knows is refused (REFUSED_STREAM, which clients retry);
    the call already open is not cut by the GOAWAY (it ends only when the drain time is over)."""
    service, _ = sandbox
    slow = conn.next_stream()
    await conn.send(*conn.call(slow, "/test.Echo/Slow"))
    await asyncio.wait_for(service.slow_started.wait(), IO)
    stopping = asyncio.ensure_future(gateway.stop())
    try:
        end = await conn.ending()
        assert isinstance(end, GoAwayFrame) and end.error_code == ErrorCodes.NO_ERROR, describe(end)
        assert end.last_stream_id == slow and slow not in conn.heads and slow not in conn.resets
        late = conn.next_stream()
        await conn.send(*conn.call(late))
        assert describe(await conn.ending(late)) == describe(RstStreamFrame(late, ErrorCodes.REFUSED_STREAM))
        assert not service.cancelled.is_set()  # the open call still runs in the sandbox
    finally:
        await stopping
