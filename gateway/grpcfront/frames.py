"""HTTP/2 framing (RFC 9113 section 4, 6): the constants, the frame writers and the protocol errors.

Pure: bytes in, bytes out. ``connection`` reads frames and keeps the state; this
module only knows their layout.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# error codes
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
CONNECT_ERROR = 0xA
ENHANCE_YOUR_CALM = 0xB
INADEQUATE_SECURITY = 0xC
HTTP_1_1_REQUIRED = 0xD

ERROR_NAMES = {NO_ERROR: "NO_ERROR", PROTOCOL_ERROR: "PROTOCOL_ERROR", INTERNAL_ERROR: "INTERNAL_ERROR",
               FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR", STREAM_CLOSED: "STREAM_CLOSED",
               FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR", REFUSED_STREAM: "REFUSED_STREAM", CANCEL: "CANCEL",
               COMPRESSION_ERROR: "COMPRESSION_ERROR", CONNECT_ERROR: "CONNECT_ERROR",
               ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM", INADEQUATE_SECURITY: "INADEQUATE_SECURITY",
               HTTP_1_1_REQUIRED: "HTTP_1_1_REQUIRED", 0x4: "SETTINGS_TIMEOUT"}

# settings
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_SIZE_LIMIT = 2**24 - 1
STREAM_ID_MASK = 0x7FFF_FFFF

# A frame's head: the 24-bit length and the type as one 32-bit field, flags, stream id (three integers to pack,
# not five), with ``pack`` bound once.
_HEAD = bytearray(9)  # frame() writes each head here
_SETTING = struct.Struct("!HL")
_U32 = struct.Struct("!L")
_GOAWAY = struct.Struct("!LL")


class ConnectionFailure(Exception):
    """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, then the connection closes."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class StreamFailure(Exception):
    """A stream error (RFC 9113 5.4.2): RST_STREAM with ``code`` on ``stream_id``; the connection lives on."""

    def __init__(self, stream_id: int, code: int, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    """The frame's 9-byte head is written into one bytearray the module keeps (compiled: C stores; the loop's
    thread is the only writer) and joined with the payload in one copy: a ``struct`` pack of boxed ints plus a
    concatenation was about 1.5k instructions a frame, 5 frames a unary call."""
    size = len(payload)
    head = _HEAD
    head[0] = size >> 16 & 0xFF
    head[1] = size >> 8 & 0xFF
    head[2] = size & 0xFF
    head[3] = kind
    head[4] = flags
    head[5] = stream_id >> 24 & 0xFF
    head[6] = stream_id >> 16 & 0xFF
    head[7] = stream_id >> 8 & 0xFF
    head[8] = stream_id & 0xFF
    return b"".join((head, payload))


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ConnectionFailure(FRAME_SIZE_ERROR, "a SETTINGS frame's length must be a multiple of 6")
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def u32(payload: bytes) -> int:
    """The first 4 bytes as an unsigned int (WINDOW_UPDATE increment, RST_STREAM code), read byte by byte: compiled,
    C reads of the bytes (every caller has checked the length)."""
    return payload[0] << 24 | payload[1] << 16 | payload[2] << 8 | payload[3]


def header_frames(stream_id: int, block: bytes, end_stream: bool, max_size: int) -> bytes:
    """A header block as HEADERS plus as many CONTINUATION frames as the peer's frame size needs."""
    flags = END_STREAM if end_stream else 0
    if len(block) <= max_size:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    parts = [frame(HEADERS, flags, stream_id, block[:max_size])]
    for start in range(max_size, len(block), max_size):
        last = start + max_size >= len(block)
        parts.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[start:start + max_size]))
    return b"".join(parts)


def unpad(flags: int, payload: bytes, stream_id: int) -> bytes:
    """A DATA or HEADERS payload without its padding (the PADDED flag)."""
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ConnectionFailure(PROTOCOL_ERROR, f"stream {stream_id}: padding longer than the frame")
    return payload[1:len(payload) - payload[0]]
