"""Relaying one direction of a call: the receive buffer of a stream and the loop that forwards it.

:class:`RelayBuffer` is each stream's receive buffer (``Stream.buffer``): the
connection adds DATA payloads as they arrive, and it hands the relay everything
received so far in one piece, acknowledged in one call. The relay forwards
those bytes as they are, one ``send_data`` per piece, and only scans them for
message boundaries: to count messages and to notice a stream that ends in the
middle of one. (Reading prefix by prefix, as a codec would, cost two reads, an
acknowledgement and a send per message: half the gateway's time in a stream of
small messages, profiled under grpclib.)

Flow control stays end to end: bytes are acknowledged (the sender's stream
window reopened) only when the relay takes them, and the relay takes the next
piece only after ``send_data`` has passed the previous one on, which waits for
the receiver's window and for the transport. What a call holds per direction
is the stream window it granted plus one piece (``CHUNK``, at most one DATA
frame more).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING


if TYPE_CHECKING:
    from gateway.grpcfront.stream import Stream

CHUNK = 64 * 1024
_SIZE = struct.Struct("!xI").unpack_from  # a message's length prefix: compression flag, 4-byte big-endian size


class Truncated(Exception):
    """A stream ended in the middle of a message."""


class RelayBuffer:
    """A stream's receive buffer, read whole by :func:`relay`."""

    __slots__ = ("_ack", "_stream_id", "_chunks", "size", "_ended", "_waiter", "_loop")

    def __init__(self, ack: Callable[[int, int], None], stream_id: int = 0,
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop  # the connection's (asyncio.get_running_loop() costs a getpid() syscall on 3.11)
        self._ack = ack                                   # ack(stream_id, n) opens the sender's window by n bytes
        self._stream_id = stream_id
        self._chunks: deque[tuple[bytes, int]] = deque()  # (DATA payload, its flow-controlled length)
        self.size = 0                                     # bytes received and not yet taken
        self._ended = False                               # the sender ended the stream
        self._waiter: asyncio.Future[None] | None = None

    # -- the connection's side -------------------------------------------------------
    def add(self, data: bytes, ack_size: int) -> None:
        if not data:  # an empty DATA frame (legal mid-stream; perhaps padded): nothing to hold, b"" means the end
            if ack_size:
                self._ack(self._stream_id, ack_size)
            return
        self._chunks.append((data, ack_size))
        self.size += len(data)
        self._wake()

    def eof(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def peek(self) -> bytes:
        """Everything received and not yet taken, left in place."""
        chunks = self._chunks
        if len(chunks) == 1:  # a unary request, typically: its one DATA payload
            return chunks[0][0]
        return b"".join([data for data, _ in chunks])

    # -- the relay's side -------------------------------------------------------------
    @property
    def complete(self) -> bool:
        """The sender ended the stream: what is buffered is all there will be."""
        return self._ended

    async def take(self) -> bytes:
        """The bytes received so far, whole DATA payloads up to about CHUNK, acknowledged; b"" at the end."""
        chunks = self._chunks
        while not chunks:
            if self._ended:
                return b""
            waiter = self._waiter = (self._loop or asyncio.get_running_loop()).create_future()
            await waiter
        return self.take_now()

    def take_now(self) -> bytes:
        """What :meth:`take` returns when something is buffered (b"" when nothing is)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data, owed = chunks.popleft()
        if chunks and len(data) < CHUNK:
            parts = [data]
            taken = len(data)
            while chunks and taken < CHUNK:
                part, ack = chunks.popleft()
                parts.append(part)
                taken += len(part)
                owed += ack
            data = b"".join(parts)
        self.size -= len(data)
        if owed:
            self._ack(self._stream_id, owed)
        return data


def scan(data: bytes, left: int, prefix: bytes) -> tuple[int, int, bytes]:
    """Message boundaries in the next piece of a stream: ``(messages begun, left, prefix)``.

    ``left`` is how many bytes of the current message's body are still to come, ``prefix``
    the start of a length prefix that the previous piece ended inside (then ``left`` is 0);
    both are passed back in with the next piece. A stream ends cleanly when both are empty.
    """
    size = len(data)
    count = 0
    pos = 0
    if prefix:
        need = 5 - len(prefix)
        if size < need:
            return 0, 0, prefix + data
        left = _SIZE(prefix + data[:need], 0)[0]
        count = 1
        pos = need
    if left >= size - pos:
        return count, left - (size - pos), b""
    pos += left
    while pos < size:
        if pos + 5 > size:
            return count, 0, data[pos:]
        end = pos + 5 + _SIZE(data, pos)[0]
        count += 1
        if end >= size:
            return count, end - size, b""
        pos = end
    return count, 0, b""


async def relay(src: Stream, dst: Stream, end_stream: bool = False) -> int:
    """Forward ``src``'s DATA bytes to ``dst`` until ``src`` ends; returns how many messages passed.

    Where it cannot have to wait, ``stream.relay_now`` does the same without a coroutine. With ``end_stream``,
    ``dst`` is ended too: on the last piece's DATA frame when ``src`` has
    ended by then (a unary request: one frame), otherwise by an empty one. Raises
    :class:`Truncated` if ``src`` ends inside a message (what came of it has been forwarded).
    """
    buffer: RelayBuffer = src.buffer  # type: ignore[assignment]
    take = buffer.take
    send = dst.send_data
    count = 0
    left = 0
    prefix = b""
    while True:
        data = await take()
        if not data:
            if left or prefix:
                raise Truncated
            if end_stream:
                await dst.end()
            return count
        begun, left, prefix = scan(data, left, prefix)
        count += begun
        if end_stream and buffer.complete and not buffer.size:  # this is the last piece: end with it
            if left or prefix:
                raise Truncated
            await send(data, True)
            return count
        await send(data)
