"""The compiled build's one-pass scan of a response head (``_wire.plain_head``) against the general rewrite.

``UpstreamConnection.on_headers_complete`` takes the scan's way only in the compiled build; these run
the scan itself both ways (as Python it is the same code, only slower) and check that whenever it
says a head is plain, the head it makes is byte for byte the one the general rewrite
(lower-casing, ``HOP_BY_HOP``, ``strip_hop_by_hop``, the X-Request-Id and event-stream checks) would
make, and that the heads sandboxes usually send are plain (so that the fast way is taken at all).
The wire contract itself, through sockets, is test_proxy_http.py's, which runs both ways too.
"""

from __future__ import annotations

import random

import pytest

from gateway.proxy._wire import HOP_BY_HOP, is_event_stream, plain_head, strip_hop_by_hop

NGINX = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 15:00:00 GMT\r\n"
         b"Content-Type: text/html\r\nContent-Length: 13\r\nConnection: keep-alive\r\nAccept-Ranges: bytes\r\n\r\n")


def general(raw: bytes) -> tuple[bytes, bool]:
    """What on_headers_complete's general way makes of a final response head passed through (its head
    before the X-Request-Id line), and whether that way would do more (its own X-Request-Id, an
    event stream, a status line rewritten)."""
    pos = 0
    while raw.startswith(b"\r\n", pos):
        pos += 2
    head = raw[pos:raw.find(b"\r\n\r\n", pos)]
    low = head.lower()
    match = HOP_BY_HOP.search(low)
    if match is not None:
        head, _ = strip_hop_by_hop(head, low, match)
    more = (not head.startswith(b"HTTP/1.1 ") or b"\r\nx-request-id:" in low
            or (b"event-stream" in low and is_event_stream(low)))
    return head, more


def through_plain(raw: bytes) -> bytes | None:
    """The head plain_head makes (without the X-Request-Id it adds), checking where it says the body starts."""
    found = plain_head(raw, 0, b"rid-1")
    if found is None:
        return None
    head, body_at = found
    assert body_at == raw.find(b"\r\n\r\n", len(raw) - len(raw.lstrip(b"\r\n"))) + 4
    assert head.endswith(b"\r\nX-Request-Id: rid-1\r\n\r\n")
    return head[:-len(b"\r\nX-Request-Id: rid-1\r\n\r\n")]


@pytest.mark.parametrize("raw", [
    NGINX,
    NGINX.replace(b"Connection: keep-alive", b"CONNECTION:  Keep-Alive \t"),
    NGINX.replace(b"Connection: keep-alive", b"connection:close"),
    NGINX.replace(b"Connection: keep-alive\r\n", b""),
    b"\r\n\r\n" + NGINX,
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nTRANSFER-ENCODING: gzip, chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nSet-Cookie: a=b; Domain=x\r\nContent-Length: 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Connection: 1\r\nConnectionX: 2\r\nX-Te: 3\r\nTEE: 4\r\nContent-Length: 0\r\n\r\n",
])
def test_plain_heads_come_out_as_the_general_rewrite_makes_them(raw: bytes) -> None:
    expected, more = general(raw)
    assert not more
    assert through_plain(raw) == expected


@pytest.mark.parametrize("raw", [
    b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n",
    NGINX.replace(b"Connection: keep-alive", b"Connection: keep-alive, X-Private"),
    NGINX.replace(b"Connection: keep-alive", b"Connection: keep-alive\r\nConnection: close"),
    NGINX.replace(b"Connection: keep-alive", b"Connection: keep-alive\r\nKeep-Alive: timeout=5"),
    NGINX.replace(b"Connection: keep-alive", b"Proxy-Connection: x"),
    NGINX.replace(b"Connection: keep-alive", b"te: trailers"),
    NGINX.replace(b"Connection: keep-alive", b"Upgrade: h2c"),
    NGINX.replace(b"Connection: keep-alive", b"X-Request-ID: from-sandbox"),
    NGINX.replace(b"text/html", b"Text/Event-Stream; charset=utf-8"),
    NGINX.replace(b"text/html", b"multipart/x; a=event-stream"),
    NGINX.replace(b"\r\nServer", b"\nServer"),
    NGINX.replace(b"Accept-Ranges: bytes", b"X-Odd: a\x0bb"),
    NGINX.replace(b"Accept-Ranges: bytes", b"X-Odd: a\rb"),
    NGINX.replace(b"Accept-Ranges: bytes", b"No-Colon"),
])
def test_heads_the_general_rewrite_must_see_are_not_plain(raw: bytes) -> None:
    assert plain_head(raw, 0, b"rid-1") is None


def test_random_heads_agree_with_the_general_rewrite() -> None:
    """Lines from both kinds above in random order and spelling: a plain head is what the general way
    makes; the scan never calls plain a head the general way would do more to, or strip otherwise."""
    lines = [b"Connection: keep-alive", b"connection: close", b"Connection: Upgrade", b"Connection: x-a",
             b"Keep-Alive: 5", b"TE: trailers", b"Transfer-Encoding: chunked", b"Upgrade: websocket",
             b"X-Request-Id: r", b"Content-Type: text/event-stream", b"Content-Type: text/plain",
             b"Set-Cookie: s=1", b"Content-Length: 0", b"X-A: 1", b"Proxy-Connection: y", b"X-Te: 2"]
    rng = random.Random(33)
    plain = 0
    for _ in range(3000):
        chosen = [rng.choice(lines) for _ in range(rng.randrange(6))]
        chosen = [bytes(c ^ 32 if 97 <= c <= 122 and rng.random() < 0.3 else c for c in line) for line in chosen]
        raw = b"\r\n".join([b"HTTP/1.1 200 OK", *chosen]) + b"\r\n\r\nbody"
        expected, more = general(raw)
        got = through_plain(raw)
        if got is not None:
            plain += 1
            assert not more and got == expected, raw
    assert plain > 300  # the plain way is common among these, so it is exercised
