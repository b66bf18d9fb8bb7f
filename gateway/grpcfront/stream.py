"""One HTTP/2 stream of a :class:`~gateway.grpcfront.connection.Connection`: head, trailers, buffer, windows."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from gateway.grpcfront.frames import (
    CANCEL, DATA, END_STREAM, NO_ERROR, PROTOCOL_ERROR, STREAM_CLOSED, StreamFailure, frame, window_update
)
from gateway.grpcfront.headers import trailers_problem
from gateway.grpcfront.relay import CHUNK, RelayBuffer, Truncated, scan

Headers = list[tuple[bytes, bytes]]

STREAM_WINDOW = 1024 * 1024  # what each stream may have in flight towards us: what a call holds, per direction


class StreamClosed(ConnectionError):
    """The stream was reset or its connection lost: nothing more can be sent or received on it."""


class StreamOwner(Protocol):
    """Who is told when a stream ends early: ``reset`` if the peer reset it, else its connection was lost."""

    def stream_ended(self, reset: bool) -> None: ...


class Endpoint:
    """What a stream uses of its connection: ``FrameReader``'s base (so ``Connection``'s), declared here, beside
    :class:`Stream`, so that the compiled build types ``Stream.conn`` (stream.pxd): its fields are C loads and its
    writers C calls. ``Connection`` itself cannot be named there (connection.pxd and inbound.pxd cimport this
    module's ``Stream``: a cycle Cython refuses). The methods are ``Connection``'s."""

    client_side: bool
    write_paused: bool
    send_window: int
    peer_initial_window: int
    peer_max_frame: int
    loop: asyncio.AbstractEventLoop
    blocked: set[Stream]

    def write(self, data: bytes) -> None: ...
    def reset_sent(self, stream_id: int, code: int) -> None: ...
    def write_headers(self, stream_id: int, headers: Any, end_stream: bool) -> None: ...
    def forget(self, stream: Stream) -> None: ...
    def released(self, stream: Stream) -> None: ...
    def ack(self, stream_id: int, size: int) -> None: ...
    def hold(self) -> None: ...
    def flush(self) -> None: ...
    def soon(self, callback: Callable[[], None]) -> None: ...
    async def drained(self) -> None: ...


class Stream:
    """One HTTP/2 stream: its received head and trailers, its receive buffer, its send window."""

    __slots__ = ("conn", "id", "headers", "trailers", "buffer", "send_window", "recv_window", "_unacked",
                 "local_closed", "remote_closed", "gone", "refused", "owner", "_head_waiter", "_window_waiter",
                 "released", "expected", "reset_code", "on_head", "held")

    def __init__(self, conn: Endpoint, stream_id: int) -> None:
        self.conn = conn
        self.id = stream_id
        self.headers: Headers | None = None
        self.trailers: Headers | None = None
        # acknowledged through the connection (by stream id), not a bound self.ack: the stream and its buffer
        # would hold each other, and every stream would be left to the cyclic GC instead of freed as it ends
        # (read through self.conn: the typed field, C loads in the compiled build; ``conn`` is an untyped argument)
        self.buffer = RelayBuffer(self.conn.ack, stream_id, self.conn.loop)
        self.send_window = self.conn.peer_initial_window
        self.recv_window = STREAM_WINDOW
        self._unacked = 0
        self.local_closed = False   # we sent END_STREAM (or reset)
        self.remote_closed = False  # the peer sent END_STREAM (or reset)
        self.gone = False           # reset (either way) or its connection lost
        self.refused = False        # the peer ended it unprocessed (REFUSED_STREAM, or GOAWAY below its id)
        self.owner: StreamOwner | None = None
        self._head_waiter: asyncio.Future[None] | None = None
        self._window_waiter: asyncio.Future[None] | None = None
        self.released = False
        self.expected: int | None = None  # server side: what content-length says is still to come, if it was sent
        self.reset_code: int | None = None  # the peer's RST_STREAM error code, if it reset the stream
        # Called soon (once the frames read with it are handled) when the head comes or the stream ends before it:
        # a call served by callbacks rather than a task waiting in recv_headers (Call.start)
        self.on_head: Callable[[], None] | None = None
        # Bytes of DATA received and not yet handed on by the relay: the connection's window reopens by them only as
        # the relay takes them (Connection.ack) or the stream ends (Connection.forget). So what one connection
        # buffers in all is its window, whatever its streams' windows add up to (256 x 1 MiB otherwise).
        self.held = 0

    @property
    def closable(self) -> bool:
        """We may still send on it (a final HEADERS, DATA or a reset)."""
        return not self.gone and not self.local_closed

    # -- sending ---------------------------------------------------------------
    def send_headers(self, headers: Headers | list[tuple[str, str]], end_stream: bool = False) -> None:
        if self.gone or self.local_closed:
            raise StreamClosed(f"stream {self.id} is closed")
        self.conn.write_headers(self.id, headers, end_stream)
        if end_stream:
            self._end_local()

    async def send_data(self, data: bytes, end_stream: bool = False) -> None:
        """Send ``data`` as DATA frames as the peer's windows and our transport allow."""
        conn = self.conn
        size = len(data)
        offset = 0
        while True:
            if self.gone or self.local_closed:
                raise StreamClosed(f"stream {self.id} is closed")
            if conn.write_paused:
                await conn.drained()
                continue
            count = min(size - offset, self.send_window, conn.send_window, conn.peer_max_frame)
            # A window below zero (the peer lowered SETTINGS_INITIAL_WINDOW_SIZE) holds back even an empty
            # DATA frame (RFC 9113 6.9.2); a window of zero only holds back data.
            if count < 0 or (count == 0 and offset < size):
                await self._wait_window()
                continue
            last = offset + count == size
            self.send_now(data if count == size else data[offset:offset + count], end_stream and last)
            offset += count
            if last:
                return

    def takes_now(self, size: int) -> bool:
        """``size`` bytes can be sent at once, in one DATA frame (:meth:`send_now`)."""
        conn = self.conn
        return (not self.gone and not self.local_closed and not conn.write_paused
                and size <= min(self.send_window, conn.send_window, conn.peer_max_frame))

    def send_now(self, piece: bytes, end_stream: bool = False) -> None:
        """Send ``piece`` as one DATA frame: where the windows and frame size take it (``send_data``'s pieces,
        or what :meth:`takes_now` said fits)."""
        conn = self.conn
        conn.write(frame(DATA, END_STREAM if end_stream else 0, self.id, piece))
        size = len(piece)
        self.send_window -= size
        conn.send_window -= size
        if end_stream:
            self._end_local()

    async def end(self) -> None:
        await self.send_data(b"", end_stream=True)

    def reset(self, code: int = CANCEL) -> None:
        """RST_STREAM: end the stream both ways now."""
        if self.gone:
            return
        self.conn.reset_sent(self.id, code)
        self._close(reset_by_peer=None)

    # -- receiving ---------------------------------------------------------------
    async def recv_headers(self) -> Headers:
        """The peer's head (client side: the response head; a trailers-only response ends the stream)."""
        while self.headers is None:
            if self.gone:
                raise StreamClosed(f"stream {self.id} ended before its head")
            waiter = self._head_waiter = self.conn.loop.create_future()
            await waiter
        return self.headers

    def release(self) -> None:
        """The stream's user is done with it: end it if it is not, free its slot."""
        if self.released:
            return
        self.released = True
        if not self.gone and not (self.local_closed and self.remote_closed):
            # NO_ERROR: our side is complete and the peer may stop sending (RFC 9113 8.1)
            self.reset(NO_ERROR if self.local_closed else CANCEL)
        self.conn.released(self)

    # -- the connection's side ----------------------------------------------------
    def received_headers(self, headers: Headers, end_stream: bool) -> None:
        if self.remote_closed:
            raise StreamFailure(self.id, STREAM_CLOSED, "HEADERS after the end of the stream")
        if self.headers is None:
            if self.conn.client_side and headers and headers[0][1][:1] == b"1" and headers[0][0] == b":status":
                return  # an informational (1xx) head: gRPC has none to forward
            self.headers = headers
            self._wake_head()
        elif end_stream:
            if not self.conn.client_side:
                problem = trailers_problem(headers)
                if problem is not None:
                    raise StreamFailure(self.id, PROTOCOL_ERROR, f"malformed trailers: {problem}")
                if self.expected:
                    raise StreamFailure(self.id, PROTOCOL_ERROR, f"{self.expected} bytes short of content-length")
            self.trailers = headers
        else:
            raise StreamFailure(self.id, PROTOCOL_ERROR, "trailers must end the stream")
        if end_stream:
            self.received_end()

    def counted(self, size: int, end_stream: bool) -> None:
        """``size`` bytes of DATA came on a stream whose head gave content-length: malformed if they do not
        add up to it (RFC 9113 8.1.1)."""
        left = self.expected = self.expected - size  # type: ignore[operator]
        if left < 0 or (end_stream and left):
            raise StreamFailure(self.id, PROTOCOL_ERROR, "the DATA does not add up to content-length")

    def received_end(self) -> None:
        self.remote_closed = True
        self.buffer.eof()
        if self.local_closed:
            self.conn.forget(self)

    def window_opened(self) -> None:
        waiter, self._window_waiter = self._window_waiter, None
        _resolve(waiter)

    def ack(self, size: int) -> None:
        """The relay took ``size`` bytes: reopen the peer's stream window a quarter at a time."""
        if self.remote_closed or self.gone:
            return
        self._unacked += size
        if self._unacked >= STREAM_WINDOW // 4:
            self.conn.write(window_update(self.id, self._unacked))
            self.recv_window += self._unacked
            self._unacked = 0

    def ended_early(self, reset_by_peer: bool) -> None:
        """Reset by the peer (``True``) or its connection lost (``False``)."""
        if self.gone:
            return
        self._close(reset_by_peer)

    def _end_local(self) -> None:
        self.local_closed = True
        if self.remote_closed:
            self.conn.forget(self)

    def _close(self, reset_by_peer: bool | None) -> None:
        self.gone = self.local_closed = self.remote_closed = True
        self.conn.forget(self)
        self._wake_head()  # the buffer is left as it is: a relay waiting on it is cancelled by the owner
        self.window_opened()
        if reset_by_peer is not None and self.owner is not None:
            self.owner.stream_ended(reset_by_peer)

    def _wake_head(self) -> None:
        waiter, self._head_waiter = self._head_waiter, None
        _resolve(waiter)
        hook = self.on_head
        if hook is not None:
            self.on_head = None
            self.conn.soon(hook)

    async def _wait_window(self) -> None:
        waiter = self._window_waiter = self.conn.loop.create_future()
        self.conn.blocked.add(self)
        try:
            await waiter
        finally:
            self.conn.blocked.discard(self)


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def relay_now(src: Stream, dst: Stream, end_stream: bool = False) -> int | None:
    """``relay.relay`` without waiting, where it cannot have to (a unary request or response, typically): ``src``
    has ended, what it sent is buffered whole within one piece, and ``dst`` takes it now as one DATA frame (its
    windows, frame size, transport). Returns how many messages passed; None, with nothing done, otherwise (then
    ``relay.relay`` it). Spares the relay's coroutines (it, ``take``, ``send_data``): a few us a call. Here, not in
    relay.py, so that the compiled build calls the streams' and the buffer's methods in C (stream.pxd types them;
    relay.pxd cannot cimport the streams that cimport its buffer)."""
    buffer = src.buffer
    size = buffer.size
    if not buffer.complete or size > CHUNK or not dst.takes_now(size):
        return None
    data = buffer.take_now()  # all of it: take_now joins up to CHUNK
    count, left, prefix = scan(data, 0, b"")
    if left or prefix:
        raise Truncated
    if data or end_stream:
        dst.send_now(data, end_stream)
    return count
