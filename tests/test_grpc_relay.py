"""The gRPC front's relay pieces on their own: message boundaries, the receive buffer, the frame layer.

The end-to-end behaviour (byte-exactness, flow control both ways, cancellation)
is in test_grpc_front.py and test_grpc_grpcio.py; these pin the parts whose
mistakes would only show under particular packet boundaries or timings.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct

import h2.connection
import h2.events
import pytest
from h2.config import H2Configuration

from gateway.grpcfront import frames
from gateway.grpcfront.head import forwardable
from gateway.grpcfront.connection import Connection
from gateway.grpcfront.relay import CHUNK, RelayBuffer, scan
from gateway.grpcfront.stream import Stream
from gateway.grpcfront.upstream import UpstreamChannels
from tests.grpc_helpers import echo_server


def _message(size: int, compressed: int = 0) -> bytes:
    return bytes([compressed]) + struct.pack("!I", size) + bytes(range(256)) * (size // 256) + b"m" * (size % 256)


def _scan_all(pieces: list[bytes]) -> tuple[int, int, bytes]:
    count, left, prefix = 0, 0, b""
    for piece in pieces:
        begun, left, prefix = scan(piece, left, prefix)
        count += begun
    return count, left, prefix


def _cuts(data: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


STREAM = b"".join(_message(n, n % 2) for n in (0, 1, 4, 5, 64, 300, 70_000, 0))


@pytest.mark.parametrize("points", [
    pytest.param([], id="one piece"),
    pytest.param(list(range(1, len(STREAM))), id="byte by byte"),
    pytest.param([1, 3, 7, 9], id="cut inside the first prefixes"),
    pytest.param([5, 10, 15], id="cut at message edges"),
    pytest.param([len(STREAM) - 3], id="cut inside the last prefix"),
])
def test_scan_counts_every_message_however_the_stream_is_cut(points):
    assert _scan_all(_cuts(STREAM, points)) == (8, 0, b"")


def test_scan_on_random_cuts():
    rng = random.Random(18)
    for _ in range(500):
        messages = [_message(rng.choice([0, 1, 3, 5, 64, 17_000])) for _ in range(rng.randint(0, 6))]
        data = b"".join(messages)
        points = rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 10))) if len(data) > 1 else []
        assert _scan_all(_cuts(data, points)) == (len(messages), 0, b"")


@pytest.mark.parametrize(("data", "left", "prefix"), [
    pytest.param(_message(10)[:3], 0, _message(10)[:3], id="inside a prefix"),
    pytest.param(_message(10)[:5], 10, b"", id="after a prefix"),
    pytest.param(_message(10)[:12], 3, b"", id="inside a body"),
    pytest.param(_message(0) + _message(70_000)[:-1], 1, b"", id="one byte short"),
])
def test_scan_reports_a_stream_that_stops_inside_a_message(data, left, prefix):
    """What relay() turns into Truncated when the stream ends there."""
    count, got_left, got_prefix = _scan_all(_cuts(data, [1, 2]) if len(data) > 2 else [data])
    assert (got_left, got_prefix) == (left, prefix)


async def test_the_buffer_opens_the_window_only_for_what_is_taken():
    acked: list[int] = []
    buffer = RelayBuffer(lambda stream_id, size: acked.append(size), 1)
    buffer.add(b"a" * 10, 10)
    buffer.add(b"b" * 5, 9)  # padding counts towards the window, not the data
    assert buffer.size == 15 and acked == []
    assert await buffer.take() == b"a" * 10 + b"b" * 5
    assert acked == [19] and buffer.size == 0
    waiting = asyncio.ensure_future(buffer.take())
    await asyncio.sleep(0)
    assert not waiting.done()  # nothing to take: waits for data
    buffer.add(b"c", 1)
    assert await waiting == b"c"
    buffer.eof()
    assert buffer.complete and await buffer.take() == b""


async def test_an_empty_data_frame_is_not_the_end_of_the_stream():
    """HTTP/2 allows empty DATA frames mid-stream, padded or not; only END_STREAM ends the relay."""
    acked: list[int] = []
    buffer = RelayBuffer(lambda stream_id, size: acked.append(size), 1)
    buffer.add(b"", 0)
    buffer.add(b"", 8)  # padding only: the window is reopened at once, there is nothing to hold
    assert acked == [8] and buffer.size == 0
    buffer.add(b"more", 4)
    assert await buffer.take() == b"more"
    waiting = asyncio.ensure_future(buffer.take())
    buffer.add(b"", 0)
    await asyncio.sleep(0)
    assert not waiting.done()
    buffer.eof()
    assert await waiting == b""


async def test_the_buffer_hands_out_about_a_chunk_at_a_time():
    """The bound on what a call holds: one piece of about CHUNK (whole DATA payloads), not all received."""
    acked: list[int] = []
    buffer = RelayBuffer(lambda stream_id, size: acked.append(size), 1)
    frame = b"x" * 16_384
    for _ in range(10):
        buffer.add(frame, len(frame))
    first = await buffer.take()
    assert len(first) == CHUNK and acked == [CHUNK] and buffer.size == 10 * len(frame) - CHUNK


class _RecordingTransport:
    """A hand-written stand-in for an asyncio transport: records each write; ``unread`` makes it a
    transport whose peer reads nothing (everything written stays in its buffer)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = self.unread = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self.writes)) if self.unread else 0

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True


class _Accepting:
    """A server-side connection handler that keeps the streams it is given."""

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self.lost = asyncio.Event()
        self.failures: list[int] = []  # the codes of the connection errors it was told of

    def connection_made(self, connection: Connection) -> None:
        pass

    def accept(self, stream: Stream) -> None:
        self.streams.append(stream)

    def connection_lost(self, connection: Connection) -> None:
        self.lost.set()

    def connection_failed(self, code: int) -> None:
        self.failures.append(code)


def _h2_client() -> h2.connection.H2Connection:
    """h2 as an independent peer: what it accepts from us is well-formed HTTP/2."""
    peer = h2.connection.H2Connection(H2Configuration(client_side=True, header_encoding=None))
    peer.initiate_connection()
    return peer


def _serving() -> tuple[_RecordingTransport, _Accepting, Connection, h2.connection.H2Connection]:
    """A server-side connection and an h2 client that has queued a request head on stream 1."""
    transport = _RecordingTransport()
    handler = _Accepting()
    connection = Connection(handler, client_side=False)
    connection.connection_made(transport)
    peer = _h2_client()
    peer.send_headers(1, [(b":method", b"POST"), (b":path", b"/a.B/C"), (b":scheme", b"http"),
                          (b":authority", b"x"), (b"content-type", b"application/grpc")])
    return transport, handler, connection, peer


async def test_writes_of_one_loop_step_go_out_as_one_in_order():
    transport = _RecordingTransport()
    connection = Connection(_Accepting(), client_side=False)
    connection.connection_made(transport)
    connection.data_received(frames.PREFACE)
    assert transport.writes == []  # our SETTINGS and window, answering the preface, are queued, not yet written
    connection.write(b"one ")
    connection.write(b"two")
    await asyncio.sleep(0)
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"one two")
    connection.write(b"three")
    connection.close(message="bye")  # what is pending goes out before the close, the GOAWAY last
    assert transport.closed and transport.writes[1].startswith(b"three")
    assert transport.writes[1][3 + 5:3 + 6] == bytes([frames.GOAWAY])


async def test_a_request_from_h2_becomes_a_stream_and_its_answer_reads_back_in_h2():
    """Headers, DATA (split over several frames by our window and frame size), trailers, as h2 sees them."""
    transport, handler, connection, peer = _serving()
    peer.send_data(1, b"\x00\x00\x00\x00\x02hi", end_stream=True)
    connection.data_received(peer.data_to_send())
    [stream] = handler.streams
    assert (b":path", b"/a.B/C") in stream.headers and stream.buffer.complete
    assert await stream.buffer.take() == b"\x00\x00\x00\x00\x02hi"
    stream.send_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    body = bytes(range(256)) * 200  # over 16 KiB: more than one frame
    await stream.send_data(body)
    stream.send_headers([(b"grpc-status", b"0")], end_stream=True)
    await asyncio.sleep(0)
    events = peer.receive_data(b"".join(transport.writes))
    kinds = [type(event) for event in events]
    assert h2.events.ResponseReceived in kinds and h2.events.TrailersReceived in kinds
    assert b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived)) == body
    assert [e for e in events if isinstance(e, h2.events.TrailersReceived)][0].headers == [(b"grpc-status", b"0")]
    assert not connection.streams  # closed both ways: forgotten


async def test_a_lone_streams_writes_go_out_at_the_end_of_the_step_and_others_wait_one_more_step():
    """With one stream open, a loop step's writes go out as one send at its end; with others open, at the
    end of the next step, joined by what that step writes (the calls its reads woke). flush() writes at once,
    and the send it made redundant writes nothing more."""
    transport, handler, connection, peer = _serving()
    connection.data_received(peer.data_to_send())
    connection.flush()
    transport.writes.clear()
    [first] = handler.streams
    first.send_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])
    await asyncio.sleep(0)
    assert len(transport.writes) == 1  # alone: at the end of the step
    peer.send_headers(3, [(b":method", b"POST"), (b":path", b"/a.B/C"), (b":scheme", b"http"),
                          (b":authority", b"x"), (b"content-type", b"application/grpc")])
    connection.data_received(peer.data_to_send())
    second = handler.streams[1]
    first.send_headers([(b"grpc-status", b"0")], end_stream=True)
    await asyncio.sleep(0)
    assert len(transport.writes) == 1  # another stream is open: it waits a step
    second.send_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])  # the next step's
    await asyncio.sleep(0)
    assert len(transport.writes) == 2
    kinds = [(kind, stream_id) for kind, _, stream_id, _ in _frames(transport.writes[1])]
    assert (frames.HEADERS, 1) in kinds and (frames.HEADERS, 3) in kinds  # one send
    second.send_headers([(b"grpc-status", b"0")], end_stream=True)
    connection.flush()
    assert len(transport.writes) == 3  # at once
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert len(transport.writes) == 3  # the queued send had nothing left


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(type, flags, stream id, payload) of each whole frame in ``data``."""
    found, pos = [], 0
    while pos + 9 <= len(data):
        size = int.from_bytes(data[pos:pos + 3], "big")
        found.append((data[pos + 3], data[pos + 4], int.from_bytes(data[pos + 5:pos + 9], "big"),
                      data[pos + 9:pos + 9 + size]))
        pos += 9 + size
    return found


def test_a_long_header_block_is_split_into_continuation_frames():
    block = bytes(40_000)
    found = _frames(frames.header_frames(3, block, True, 16_384))
    assert b"".join(payload for *_, payload in found) == block
    assert [(kind, flags, stream_id) for kind, flags, stream_id, _ in found] == [
        (frames.HEADERS, frames.END_STREAM, 3), (frames.CONTINUATION, 0, 3),
        (frames.CONTINUATION, frames.END_HEADERS, 3)]


async def test_a_streams_window_and_the_connections_open_as_the_relay_takes():
    """A stream's WINDOW_UPDATEs follow what the relay has taken, a quarter of its window at a time (what
    a call holds is bounded by it); so do the connection's (what all of a connection's calls hold is
    bounded by its window, not by their windows added up). One stuck call holds its stream's window of
    the connection's, a quarter of it here, and the calls sharing the connection have the rest."""
    from gateway.grpcfront.stream import STREAM_WINDOW

    transport, handler, connection, peer = _serving()
    connection.data_received(peer.data_to_send())
    await asyncio.sleep(0)
    peer.receive_data(b"".join(transport.writes))  # our SETTINGS and windows
    [stream] = handler.streams
    transport.writes.clear()
    chunk = b"z" * 16_384
    for _ in range(STREAM_WINDOW // len(chunk)):  # the stream's whole window
        peer.send_data(1, chunk)
    connection.data_received(peer.data_to_send())
    await asyncio.sleep(0)
    arrived = [e for e in peer.receive_data(b"".join(transport.writes)) if isinstance(e, h2.events.WindowUpdated)]
    assert arrived == []  # nothing yet: the bytes are held, not handed on
    transport.writes.clear()
    taken = 0
    while taken < STREAM_WINDOW:
        taken += len(await stream.buffer.take())
    await asyncio.sleep(0)
    updates = [e for e in peer.receive_data(b"".join(transport.writes)) if isinstance(e, h2.events.WindowUpdated)]
    for stream_id in (0, 1):
        deltas = [e.delta for e in updates if e.stream_id == stream_id]
        assert sum(deltas) == STREAM_WINDOW and min(deltas) >= STREAM_WINDOW // 4, (stream_id, deltas)


async def test_a_connection_delivers_everything_before_closing():
    """Over a real socket: frames queued just before close() reach the peer, the GOAWAY last."""
    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    handler = _Accepting()
    _, connection = await loop.create_connection(lambda: Connection(handler, client_side=False), sock=left)
    reader, writer = await asyncio.open_connection(sock=right)
    for i in range(100):
        connection.write(frames.frame(frames.PING, frames.ACK, 0, b"%08d" % i))
    connection.close(message="done")
    found = _frames(await reader.read())
    assert [payload for kind, _, _, payload in found if kind == frames.PING] == [b"%08d" % i for i in range(100)]
    assert found[-1][0] == frames.GOAWAY and found[-1][3].endswith(b"done")
    await handler.lost.wait()
    writer.close()
    await writer.wait_closed()


def test_what_a_sandbox_answers_reaches_the_client_only_as_valid_http2():
    """Connection-specific fields, stray pseudo-headers and upper-case names make an HTTP/2 message
    malformed (RFC 9113 8.2.2, 8.3): the gateway drops them rather than send them on; the rest is kept
    in order, and a clean list is passed through as is."""
    head = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"connection", b"close"),
            (b":path", b"/x"), (b"X-Upper", b"1"), (b"te", b"trailers"), (b"x-kept", b"2")]
    assert forwardable(head, head=True) == [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                            (b"x-kept", b"2")]
    trailers = [(b":status", b"200"), (b"grpc-status", b"0"), (b"keep-alive", b"1")]
    assert forwardable(trailers, head=False) == [(b"grpc-status", b"0")]
    clean = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    assert forwardable(clean, head=True) is clean


def test_names_found_forwardable_are_remembered_per_kind_and_bounded():
    """forwardable remembers the names it found allowed (a sandbox sends the same few every call): a head's
    :status, remembered, is still dropped from trailers, a dropped name is never remembered, and a sandbox
    that invents names does not grow what is remembered past its bound."""
    from gateway.grpcfront import head as module

    head = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    for _ in range(2):
        assert forwardable(head, head=True) is head
        assert forwardable([(b":status", b"200"), (b"grpc-status", b"0")], head=False) == [(b"grpc-status", b"0")]
        assert forwardable([(b"X-Upper", b"1"), (b"te", b"trailers")], head=True) == []
    assert b"X-Upper" not in module._ALLOWED_NAMES[True] and b":status" not in module._ALLOWED_NAMES[False]
    for n in range(3 * module._ALLOWED_REMEMBERED):
        names = [(b"x-made-up-%d" % n, b"1")]
        assert forwardable(names, head=False) is names
    assert len(module._ALLOWED_NAMES[False]) <= module._ALLOWED_REMEMBERED


async def test_a_connection_to_a_sandbox_that_went_away_is_forgotten():
    """What the front keeps is bounded by the sandboxes in use, not by every sandbox ever called."""
    channels = UpstreamChannels(connect_timeout=2.0)
    async with echo_server() as (_, port):
        connection = await channels.connection(("127.0.0.1", port))
        assert len(channels) == 1 and await channels.connection(("127.0.0.1", port)) is connection
    await connection.wait_closed()  # the sandbox's server closed it
    assert len(channels) == 0
    channels.close()


async def test_a_window_the_peer_shrank_below_zero_holds_back_even_the_end_of_the_stream():
    """SETTINGS_INITIAL_WINDOW_SIZE lowered mid-stream can leave a stream's send window negative:
    nothing flow-controlled may be sent, an empty END_STREAM DATA frame included, until WINDOW_UPDATEs
    bring it back (RFC 9113 6.9.2; h2, the peer here, rejects the frame otherwise)."""
    transport, handler, connection, peer = _serving()
    connection.data_received(peer.data_to_send())
    [stream] = handler.streams
    stream.send_headers([(b":status", b"200")])
    await stream.send_data(b"d" * 1000)  # within the default 65,535
    await asyncio.sleep(0)
    peer.receive_data(b"".join(transport.writes))
    transport.writes.clear()
    peer.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    connection.data_received(peer.data_to_send())
    assert stream.send_window == 100 - 1000
    ending = asyncio.ensure_future(stream.end())
    await asyncio.sleep(0)
    assert not ending.done()
    connection.flush()  # whatever the blocked end queued
    assert not [kind for kind, *_ in _frames(b"".join(transport.writes)) if kind == frames.DATA]
    peer.receive_data(b"".join(transport.writes))  # our SETTINGS ACK: h2 applies the smaller window
    transport.writes.clear()
    peer.increment_flow_control_window(900, stream_id=1)
    connection.data_received(peer.data_to_send())
    await ending
    await asyncio.sleep(0)
    events = peer.receive_data(b"".join(transport.writes))
    assert any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in events)


async def test_a_caller_cancelled_while_the_shared_connection_is_made_does_not_fail_the_others():
    """Calls that find no connection share one attempt; the first caller's client leaving (its task
    cancelled) must not cancel that attempt for the calls waiting on it."""
    channels = UpstreamChannels(connect_timeout=2.0)
    async with echo_server() as (_, port):
        target = ("127.0.0.1", port)
        first = asyncio.ensure_future(channels.connection(target))
        second = asyncio.ensure_future(channels.connection(target))
        await asyncio.sleep(0)  # both are waiting on the one attempt
        first.cancel()
        connection = await second
        assert connection.has_slot and len(channels) == 1
        channels.close()
        await connection.wait_closed()


async def test_a_peer_that_floods_pings_and_reads_nothing_is_cut_off(monkeypatch):
    """Each PING must be answered; a peer that sends them without reading the answers would grow our
    write buffer without end (a sandbox is untrusted code): past MAX_BACKLOG the connection is aborted."""
    from gateway.grpcfront import connection as module

    MAX_BACKLOG = 1024 * 1024  # 32 MiB in service; the mechanism is the same
    monkeypatch.setattr(module, "MAX_BACKLOG", MAX_BACKLOG)
    transport, handler, connection, peer = _serving()
    connection.data_received(peer.data_to_send())
    transport.unread = True
    connection.pause_writing()
    ping = frames.frame(frames.PING, 0, 0, b"12345678")
    sent = 0
    while not transport.aborted and sent < 2 * MAX_BACKLOG:
        connection.data_received(ping * 4096)
        connection.flush()
        sent += len(ping) * 4096
    assert transport.aborted and sent <= MAX_BACKLOG + 17 * 4096 * 2
    assert handler.failures == [frames.ENHANCE_YOUR_CALM]  # counted once (closing flushes the GOAWAY too)
