"""The gRPC front's relay pieces on their own: message boundaries, the receive buffer, batched writes, h2's repr.

The end-to-end behaviour (byte-exactness, flow control both ways, cancellation)
is in test_grpc_front.py and test_grpc_grpcio.py; these pin the parts whose
mistakes would only show under particular packet boundaries or timings.
"""

from __future__ import annotations

import asyncio
import builtins
import io
import random
import socket
import struct

import h2.connection
import pytest
from h2.config import H2Configuration, OutputLogger
from hyperframe.frame import DataFrame, SettingsFrame

from gateway.grpcfront.relay import CHUNK, RelayBuffer, scan
from gateway.grpcfront.wire import BatchingTransport, defer_h2_frame_repr


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
    assert buffer.size == 15 and buffer.unacked_size() == 19 and acked == []
    assert await buffer.take() == b"a" * 10 + b"b" * 5
    assert acked == [19] and buffer.size == 0 and buffer.unacked_size() == 0
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
    assert len(first) == CHUNK and acked == [CHUNK]
    assert buffer.unacked_size() == 10 * len(frame) - CHUNK


class _RecordingTransport:
    """A hand-written stand-in for an asyncio transport: records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


async def test_writes_of_one_loop_step_go_out_as_one_in_order():
    real = _RecordingTransport()
    batching = BatchingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
    batching.write(b"one ")
    batching.write(b"")
    batching.write(b"two ")
    batching.write(b"three")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"one two three"]
    batching.write(b"four")
    batching.close()  # what is pending goes out before the close
    assert real.writes == [b"one two three", b"four"] and real.closed
    await asyncio.sleep(0)
    assert real.writes == [b"one two three", b"four"]


async def test_a_batched_connection_delivers_everything_before_closing():
    """Over a real socket: bytes written just before close() reach the peer."""
    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=left)
    reader, writer = await asyncio.open_connection(sock=right)
    batching = BatchingTransport(transport, loop)  # type: ignore[arg-type]
    for i in range(100):
        batching.write(b"%03d," % i)
    batching.close()
    assert await reader.read() == b"".join(b"%03d," % i for i in range(100))
    writer.close()
    await writer.wait_closed()


def test_h2_still_logs_every_frame_it_receives_when_asked_to():
    """The deferred repr changes when h2's trace line is formatted, not what it says."""
    defer_h2_frame_repr()
    frame = DataFrame(1, b"payload")
    assert str(h2.connection.repr(frame)) == builtins.repr(frame)  # type: ignore[attr-defined]
    out = io.StringIO()
    conn = h2.connection.H2Connection(H2Configuration(client_side=True, logger=OutputLogger(out, trace_level=True)))
    conn.initiate_connection()
    settings = SettingsFrame(0)
    conn.receive_data(settings.serialize())
    assert f"Received frame: {builtins.repr(settings)}" in out.getvalue()


def test_h2_formats_no_frame_when_nothing_logs_it():
    defer_h2_frame_repr()
    formatted = []

    class _Counting(SettingsFrame):
        def __repr__(self) -> str:
            formatted.append(self)
            return "counted"

    conn = h2.connection.H2Connection(H2Configuration(client_side=True))
    conn.initiate_connection()
    # h2 dispatches on the exact frame class: route the subclass as SETTINGS, then feed it through h2's real path
    conn._frame_dispatch_table[_Counting] = conn._frame_dispatch_table[SettingsFrame]
    conn._receive_frame(_Counting(0))
    assert formatted == []
    assert conn.data_to_send().endswith(SettingsFrame(0, flags=["ACK"]).serialize())  # it was received and acked
