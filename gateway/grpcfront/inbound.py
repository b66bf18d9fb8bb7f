"""Frames in: the reading half of a :class:`~gateway.grpcfront.connection.Connection` (RFC 9113 4-6).

The parser takes frames from the connection's inbox in place and hands each to
the handler of its type; DATA goes straight into its stream's receive buffer,
a header block is decoded (``headers.HeaderCodec``) and, server side, opens a
stream whose call the connection's handler starts. Kept apart from the
connection's state and writing because this is where every rule about what a
peer may send lives. What the peer may do and what it gets (hostile input is
the normal case on the front, tests/test_grpc_hostile.py):

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

:class:`FrameReader` is a base class of ``Connection``, not an object of its own:
the handlers read and change the connection's state on every frame, and a
``self.conn.`` hop on each of those reads would cost the hot path for nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from hpack.exceptions import HPACKError, OversizedHeaderListError

from gateway.grpcfront.frames import (
    ACK, COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_FRAME_SIZE, ENABLE_PUSH, END_HEADERS, END_STREAM,
    ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, GOAWAY, HEADERS, HEADER_TABLE_SIZE,
    INITIAL_WINDOW_SIZE, MAX_CONCURRENT_STREAMS, MAX_FRAME_SIZE, MAX_FRAME_SIZE_LIMIT, MAX_WINDOW, PING, PREFACE,
    PRIORITY, PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE, REFUSED_STREAM, RST_STREAM, SETTINGS, STREAM_CLOSED,
    STREAM_ID_MASK, WINDOW_UPDATE, ConnectionFailure, StreamFailure, frame, parse_settings, u32, unpad
)
from gateway.grpcfront.stream import Endpoint, Headers, Stream

if TYPE_CHECKING:
    from gateway.grpcfront.headers import HeaderCodec
    from gateway.grpcfront.keeper import Keeper

MAX_HEADER_BLOCK = 64 * 1024         # compressed; also the decoded header list size we advertise
MAX_STREAMS = 256                    # concurrent streams a client may open on one front connection
_ENCODER_TABLE = 4096                # our encoder's dynamic table, whatever larger size the peer allows


class FrameReader(Endpoint):
    """Reads frames into a connection's state; the state and the writing are ``Connection``'s."""

    # The connection's state this half reads and changes (set in Connection.__init__; Endpoint's as well).
    handler: Any
    streams: dict[int, Stream]
    closed: bool
    draining: bool
    goaway_received: bool
    peer_max_streams: int
    active: int
    keeper: Keeper  # or NO_KEEPER, a Keeper too
    _waiting: deque[Stream]
    _reset_ids: deque[int]
    _inbox: bytearray
    _preface: bool
    _settings_seen: bool
    _settled: asyncio.Future[None] | None
    _recv_window: int
    _next_id: int
    _last_peer_id: int
    _block: list[bytes]
    _block_stream: int
    _block_size: int
    _block_end: bool
    _self_dependent: bool
    _hpack: HeaderCodec

    # What the connection provides (and Endpoint's write, reset_sent, ...).
    def _credit(self, size: int) -> None: ...
    def _close_if_drained(self) -> None: ...

    def _take_preface(self) -> bool:
        inbox = self._inbox
        size = min(len(inbox), len(PREFACE))
        if inbox[:size] != PREFACE[:size]:
            raise ConnectionFailure(PROTOCOL_ERROR, "not an HTTP/2 connection preface (this port speaks gRPC)")
        if size < len(PREFACE):
            return False
        del inbox[:size]
        self._preface = False
        return True

    def _read_frames(self, data: bytes) -> None:
        """The frames of ``data`` (a read, with what was left of the last one before it, if anything), each payload
        one copy out of it; a frame not yet whole is kept in the inbox for the next read. Compiled, ``buf`` is a C
        pointer into ``data``: the frame head is read byte by byte and a payload copied out with no slice object
        (a bytearray slice and its ``bytes()`` copy were about 1.4k instructions a frame, 5 frames a unary call)."""
        buf = data
        pos = 0
        end = len(data)
        try:
            while end - pos >= 9 and not self.closed:
                size = buf[pos] << 16 | buf[pos + 1] << 8 | buf[pos + 2]
                kind = buf[pos + 3]
                flags = buf[pos + 4]
                stream_id = (buf[pos + 5] & 0x7F) << 24 | buf[pos + 6] << 16 | buf[pos + 7] << 8 | buf[pos + 8]
                if size > DEFAULT_FRAME_SIZE:
                    raise ConnectionFailure(FRAME_SIZE_ERROR, f"a frame of {size} bytes is over our "
                                                                f"SETTINGS_MAX_FRAME_SIZE ({DEFAULT_FRAME_SIZE})")
                stop = pos + 9 + size
                if stop > end:
                    break
                payload = buf[pos + 9:stop]
                pos = stop
                try:
                    self._frame(kind, flags, stream_id, payload)
                except StreamFailure as failure:
                    self._stream_failed(failure)
        finally:
            if pos < end and not self.closed:
                self._inbox += buf[pos:end]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and kind != CONTINUATION:
            raise ConnectionFailure(PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen:
            if kind != SETTINGS or flags & ACK:
                raise ConnectionFailure(PROTOCOL_ERROR, "the first frame must be SETTINGS")
            self._settings_seen = True
            self.keeper.handshaken()
            self.loop.call_soon(self._settle)  # once this frame's settings are applied
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == PING:
            self._ping(flags, stream_id, payload)
        elif kind == GOAWAY:
            self._goaway(stream_id, payload)
        elif kind == PRIORITY:
            self._priority(stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise ConnectionFailure(PROTOCOL_ERROR, "PUSH_PROMISE is not allowed (push is disabled)")
        # other frame types are extensions: ignored (RFC 9113 5.5)

    def _priority(self, stream_id: int, payload: bytes) -> None:
        """PRIORITY is otherwise ignored (RFC 9113 5.3.2), but its rules hold: never on stream 0, 5 bytes,
        and a stream never depends on itself (a stream error: it may name an idle stream, 5.1)."""
        if stream_id == 0:
            raise ConnectionFailure(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            raise StreamFailure(stream_id, FRAME_SIZE_ERROR, "a PRIORITY frame must be 5 bytes")
        if u32(payload) & STREAM_ID_MASK == stream_id:
            raise StreamFailure(stream_id, PROTOCOL_ERROR, "a stream cannot depend on itself")

    def _idle(self, stream_id: int) -> bool:
        """Never opened: by us (client side) or by the peer (server side)."""
        if self.client_side:
            return stream_id % 2 == 0 or stream_id >= self._next_id
        return stream_id % 2 == 0 or stream_id > self._last_peer_id

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionFailure(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._recv_window -= size
        if self._recv_window < 0:
            raise ConnectionFailure(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        stream = self.streams.get(stream_id)
        if stream is None or stream.remote_closed:
            if self._idle(stream_id):
                raise ConnectionFailure(PROTOCOL_ERROR, f"DATA on stream {stream_id}, which was never opened")
            # A stream we reset: what the peer sent before it knew is dropped (the connection's window reopens at
            # once). One the peer ended (END_STREAM, RST_STREAM) takes no more DATA (RFC 9113 5.1).
            self._credit(size)
            if stream is not None or stream_id not in self._reset_ids:
                raise StreamFailure(stream_id, STREAM_CLOSED, "DATA after the end of the stream")
            return
        stream.recv_window -= size
        if stream.recv_window < 0:
            self._credit(size)
            raise StreamFailure(stream_id, FLOW_CONTROL_ERROR, "DATA beyond the stream's window")
        stream.held += size  # the connection's window reopens by it as the relay takes it (Connection.ack)
        data = unpad(flags, payload, stream_id)
        if stream.expected is not None:
            stream.counted(len(data), bool(flags & END_STREAM))
        stream.buffer.add(data, size)
        if flags & END_STREAM:
            stream.received_end()

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionFailure(PROTOCOL_ERROR, "HEADERS on stream 0")
        block = unpad(flags, payload, stream_id)
        self._self_dependent = False
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise ConnectionFailure(FRAME_SIZE_ERROR, "HEADERS too short for its priority fields")
            self._self_dependent = u32(block) & STREAM_ID_MASK == stream_id
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, bool(flags & END_STREAM), block)
            return
        self._block, self._block_stream, self._block_size = [block], stream_id, len(block)
        self._block_end = bool(flags & END_STREAM)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != self._block_stream or not stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "CONTINUATION without the HEADERS it continues")
        self._block_size += len(payload)
        if self._block_size > MAX_HEADER_BLOCK:
            raise ConnectionFailure(ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
        self._block.append(payload)
        if flags & END_HEADERS:
            block = b"".join(self._block)
            self._block, self._block_stream = [], 0
            self._header_block(stream_id, self._block_end, block)

    def _header_block(self, stream_id: int, end_stream: bool, block: bytes) -> None:
        try:  # decoded whatever the stream: the HPACK state is the connection's
            headers = self._hpack.decode(block)
        except OversizedHeaderListError:
            raise ConnectionFailure(ENHANCE_YOUR_CALM, f"a header list over {MAX_HEADER_BLOCK} bytes") from None
        except HPACKError as exc:
            raise ConnectionFailure(COMPRESSION_ERROR, f"the header block is not valid HPACK: {exc}") from None
        stream = self.streams.get(stream_id)
        if stream is not None:
            if self._self_dependent:
                raise StreamFailure(stream_id, PROTOCOL_ERROR, "a stream cannot depend on itself")
            stream.received_headers(headers, end_stream)
        elif self.client_side or stream_id <= self._last_peer_id or stream_id % 2 == 0:
            if self._idle(stream_id) or stream_id not in self._reset_ids:
                raise ConnectionFailure(PROTOCOL_ERROR, f"HEADERS on stream {stream_id}: not a new stream "
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
            self.reset_sent(stream_id, PROTOCOL_ERROR)
            return
        if self.closed or self.draining or len(self.streams) >= MAX_STREAMS:
            self.reset_sent(stream_id, REFUSED_STREAM)
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
            self._waiting = waiting = _not_gone(waiting)  # reset meanwhile
            if len(waiting) >= MAX_STREAMS:
                raise ConnectionFailure(ENHANCE_YOUR_CALM, "too many streams opened while calls still end")
        waiting.append(stream)

    def _start(self, stream: Stream) -> None:
        if stream.gone:  # reset while it waited: no call
            return
        self.active += 1
        self.keeper.call_started()
        self.handler.accept(stream)

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a WINDOW_UPDATE frame must be 4 bytes")
        increment = u32(payload) & STREAM_ID_MASK
        if stream_id == 0:
            if not increment:
                raise ConnectionFailure(PROTOCOL_ERROR, "a WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ConnectionFailure(FLOW_CONTROL_ERROR, "the connection's window went past 2^31-1")
            for stream in list(self.blocked):
                stream.window_opened()
            return
        if self._idle(stream_id):
            raise ConnectionFailure(PROTOCOL_ERROR, f"WINDOW_UPDATE on stream {stream_id}, never opened")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        if not increment:
            raise StreamFailure(stream_id, PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        stream.send_window += increment
        if stream.send_window > MAX_WINDOW:
            raise StreamFailure(stream_id, FLOW_CONTROL_ERROR, "the stream's window went past 2^31-1")
        stream.window_opened()

    def _rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a RST_STREAM frame must be 4 bytes")
        if stream_id == 0 or self._idle(stream_id):
            raise ConnectionFailure(PROTOCOL_ERROR, f"RST_STREAM on stream {stream_id}, never opened")
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream.reset_code = code = u32(payload)
            stream.refused = code == REFUSED_STREAM  # not processed (RFC 9113 8.7)
            stream.ended_early(reset_by_peer=True)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise ConnectionFailure(FRAME_SIZE_ERROR, "a SETTINGS ACK must be empty")
            self.keeper.settings_acked()
            return
        for key, value in parse_settings(payload):
            if key == INITIAL_WINDOW_SIZE:
                self._initial_window(value)
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE_LIMIT:
                    raise ConnectionFailure(PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} is out of range")
                self.peer_max_frame = value
            elif key == ENABLE_PUSH:
                if value > 1:
                    raise ConnectionFailure(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value} is not 0 or 1")
            elif key == MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == HEADER_TABLE_SIZE:
                self._hpack.peer_table_size(min(value, _ENCODER_TABLE))
        self.write(frame(SETTINGS, ACK, 0))

    def _initial_window(self, value: int) -> None:
        if value > MAX_WINDOW:
            raise ConnectionFailure(FLOW_CONTROL_ERROR, f"SETTINGS_INITIAL_WINDOW_SIZE {value} is over 2^31-1")
        delta = value - self.peer_initial_window
        self.peer_initial_window = value
        for stream in self.streams.values():
            stream.send_window += delta
            if stream.send_window > MAX_WINDOW:
                raise ConnectionFailure(FLOW_CONTROL_ERROR, "a stream's window went past 2^31-1")
            if delta > 0:
                stream.window_opened()

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a PING frame must be 8 bytes")
        if not flags & ACK and self.keeper.ping():
            self.write(frame(PING, ACK, 0, payload))

    def _goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise ConnectionFailure(PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise ConnectionFailure(FRAME_SIZE_ERROR, "a GOAWAY frame must be at least 8 bytes")
        self.goaway_received = True
        if not self.client_side:
            # A client's last_stream_id names the last stream *we* opened (none: no push), not its own:
            # its open calls complete, and it opens no more (RFC 9113 6.8).
            return
        last = u32(payload) & STREAM_ID_MASK
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
        settled = self._settled
        if settled is not None and not settled.done():
            settled.set_result(None)


def _not_gone(streams: deque[Stream]) -> deque[Stream]:
    """The streams of ``streams`` not reset meanwhile (a function of its own: a cpdef method has no closure)."""
    return deque(stream for stream in streams if not stream.gone)
