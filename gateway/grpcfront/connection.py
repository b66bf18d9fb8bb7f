"""One HTTP/2 connection, either end (RFC 9113): frames in, streams with flow control, frames out.

Why the gateway's own, not ``h2`` under grpclib: a relay needs only what a
gRPC passthrough uses of HTTP/2 (streams, header blocks, DATA, windows, resets),
and h2's general state machine, with hyperframe's frame objects and grpclib's
events on top, cost about 90 us of the 216 us the gateway spent per unary call
(profiled). Here a frame is parsed in place, a DATA payload goes straight into
the stream's :class:`~gateway.grpcfront.relay.RelayBuffer`, and what one loop
step writes goes out in one ``send()``. HPACK is the ``hpack`` library's, its repeated blocks
remembered (``headers``).

The reading half (the frame parser, one handler per frame type, and what a
hostile peer gets for each thing it may try) is :class:`~gateway.grpcfront.inbound.FrameReader`,
which this class extends; here are the state, the writing, the streams' bookkeeping
and flow control.

Flow control is end to end per stream: a stream's receive window reopens
(WINDOW_UPDATE) only as the relay takes the bytes, a quarter of the window at a
time, and ``Stream.send_data`` waits for the peer's stream and connection
windows and for the transport to drain. The connection's own receive window is
reopened in the same way, as the relay hands bytes on (or a stream ends with
bytes it never will), so what one connection buffers in all is its window
(``grpc_connection_window``, 16 MiB on the front), not its streams' windows
added up (256 x 1 MiB). One stuck call (a client that reads nothing, a sandbox
that does not read its request) holds at most its stream's 1 MiB of that, so
it does not stall the other calls sharing its connection (other sessions'
calls, where a platform multiplexes its users over one connection); only
sixteen stuck calls on one connection would.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from gateway.errors import BadRequest, error_body
from gateway.grpcfront.frames import (
    DEFAULT_FRAME_SIZE, DEFAULT_WINDOW, ENABLE_PUSH, ENHANCE_YOUR_CALM, ERROR_NAMES, HTTP_1_1_REQUIRED,
    INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, MAX_HEADER_LIST_SIZE, NO_ERROR, PREFACE, PROTOCOL_ERROR,
    ConnectionFailure, goaway, header_frames, rst_stream, settings_frame, window_update
)
from gateway.grpcfront.headers import HeaderCodec
from gateway.grpcfront.inbound import MAX_HEADER_BLOCK, MAX_STREAMS, FrameReader
from gateway.grpcfront.keeper import NO_KEEPER, Keeper
from gateway.grpcfront.stream import STREAM_WINDOW, Headers, Stream, StreamClosed, StreamOwner

log = logging.getLogger("gateway.grpc")
# An HTTP/1.x request line, whole (curl sends its head in one write): answered 505 in HTTP/1.1. Anything else that
# is not the preface (h2spec's "INVALID CONNECTION PREFACE", a TLS hello on the h2c port) gets the close.
_HTTP1_REQUEST_LINE = re.compile(rb"[A-Z]{3,10} [^ \r\n]+ HTTP/1\.[01]\r?\n").match

CONNECTION_WINDOW = 4 * 1024 * 1024  # what all of a connection's streams may have in flight towards us
# What may wait unwritten for a peer that reads nothing: one loop step's DATA for every stream (256 x 64 KiB)
# and more. Past it the peer is flooding us with frames we must answer (PING, SETTINGS): the connection ends.
MAX_BACKLOG = 32 * 1024 * 1024


class ConnectionHandler(Protocol):
    def connection_made(self, connection: Connection) -> None:
        """Called once the transport is up (after the TLS handshake, on a TLS listener)."""

    def accept(self, stream: Stream) -> None:
        """A client opened ``stream``; its request head is ``stream.headers`` (server side only)."""

    def connection_lost(self, connection: Connection) -> None: ...

    def connection_failed(self, code: int) -> None:
        """The peer broke the protocol: the connection ends with GOAWAY ``code`` (counted, by the front)."""

    def malformed(self, problem: str) -> None:
        """Server side: a request head was malformed (RFC 9113 8.1.1); its stream is reset PROTOCOL_ERROR."""


class Connection(FrameReader):
    """The asyncio protocol of one HTTP/2 connection: the front's to a client, or ours to a sandbox."""

    def __init__(self, handler: ConnectionHandler, *, client_side: bool, pause_reading: bool = False,
                 window: int = CONNECTION_WINDOW) -> None:
        self.handler = handler
        self.client_side = client_side
        self.streams: dict[int, Stream] = {}
        self.blocked: set[Stream] = set()   # streams waiting for the connection's send window
        self.closed = False                 # lost, or failed: no new streams
        self.draining = False               # server side: we sent GOAWAY; new streams are refused
        self.goaway_received = False
        self.write_paused = False
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = DEFAULT_FRAME_SIZE
        self.peer_max_streams = 2**31 - 1
        self.active = 0                     # server side: streams whose users have not released them
        self._waiting: deque[Stream] = deque()  # server side: opened while ``active`` was at the limit
        self._reset_ids: deque[int] = deque(maxlen=1024)  # streams we reset lately: their late frames are dropped
        self._pause_reading = pause_reading
        self._transport: Any = None
        self.loop = asyncio.get_running_loop()  # kept: asyncio.get_running_loop() costs a getpid() syscall on 3.11
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._holding = False               # hold() until flush(): the caller writes, then flushes itself
        self._reading = False               # in data_received: soon() keeps its callbacks for the end of it
        self._after: list[Callable[[], None]] = []  # those callbacks (soon)
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._inbox = bytearray()
        self._preface = not client_side     # server side: the client's preface is still to come
        self._settings_seen = False
        # Client side: the peer's first SETTINGS applied (settled()); a server never waits for them, and a flood of
        # connections closed before any would each make and fail the future.
        self._settled: asyncio.Future[None] | None = self.loop.create_future() if client_side else None
        self._lost: asyncio.Future[None] = self.loop.create_future()
        self._window = window               # the connection's receive window: what its streams hold in all
        self._recv_window = window
        self._unacked = 0
        self._next_id = 1                   # client side: the next stream we open
        self._last_peer_id = 0              # server side: the highest stream a client opened
        self._block: list[bytes] = []       # a header block still waiting for CONTINUATION
        self._block_stream = 0
        self._block_size = 0
        self._block_end = False
        self._self_dependent = False        # the header block's HEADERS named its own stream as its parent
        self._hpack: Any = None             # HeaderCodec, made by _greet: a connection that never speaks costs none
        self._greeted = False               # our SETTINGS sent (_greet)
        self.keeper: Keeper = NO_KEEPER  # server side: the front's deadlines (keeper.py)

    # -- asyncio protocol --------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and not self.client_side and tls.selected_alpn_protocol() != "h2":
            self._refuse_http1(transport, "HTTP/2 over TLS, negotiated with ALPN h2 (the client offered no h2)")
            return
        if self.client_side:
            self.write(PREFACE)
            self._greet()
        self.handler.connection_made(self)

    def _greet(self) -> None:
        """Our SETTINGS (and the connection window past the default), and the header codec. A client sends them
        after its preface; a server once the client's preface has arrived: RFC 9113 3.4 asks only that they be
        its first frame. A connection that never speaks HTTP/2 (a flood of idle ones, issue 28) then costs no
        write and no codec (py-spy put a fifth of the front's CPU per such connection in those writes)."""
        self._greeted = True
        if not self.closed:  # a refusal or shed greets only to say GOAWAY: it reads no header block, awaits no ACK
            self._hpack = HeaderCodec(max_header_list_size=MAX_HEADER_BLOCK)
            self.keeper.settings_sent()
        settings = {INITIAL_WINDOW_SIZE: STREAM_WINDOW, MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK}
        if self.client_side:
            settings[ENABLE_PUSH] = 0
            settings[MAX_CONCURRENT_STREAMS] = 0
        else:
            settings[MAX_CONCURRENT_STREAMS] = MAX_STREAMS
        self.write(settings_frame(settings))
        self.write(window_update(0, self._window - DEFAULT_WINDOW))

    def _refuse_http1(self, transport: Any, speaks: str) -> None:
        """An HTTP/1.x client: a 505 with the JSON error, which it reads, and the close. Over TLS, one that did not
        negotiate h2 (ALPN offered only http/1.1, or nothing: RFC 9113 3.2), which Python's ssl cannot refuse in
        the handshake (no_application_protocol); in the clear, a request line where the preface should be
        (curl on the wrong port), which would otherwise get a silent close."""
        self.closed = True
        body = error_body(BadRequest(f"this is the gRPC front: {speaks}; HTTP/1.1 goes to the data plane",
                                     code="http2_required"))
        transport.write(b"HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        transport.close()
        self.handler.connection_failed(HTTP_1_1_REQUIRED)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        inbox = self._inbox
        self._reading = True
        try:
            if inbox or self._preface:  # a frame begun in the last read (or the client's preface still to come)
                inbox += data
                if self._preface:
                    if not self._take_preface():
                        return
                    self._greet()
                data = bytes(inbox)
                inbox.clear()
            self._read_frames(data)
        except ConnectionFailure as failure:
            if not self._greeted and _HTTP1_REQUEST_LINE(inbox):  # where the preface should be
                self._refuse_http1(self._transport, "HTTP/2 only (gRPC, with prior knowledge, or TLS with ALPN h2)")
            else:
                self.fail(failure.code, str(failure))
        finally:
            self._reading = False
            if self._after:
                self._run_after()

    def soon(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the frames being read are handled: at the end of :meth:`data_received` when called
        from it (a call's start as its request arrives, its answer as the sandbox's does), else ``call_soon``. At
        one call in flight that is the same moment as the next loop step's, without a handle made, queued and run
        by the loop on each of the two paths a call's latency is made of (read to write, both ways)."""
        if self._reading:
            self._after.append(callback)
        else:
            self.loop.call_soon(callback)

    def _run_after(self) -> None:
        after, self._after = self._after, []
        for callback in after:
            try:
                callback()
            except Exception:  # as the loop would for a call_soon callback: the others still run
                log.exception("a callback after a read failed")

    def eof_received(self) -> None:
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.keeper.stop()
        self._transport = None
        settled = self._settled
        if settled is not None and not settled.done():
            settled.set_exception(ConnectionResetError("the connection closed before its SETTINGS"))
            settled.exception()  # retrieved: nobody may be waiting
        for stream in list(self.streams.values()):
            stream.ended_early(reset_by_peer=False)
        self._wake(self._drain_waiters)
        self.handler.connection_lost(self)
        self._lost.set_result(None)
        # The keeper names this connection: a cycle, left to the cyclic GC's full collections, which with
        # thousands of connections closing together took tens of ms in one loop turn (data plane: _downstream).
        self.keeper = NO_KEEPER

    @property
    def peer_host(self) -> str:
        """The peer's address without its port ("" when unknown): what per-client bounds count by."""
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else ""

    async def wait_closed(self) -> None:
        """Until the connection is gone (and its handler told)."""
        await asyncio.shield(self._lost)

    def pause_writing(self) -> None:
        self.write_paused = True
        if self._pause_reading and self._transport is not None:
            self._transport.pause_reading()  # answers to PINGs and SETTINGS would pile up unread

    def resume_writing(self) -> None:
        self.write_paused = False
        if self._pause_reading and self._transport is not None:
            self._transport.resume_reading()
        self._wake(self._drain_waiters)

    # -- writing ----------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue ``data``; what one loop step writes goes out in one ``send()`` at the end of it, or, while
        other streams are open, at the end of the next: the calls that the reads ready by then wake write in
        that step, and their frames join the same ``send()``. Flushing every step, a front made faster per
        call sent 1.1-1.5 times per call at 10 and 50 calls in flight (0.3-0.7 before), and the client and
        sandbox, reading smaller pieces, spent a fifth more CPU per call; one more turn of the loop costs no
        waiting (the loop polls without blocking while callbacks are ready)."""
        self._out.append(data)
        if self._flush_handle is None and not self._holding:
            self._flush_handle = self.loop.call_soon(self._flush_queued if len(self.streams) <= 1
                                                     else self._flush_next_step)

    def hold(self) -> None:
        """Until :meth:`flush` (which the caller must reach, in a ``finally``): what is written waits for it, with
        no flush of its own queued. A call alone on the front writes its frames and flushes them at once
        (``Call._alone``); a flush queued and then cancelled would still cost the loop one more turn (a
        poll that waits for nothing, one ``epoll_pwait`` a call more than nginx)."""
        self._holding = True

    def flush(self) -> None:
        self._holding = False
        handle = self._flush_handle
        if handle is not None:
            self._flush_handle = None
            handle.cancel()  # called directly (close, or after a hold): the queued call has nothing left to do
        self._send()

    def _flush_next_step(self) -> None:
        self._flush_handle = self.loop.call_soon(self._flush_queued)

    def _flush_queued(self) -> None:
        self._flush_handle = None
        self._send()

    def _send(self) -> None:
        out = self._out
        if not out:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)
            if self.write_paused and not self.closed and transport.get_write_buffer_size() > MAX_BACKLOG:
                self.fail(ENHANCE_YOUR_CALM, f"over {MAX_BACKLOG} bytes waiting to be written to a peer "
                                               "that reads nothing (a flood of frames we must answer?)")

    def write_headers(self, stream_id: int, headers: Any, end_stream: bool) -> None:
        codec = self._hpack
        if codec is None:  # never greeted (refused before the preface): it has no stream to write to
            raise StreamClosed("the connection has no header codec")
        self.write(header_frames(stream_id, codec.encode(headers), end_stream, self.peer_max_frame))

    async def drained(self) -> None:
        if self.closed:
            return
        waiter = self.loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    # -- streams ------------------------------------------------------------------------
    def open_stream(self, headers: Headers, owner: StreamOwner) -> Stream:
        """Client side: a new stream with its request head sent. Taken only where ``has_slot`` was just
        true (UpstreamChannels.connection, with no await between), so it never waits for a slot."""
        if not self.has_slot:
            raise StreamClosed("the connection to the sandbox takes no new stream")
        stream = Stream(self, self._next_id)
        self._next_id += 2
        stream.owner = owner
        self.streams[stream.id] = stream
        stream.send_headers(headers)
        return stream

    @property
    def usable(self) -> bool:
        """Client side: new streams may be opened on it."""
        return not self.closed and not self.goaway_received and self._next_id < 2**31 - 1

    @property
    def has_slot(self) -> bool:
        """Client side: a stream opened now is within the peer's SETTINGS_MAX_CONCURRENT_STREAMS."""
        return len(self.streams) < self.peer_max_streams and self.usable

    async def settled(self) -> None:
        """Client side: wait for the peer's first SETTINGS (its stream limit and windows are known then)."""
        settled = self._settled
        assert settled is not None, "a server does not wait for its client's SETTINGS"
        if not settled.done():
            await asyncio.shield(settled)

    def forget(self, stream: Stream) -> None:
        """``stream`` is closed both ways: it no longer counts against the peer's limit, nor what its buffer
        still holds against the connection's window (what a reset stream's relay never takes is let go)."""
        held = stream.held
        if held:
            stream.held = 0
            self._credit(held)
        if self.streams.pop(stream.id, None) is not None:
            self._close_if_drained()

    def _close_if_drained(self) -> None:
        """Client side: a connection the peer sent GOAWAY on takes no new stream; once its last one is done
        it is closed, not left open (a sandbox that GOAWAYs and never closes would leave one per GOAWAY)."""
        if self.client_side and self.goaway_received and not self.streams and not self.closed:
            self.close(message="GOAWAY received and every stream done")

    def released(self, stream: Stream) -> None:
        if self.client_side:
            return
        self.active -= 1
        waiting = self._waiting
        while waiting and self.active < MAX_STREAMS:
            self._start(waiting.popleft())
        if not self.active:
            self.keeper.calls_ended()

    def ack(self, stream_id: int, size: int) -> None:
        """``size`` bytes of ``stream_id`` were taken by the relay: reopen its stream's window, and the
        connection's by what the stream still held (once forgotten, a stream's bytes were credited then)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        held = stream.held
        if held:
            taken = min(size, held)
            stream.held = held - taken
            self._credit(taken)
        stream.ack(size)

    def reset_sent(self, stream_id: int, code: int) -> None:
        self.write(rst_stream(stream_id, code))
        self._reset_ids.append(stream_id)

    def _credit(self, size: int) -> None:
        """Reopen the connection's window by ``size``, a quarter of the window at a time."""
        self._unacked += size
        if self._unacked >= self._window // 4:
            self.write(window_update(0, self._unacked))
            self._recv_window += self._unacked
            self._unacked = 0

    def close(self, code: int = NO_ERROR, message: str = "") -> None:
        """GOAWAY, then close once what is queued is written (at once if the peer reads nothing)."""
        transport = self._transport
        if transport is None or self.closed:
            return
        self.closed = True
        # Before the client's preface, a bad or missing one (PROTOCOL_ERROR) is closed without a word: the peer
        # does not speak HTTP/2 (RFC 9113 3.4: the GOAWAY may be omitted). A refusal or a shed is still told,
        # after our SETTINGS, which must come first.
        if self._greeted or code != PROTOCOL_ERROR:
            self._send_goaway(code, message)
            self.flush()
        if transport.get_write_buffer_size() > MAX_BACKLOG:
            transport.abort()  # it would never drain
        else:
            transport.close()

    def shut_down(self, message: str) -> None:
        """Server side: GOAWAY (NO_ERROR) now, the calls already open run on; a client opens new calls
        elsewhere, and a stream it opened before it knew is refused (REFUSED_STREAM: retried)."""
        if self._transport is None or self.closed or self.draining:
            return
        self.draining = True
        self._send_goaway(NO_ERROR, message)

    def _send_goaway(self, code: int, message: str) -> None:
        if not self._greeted:
            self._greet()
        self.write(goaway(self._last_peer_id, code, message.encode()[:200]))

    def fail(self, code: int, message: str) -> None:
        """A connection error: what the peer did is named in the GOAWAY's debug data, and logged."""
        self._inbox.clear()
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        log.info("HTTP/2 connection %s %s ended, %s: %s", "to" if self.client_side else "from",
                 peer, ERROR_NAMES.get(code, hex(code)), message)
        self.handler.connection_failed(code)
        self.close(code, message)

    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()
