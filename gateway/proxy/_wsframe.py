"""WebSocket frame-header scanning for the raw byte splice after a 101 response.

The data plane does not run a WebSocket library: once the upgrade succeeds it
copies bytes between the two sockets as they arrive. To cap the size of a
client message without giving that up, :class:`MessageSizeGuard` watches the
client->sandbox byte stream *beside* the splice and reads only the frame
headers (RFC 6455 section 5.2). Payload bytes are skipped by counting, so the
guard never buffers, copies or unmasks a payload; its only state is a payload
countdown, a running message total and at most 13 bytes of a header split
across reads.

:func:`close_frame` builds the close frame the proxy sends to each side when the
guard returns a verdict (masked towards the sandbox, unmasked towards the client).
"""

from __future__ import annotations

import os

__all__ = ["MessageSizeGuard", "close_frame"]

CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_MESSAGE_TOO_BIG = 1009

_MAX_HEADER = 14            # 2 + 8 (64-bit length) + 4 (mask key)
_MAX_CONTROL_PAYLOAD = 125
_MSB_64 = 1 << 63


def _header(buf: bytes, pos: int) -> tuple[int, int] | None:
    """The frame header at ``buf[pos:]`` as (header length, payload length), or None if incomplete."""
    avail = len(buf) - pos
    if avail < 2:
        return None
    b1 = buf[pos + 1]
    length = b1 & 0x7F
    size = 6 if b1 & 0x80 else 2
    if length == 126:
        size += 2
        if avail < size:
            return None
        length = int.from_bytes(buf[pos + 2:pos + 4], "big")
    elif length == 127:
        size += 8
        if avail < size:
            return None
        length = int.from_bytes(buf[pos + 2:pos + 10], "big")
    elif avail < size:
        return None
    return size, length


class MessageSizeGuard:
    """Incremental RFC 6455 header scanner enforcing a maximum data-message size.

    A message's size is the sum of the payload lengths announced in the headers
    of its data frame and continuation frames. Control frames never count. That
    is what the sandbox receives only without a compression extension, so the
    data plane declines extensions (drops ``Sec-WebSocket-Extensions`` from the
    upgrade request) wherever a guard watches the client, and a frame with an RSV
    bit set (an extension's mark, e.g. permessage-deflate's RSV1) is refused with
    1002. ``rsv_ok`` keeps RSV bits unchecked for a stream whose extensions were
    negotiated end to end (the sandbox's frames, which are followed, not limited).
    """

    __slots__ = ("_max", "_skip", "_head", "_in_message", "_total", "_verdict", "_rsv")

    def __init__(self, max_message: int, *, rsv_ok: bool = False) -> None:
        if max_message < 0:
            raise ValueError("max_message must be >= 0")
        self._max = max_message
        self._skip = 0              # payload bytes of the current frame still to come
        self._head = b""            # a frame header split across feeds (< 14 bytes)
        self._in_message = False    # a fragmented data message awaits its FIN frame
        self._total = 0             # payload bytes of the current data message so far
        self._verdict: int | None = None
        self._rsv = 0 if rsv_ok else 0x70  # the RSV bits a frame may not carry

    @property
    def verdict(self) -> int | None:
        """The close code once the stream has been refused, else None."""
        return self._verdict

    @property
    def at_boundary(self) -> bool:
        """The bytes fed so far end between two frames (so a close frame can be sent after them)."""
        return not self._skip and not self._head and self._verdict is None

    def feed(self, data: bytes) -> int | None:
        """Scan the next bytes of the stream; None while acceptable, else a close code (sticky)."""
        if self._verdict is not None:
            return self._verdict
        skip = self._skip
        n = len(data)
        if skip >= n:                       # the common case: payload only
            self._skip = skip - n
            return None
        self._skip = 0
        if self._head:
            return self._resume(data)
        return self._scan(data, skip)

    def _resume(self, data: bytes) -> int | None:
        """Complete the buffered partial header with the start of ``data``, then scan on."""
        held = len(self._head)
        buf = self._head + data[:_MAX_HEADER - held]
        parsed = _header(buf, 0)
        if parsed is None:
            self._head = buf                # all of data was consumed into the header
            return None
        self._head = b""
        size, length = parsed
        code = self._frame(buf[0], length)
        if code is not None:
            return self._fail(code)
        return self._scan(data, size - held + length)

    def _scan(self, data: bytes, pos: int) -> int | None:
        """Walk the frame headers in ``data`` from ``pos``, jumping over each payload."""
        n = len(data)
        frame = self._frame
        while pos < n:
            parsed = _header(data, pos)
            if parsed is None:
                self._head = data[pos:]
                return None
            size, length = parsed
            code = frame(data[pos], length)
            if code is not None:
                return self._fail(code)
            pos += size + length
        self._skip = pos - n
        return None

    def _frame(self, b0: int, length: int) -> int | None:
        """Account for one frame header; a close code if it is refused."""
        if length >= _MSB_64 or b0 & self._rsv:
            return CLOSE_PROTOCOL_ERROR
        opcode = b0 & 0x0F
        fin = b0 & 0x80
        if opcode >= 8:
            if opcode > 10 or length > _MAX_CONTROL_PAYLOAD or not fin:
                return CLOSE_PROTOCOL_ERROR
            return None
        if opcode == 0:
            if not self._in_message:
                return CLOSE_PROTOCOL_ERROR
            total = self._total + length
        elif opcode <= 2:
            if self._in_message:
                return CLOSE_PROTOCOL_ERROR
            total = length
        else:
            return CLOSE_PROTOCOL_ERROR
        if total > self._max:
            return CLOSE_MESSAGE_TOO_BIG
        self._total = total
        self._in_message = not fin
        return None

    def _fail(self, code: int) -> int:
        self._verdict = code
        self._head = b""
        self._skip = 0
        return code


def close_frame(code: int, reason: str = "", *, masked: bool) -> bytes:
    """A complete close frame; ``masked`` for frames sent to a server (RFC 6455 5.3).

    The reason is cut, on a character boundary, so the payload fits 125 bytes.
    """
    if not 1000 <= code <= 4999:
        raise ValueError(f"close code out of range: {code}")
    text = reason.encode("utf-8")
    if len(text) > _MAX_CONTROL_PAYLOAD - 2:
        text = text[:_MAX_CONTROL_PAYLOAD - 2].decode("utf-8", "ignore").encode("utf-8")
    payload = code.to_bytes(2, "big") + text
    if not masked:
        return bytes((0x88, len(payload))) + payload
    key = os.urandom(4)
    return bytes((0x88, 0x80 | len(payload))) + key + _mask(payload, key)


def _mask(payload: bytes, key: bytes) -> bytes:
    """XOR ``payload`` with the repeating 4-byte ``key``."""
    n = len(payload)
    stream = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")
