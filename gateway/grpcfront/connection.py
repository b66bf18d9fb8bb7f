"""One HTTP/2 connection, either end (RFC 9113): frames in, streams with flow control, frames out.

Why the gateway's own, not ``h2`` under grpclib: a relay needs only what a
gRPC passthrough uses of HTTP/2 (streams, header blocks, DATA, windows, resets),
and h2's general state machine, with hyperframe's frame objects and grpclib's
events on top, cost about 90 us of the 216 us the gateway spent per unary call
(profiled). Here a frame is parsed in place, a DATA payload goes straight into
the stream's :class:`~gateway.grpcfront.relay.RelayBuffer`, and what one loop
step writes goes out in one ``send()``. HPACK is the ``hpack`` library's, its repeated blocks
remembered (``headers``).

What the peer may do and what it gets (hostile input is the normal case on the
front, tests/test_grpc_hostile.py):

- Frames over our SETTINGS_MAX_FRAME_SIZE, malformed control frames, streams
  opened out of order or on the wrong parity, DATA on stream 0 or an idle
  stream, PUSH_PROMISE, HPACK that does not decode: a connection error (GOAWAY
  with the RFC's code, then close).
- A header block (HEADERS and its CONTINUATIONs) over ``MAX_HEADER_BLOCK``
  compressed bytes: ENHANCE_YOUR_CALM; a CONTINUATION flood ends there.
- DATA beyond the window we granted, WINDOW_UPDATE past 2^31-1: FLOW_CONTROL_ERROR.
- More open streams than our SETTINGS_MAX_CONCURRENT_STREAMS: RST_STREAM
  REFUSED_STREAM. Calls are counted until they have *ended*, not until the
  peer resets their stream: a stream opened while that many calls still run
  waits for one to end, and a peer that keeps opening and resetting streams
  (rapid reset) never has more calls running than the limit; when as many
  wait as may run, the connection ends with ENHANCE_YOUR_CALM.
- Frames we must answer (PING, SETTINGS) while our writes are backed up: the
  front stops reading from that peer until they drain (``pause_reading``).

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
from collections import deque
from typing import Any, Protocol

from hpack.exceptions import HPACKError, OversizedHeaderListError

from gateway.errors import BadRequest, error_body
from gateway.grpcfront import frames as f
from gateway.grpcfront.frames import ConnectionFailure, StreamFailure
from gateway.grpcfront.headers import HeaderCodec
from gateway.grpcfront.keeper import NO_KEEPER, Keeper, NoKeeper
from gateway.grpcfront.stream import STREAM_WINDOW, Headers, Stream, StreamClosed, StreamOwner

log = logging.getLogger("gateway.grpc")

CONNECTION_WINDOW = 4 * 1024 * 1024  # what all of a connection's streams may have in flight towards us
MAX_HEADER_BLOCK = 64 * 1024         # compressed; also the decoded header list size we advertise
MAX_STREAMS = 256                    # concurrent streams a client may open on one front connection
# What may wait unwritten for a peer that reads nothing: one loop step's DATA for every stream (256 x 64 KiB)
# and more. Past it the peer is flooding us with frames we must answer (PING, SETTINGS): the connection ends.
MAX_BACKLOG = 32 * 1024 * 1024
_ENCODER_TABLE = 4096                # our encoder's dynamic table, whatever larger size the peer allows


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


class Connection:
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
        self.send_window = f.DEFAULT_WINDOW
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_FRAME_SIZE
        self.peer_max_streams = 2**31 - 1
        self.active = 0                     # server side: streams whose users have not released them
        self._waiting: deque[Stream] = deque()  # server side: opened while ``active`` was at the limit
        self._reset_ids: deque[int] = deque(maxlen=1024)  # streams we reset lately: their late frames are dropped
        self._pause_reading = pause_reading
        self._transport: Any = None
        self.loop = asyncio.get_running_loop()  # kept: asyncio.get_running_loop() costs a getpid() syscall on 3.11
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._inbox = bytearray()
        self._preface = not client_side     # server side: the client's preface is still to come
        self._settings_seen = False
        self._settled: asyncio.Future[None] = self.loop.create_future()  # the peer's first SETTINGS applied
        self._lost: asyncio.Future[None] = self.loop.create_future()
        self._window = window               # the connection's receive window: what its streams hold in all
        self._recv_window = window
        self._held: dict[int, int] = {}     # per stream: bytes received and not yet handed on by the relay
        self._unacked = 0
        self._next_id = 1                   # client side: the next stream we open
        self._last_peer_id = 0              # server side: the highest stream a client opened
        self._block: list[bytes] = []       # a header block still waiting for CONTINUATION
        self._block_stream = 0
        self._block_size = 0
        self._block_end = False
        self._self_dependent = False        # the header block's HEADERS named its own stream as its parent
        self._hpack = HeaderCodec(max_header_list_size=MAX_HEADER_BLOCK)
        self.keeper: Keeper | NoKeeper = NO_KEEPER  # server side: the front's deadlines (keeper.py)

    # -- asyncio protocol --------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and not self.client_side and tls.selected_alpn_protocol() != "h2":
            self._refuse_without_h2(transport)
            return
        settings = {f.INITIAL_WINDOW_SIZE: STREAM_WINDOW, f.MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK}
        if self.client_side:
            settings[f.ENABLE_PUSH] = 0
            settings[f.MAX_CONCURRENT_STREAMS] = 0
            self.write(f.PREFACE)
        else:
            settings[f.MAX_CONCURRENT_STREAMS] = MAX_STREAMS
        self.write(f.settings_frame(settings))
        self.write(f.window_update(0, self._window - f.DEFAULT_WINDOW))
        self.handler.connection_made(self)

    def _refuse_without_h2(self, transport: Any) -> None:
        """A TLS client that did not negotiate h2 (ALPN offered only http/1.1, or nothing): Python's ssl cannot
        fail the handshake with no_application_protocol, so it gets what an HTTP/1.1 client reads, a 505 with
        the JSON error, and the close (RFC 9113 3.2: HTTP/2 over TLS is negotiated with ALPN h2)."""
        self.closed = True
        body = error_body(BadRequest("this is the gRPC front: HTTP/2 over TLS, negotiated with ALPN h2 (the client "
                                     "offered no h2); HTTP/1.1 goes to the data plane", code="http2_required"))
        transport.write(b"HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        transport.close()
        self.handler.connection_failed(f.HTTP_1_1_REQUIRED)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        inbox = self._inbox
        inbox += data
        try:
            if self._preface and not self._take_preface():
                return
            self._read_frames()
        except ConnectionFailure as failure:
            self.fail(failure.code, str(failure))

    def eof_received(self) -> None:
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.keeper.stop()
        self._transport = None
        if not self._settled.done():
            self._settled.set_exception(ConnectionResetError("the connection closed before its SETTINGS"))
            self._settled.exception()  # retrieved: nobody may be waiting
        for stream in list(self.streams.values()):
            stream.ended_early(reset_by_peer=False)
        self._wake(self._drain_waiters)
        self.handler.connection_lost(self)
        self._lost.set_result(None)

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
        """Queue ``data``; what one loop step writes goes out in one ``send()`` at the end of it."""
        self._out.append(data)
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush_queued)

    def flush_alone(self) -> None:
        """Write what is queued now if no other stream is open: nothing else this loop step does can join
        the ``send()``, so it goes out without waiting a loop iteration (a unary call at one in flight: the
        request to the sandbox and the answer to the client each leave a loop iteration earlier)."""
        if len(self.streams) <= 1 and self._out:
            self.flush()

    def flush(self) -> None:
        handle = self._flush_handle
        if handle is not None:
            self._flush_handle = None
            handle.cancel()  # called directly (flush_alone, close): the queued call has nothing left to do
        self._send()

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
                self.fail(f.ENHANCE_YOUR_CALM, f"over {MAX_BACKLOG} bytes waiting to be written to a peer "
                                               "that reads nothing (a flood of frames we must answer?)")

    def write_headers(self, stream_id: int, headers: Any, end_stream: bool) -> None:
        block = self._hpack.encode(headers)
        self.write(f.header_frames(stream_id, block, end_stream, self.peer_max_frame))

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
        """Wait for the peer's first SETTINGS (its stream limit and windows are known then)."""
        if not self._settled.done():
            await asyncio.shield(self._settled)

    def forget(self, stream: Stream) -> None:
        """``stream`` is closed both ways: it no longer counts against the peer's limit, nor what its buffer
        still holds against the connection's window (what a reset stream's relay never takes is let go)."""
        self._credit(self._held.pop(stream.id, 0))
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
        connection's by what the stream still held."""
        held = self._held.get(stream_id)
        if held is not None:
            taken = min(size, held)
            if held > taken:
                self._held[stream_id] = held - taken
            else:
                del self._held[stream_id]
            self._credit(taken)
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.ack(size)

    def reset_sent(self, stream_id: int, code: int) -> None:
        self.write(f.rst_stream(stream_id, code))
        self._reset_ids.append(stream_id)

    def _hold(self, stream_id: int, size: int) -> None:
        """``size`` bytes of DATA went into ``stream_id``'s buffer: the connection's window reopens by them only
        as the relay hands them on (:meth:`ack`) or the stream ends (:meth:`forget`). So what one connection
        buffers in all is its window, whatever its streams' windows add up to (256 x 1 MiB otherwise)."""
        self._held[stream_id] = self._held.get(stream_id, 0) + size

    def _credit(self, size: int) -> None:
        """Reopen the connection's window by ``size``, a quarter of the window at a time."""
        self._unacked += size
        if self._unacked >= self._window // 4:
            self.write(f.window_update(0, self._unacked))
            self._recv_window += self._unacked
            self._unacked = 0

    def close(self, code: int = f.NO_ERROR, message: str = "") -> None:
        """GOAWAY, then close once what is queued is written (at once if the peer reads nothing)."""
        transport = self._transport
        if transport is None or self.closed:
            return
        self.closed = True
        self.write(f.goaway(self._last_peer_id, code, message.encode()[:200]))
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
        self.write(f.goaway(self._last_peer_id, f.NO_ERROR, message.encode()[:200]))

    def fail(self, code: int, message: str) -> None:
        """A connection error: what the peer did is named in the GOAWAY's debug data, and logged."""
        self._inbox.clear()
        peer = self._transport.get_extra_info("peername") if self._transport is not None else None
        log.info("HTTP/2 connection %s %s ended, %s: %s", "to" if self.client_side else "from",
                 peer, f.ERROR_NAMES.get(code, hex(code)), message)
        self.handler.connection_failed(code)
        self.close(code, message)

    # -- reading ---------------------------------------------------------------------------
    def _take_preface(self) -> bool:
        inbox = self._inbox
        size = min(len(inbox), len(f.PREFACE))
        if inbox[:size] != f.PREFACE[:size]:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "not an HTTP/2 connection preface (this port speaks gRPC)")
        if size < len(f.PREFACE):
            return False
        del inbox[:size]
        self._preface = False
        return True

    def _read_frames(self) -> None:
        inbox = self._inbox
        pos = 0
        end = len(inbox)
        try:
            while end - pos >= 9 and not self.closed:
                size = inbox[pos] << 16 | inbox[pos + 1] << 8 | inbox[pos + 2]
                if size > f.DEFAULT_FRAME_SIZE:
                    raise ConnectionFailure(f.FRAME_SIZE_ERROR, f"a frame of {size} bytes is over our "
                                                                f"SETTINGS_MAX_FRAME_SIZE ({f.DEFAULT_FRAME_SIZE})")
                stop = pos + 9 + size
                if stop > end:
                    break
                kind = inbox[pos + 3]
                flags = inbox[pos + 4]
                stream_id = int.from_bytes(inbox[pos + 5:pos + 9], "big") & f.STREAM_ID_MASK
                payload = bytes(inbox[pos + 9:stop])
                pos = stop
                try:
                    self._frame(kind, flags, stream_id, payload)
                except StreamFailure as failure:
                    self._stream_failed(failure)
        finally:
            if not self.closed:
                del inbox[:pos]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and kind != f.CONTINUATION:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen:
            if kind != f.SETTINGS or flags & f.ACK:
                raise ConnectionFailure(f.PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self._settings_seen = True
            self.keeper.handshaken()
            self.loop.call_soon(self._settle)  # once this frame's settings are applied
        if kind == f.DATA:
            self._data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == f.CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == f.RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == f.SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == f.PING:
            self._ping(flags, stream_id, payload)
        elif kind == f.GOAWAY:
            self._goaway(stream_id, payload)
        elif kind == f.PRIORITY:
            self._priority(stream_id, payload)
        elif kind == f.PUSH_PROMISE:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "PUSH_PROMISE is not allowed (push is disabled)")
        # other frame types are extensions: ignored (RFC 9113 5.5)

    def _priority(self, stream_id: int, payload: bytes) -> None:
        """PRIORITY is otherwise ignored (RFC 9113 5.3.2), but its rules hold: never on stream 0, 5 bytes,
        and a stream never depends on itself (a stream error: it may name an idle stream, 5.1)."""
        if stream_id == 0:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise StreamFailure(stream_id, f.FRAME_SIZE_ERROR, "a PRIORITY frame must be 5 bytes")
        if f.u32(payload) & f.STREAM_ID_MASK == stream_id:
            raise StreamFailure(stream_id, f.PROTOCOL_ERROR, "a stream cannot depend on itself")

    def _idle(self, stream_id: int) -> bool:
        """Never opened: by us (client side) or by the peer (server side)."""
        if self.client_side:
            return stream_id % 2 == 0 or stream_id >= self._next_id
        return stream_id % 2 == 0 or stream_id > self._last_peer_id

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionFailure(f.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if self._idle(stream_id):
                raise ConnectionFailure(f.PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
            # A stream we reset: what the peer sent before it knew is dropped (the connection's window reopens at
            # once). One the peer ended (END_STREAM, RST_STREAM) takes no more DATA (RFC 9113 5.1).
            self._credit(size)
            if stream is not None or stream_id not in self._reset_ids:
                raise StreamFailure(stream_id, f.STREAM_CLOSED, "DATA after the end of the stream")
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._credit(size)
            raise StreamFailure(stream_id, f.FLOW_CONTROL_ERROR, "DATA beyond the stream's window")
        self._hold(stream_id, size)
        data = f.unpad(flags, payload, stream_id)
        if stream.expected is not None:
            stream.counted(len(data), bool(flags & f.END_STREAM))
        stream.buffer.add(data, size)
        if flags & f.END_STREAM:
            stream.received_end()

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = f.unpad(flags, payload, stream_id)
        self._self_dependent = False
        if flags & f.PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionFailure(f.FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            self._self_dependent = f.u32(block) & f.STREAM_ID_MASK == stream_id
            block = block[5:]
        if flags & f.END_HEADERS:
            self._header_block(stream_id, bool(flags & f.END_STREAM), block)
            return
        self._block, self._block_stream, self._block_size = [block], stream_id, len(block)
        self._block_end = bool(flags & f.END_STREAM)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != self._block_stream or not stream_id:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "CONTINUATION without the HEADERS it continues")
        self._block_size += len(payload)
        if self._block_size > MAX_HEADER_BLOCK:
            raise ConnectionFailure(f.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        self._block.append(payload)
        if flags & f.END_HEADERS:
            block = b"".join(self._block)
            self._block, self._block_stream = [], 0
            self._header_block(stream_id, self._block_end, block)

    def _header_block(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:  # decoded whatever the stream: the HPACK state is the connection's
            headers = self._hpack.decode(block)
        except OversizedHeaderListError:
            raise ConnectionFailure(f.ENHANCE_YOUR_CALM, f"a header list over {MAX_HEADER_BLOCK} bytes") from None
        except HPACKError as exc:
            raise ConnectionFailure(f.COMPRESSION_ERROR, f"the header block is not valid HPACK: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:
            if self._self_dependent:
                raise StreamFailure(stream_id, f.PROTOCOL_ERROR, "a stream cannot depend on itself")
            stream.received_headers(headers, end_stream)
        elif self.client_side or stream_id <= self._last_peer_id or stream_id % 2 == 0:
            if self._idle(stream_id) or stream_id not in self._reset_ids:
                raise ConnectionFailure(f.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}: not a new stream "
                                                          "(client streams are odd and increasing)")
            # a stream we reset: what the peer sent before it knew is dropped (RFC 9113 5.1, closed)
        else:
            self._accept(stream_id, headers, end_stream, block)

    def _accept(self, stream_id: int, headers: Headers, end_stream: bool, block: bytes) -> None:
        self._last_peer_id = stream_id
        problem, length = self._hpack.check_request(block, headers)
        if problem is None and self._self_dependent:
            problem = "a stream cannot depend on itself"
        elif problem is None and end_stream and length:
            problem = f"content-length {length}, and no DATA"
        if problem is not None:  # malformed (RFC 9113 8.1.1): no call begins, nothing reaches the sandbox
            self.handler.malformed(problem)
            self.reset_sent(stream_id, f.PROTOCOL_ERROR)
            return
        if self.closed or self.draining or len(self.streams) >= MAX_STREAMS:
            self.reset_sent(stream_id, f.REFUSED_STREAM)
            return
        stream = Stream(self, stream_id)
        stream.headers = headers
        stream.expected = length
        self.streams[stream_id] = stream
        if end_stream:
            stream.received_end()
        if self.active < MAX_STREAMS:
            self._start(stream)
            return
        waiting = self._waiting
        if len(waiting) >= MAX_STREAMS:
            self._waiting = waiting = deque(queued for queued in waiting if not queued.gone)  # reset meanwhile
            if len(waiting) >= MAX_STREAMS:
                raise ConnectionFailure(f.ENHANCE_YOUR_CALM, "too many streams opened while calls still end")
        waiting.append(stream)

    def _start(self, stream: Stream) -> None:
        if stream.gone:  # reset while it waited: no call
            return
        self.active += 1
        self.keeper.call_started()
        self.handler.accept(stream)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(f.FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame must be 4 bytes")
        increment = f.u32(payload) & f.STREAM_ID_MASK
        if stream_id == 0:
            if not increment:
                raise ConnectionFailure(f.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ConnectionFailure(f.FLOW_CONTROL_ERROR, "the connection's window went past 2^31-1")
            for stream in list(self.blocked):
                stream.window_opened()
            return
        if self._idle(stream_id):
            raise ConnectionFailure(f.PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {stream_id}, never opened")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not increment:
            raise StreamFailure(stream_id, f.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            raise StreamFailure(stream_id, f.FLOW_CONTROL_ERROR, "the stream's window went past 2^31-1")
        stream.window_opened()

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(f.FRAME_SIZE_ERROR, "a RST_STREAM frame must be 4 bytes")
        if stream_id == 0 or self._idle(stream_id):
            raise ConnectionFailure(f.PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, never opened")
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.reset_code = code = f.u32(payload)
            stream.refused = code == f.REFUSED_STREAM  # not processed (RFC 9113 8.7)
            stream.ended_early(reset_by_peer=True)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionFailure(f.FRAME_SIZE_ERROR, "a SETTINGS ACK must be empty")
            self.keeper.settings_acked()
            return
        for key, value in f.parse_settings(payload):
            if key == f.INITIAL_WINDOW_SIZE:
                self._initial_window(value)
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_FRAME_SIZE <= value <= f.MAX_FRAME_SIZE_LIMIT:
                    raise ConnectionFailure(f.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is out of range")
                self.peer_max_frame = value
            elif key == f.ENABLE_PUSH:
                if value > 1:
                    raise ConnectionFailure(f.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value} is not 0 or 1")
            elif key == f.MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == f.HEADER_TABLE_SIZE:
                self._hpack.peer_table_size(min(value, _ENCODER_TABLE))
        self.write(f.frame(f.SETTINGS, f.ACK, 0))

    def _initial_window(self, value: int) -> None:
        if value > f.MAX_WINDOW:
            raise ConnectionFailure(f.FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} is over 2^31-1")
        delta = value - self.peer_initial_window
        self.peer_initial_window = value
        for stream in self.streams.values():
            stream.send_window += delta
            if stream.send_window > f.MAX_WINDOW:
                raise ConnectionFailure(f.FLOW_CONTROL_ERROR, "a stream's window went past 2^31-1")
            if delta > 0:
                stream.window_opened()

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionFailure(f.FRAME_SIZE_ERROR, "a PING frame must be 8 bytes")
        if not flags & f.ACK and self.keeper.ping():
            self.write(f.frame(f.PING, f.ACK, 0, payload))

    def _goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(f.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ConnectionFailure(f.FRAME_SIZE_ERROR, "a GOAWAY frame must be at least 8 bytes")
        self.goaway_received = True
        if not self.client_side:
            # A client's last_stream_id names the last stream *we* opened (none: no push), not its own:
            # its open calls complete, and it opens no more (RFC 9113 6.8).
            return
        last = f.u32(payload) & f.STREAM_ID_MASK
        for stream in [s for s in self.streams.values() if s.id > last]:
            stream.refused = True  # never processed (RFC 9113 6.8): safe to send again elsewhere
            stream.ended_early(reset_by_peer=False)
        self._close_if_drained()

    def _stream_failed(self, failure: StreamFailure) -> None:
        self.reset_sent(failure.stream_id, failure.code)
        stream = self.streams.get(failure.stream_id)
        if stream is not None:
            stream.ended_early(reset_by_peer=True)

    def _settle(self) -> None:
        if not self._settled.done():
            self._settled.set_result(None)

    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()
