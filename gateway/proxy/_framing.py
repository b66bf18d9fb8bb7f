"""How a sandbox's response body reaches the client: the framing chosen from its head, and the decoder of a
chunked body for an HTTP/1.0 client (the upstream side, gateway/proxy/_upstream.py, applies them).

Compiled with the data plane (gateway/_compiled.py); read only for a response llhttp reads (not the plain
path's), once per response head, and per read of a body that is decoded.
"""

from __future__ import annotations

from httptools import HttpResponseParser

from gateway.proxy._exchange import F_DECHUNK, F_NONE, F_PASS, F_RAW, F_RECHUNK, Exchange
from gateway.proxy._wire import CODING_CHUNKED, CODING_NONE, CODING_OTHER, TE_CHUNKED, WS_UPGRADE


class Dechunker:
    """Decodes a chunked body for an HTTP/1.0 client: a parser primed with a synthetic head."""

    __slots__ = ("parser", "out")

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.parser = HttpResponseParser(self)
        self.parser.feed_data(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        self.out.append(chunk)

    def decode(self, data: bytes) -> bytes:
        self.parser.feed_data(data)
        decoded = b"".join(self.out)
        self.out.clear()
        return decoded


def body_framing(ex: Exchange, status: int, coding: int, has_length: bool) -> tuple[int, bytes]:
    """How a response's body reaches the client (F_*), and the framing header the head gains."""
    if status == 101:
        return F_NONE, WS_UPGRADE
    if status == 204 or status == 304 or ex.method == b"HEAD":
        return F_NONE, b""
    if coding == CODING_CHUNKED or (has_length and coding == CODING_NONE):
        return (F_DECHUNK if ex.version10 and coding == CODING_CHUNKED else F_PASS), b""
    if coding == CODING_OTHER:
        return F_RAW, b""  # e.g. "Transfer-Encoding: gzip": as it came, delimited by closing
    if not ex.version10:
        return F_RECHUNK, TE_CHUNKED
    return F_RAW, b""
