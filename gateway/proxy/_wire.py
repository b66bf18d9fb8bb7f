"""Bytes on the wire: header tables, response heads, error pages (JSON or HTML), request IDs.

Everything here is a pure function or a constant, so the protocol classes in
``_request``, ``_downstream`` and ``_upstream`` only move bytes and never format text on the hot
path beyond one ``join`` per message head.
"""

from __future__ import annotations

import os
import re
import secrets
from http import HTTPStatus

from gateway._compiled import COMPILED
from gateway.access import COOKIE_NAME
from gateway.errors import BadRequest, GatewayError, TooManyConnections, render, wants_html
from gateway.proxy._admission import (  # noqa: F401  # the rules, as _request.py imports them
    IDENTITY_HEADER_NAMES, R_AUTH, R_BOT, R_CL, R_CONNECTION, R_COOKIE, R_DROP, R_EXPECT, R_HOST, R_ORG, R_PASS,
    R_REQUEST_ID, R_SANDBOX_ID, R_SANDBOX_NS, R_SANDBOX_PORT, R_SESSION, R_TE, R_TIMEOUT, R_UPGRADE, R_USER, R_XFF,
    REQUEST_HEADERS, REQUEST_HEADERS_EXACT, SANDBOX_HEADER_PREFIXES)

# -- request headers ----------------------------------------------------------
# What each request header means (identity, credentials, the router's X-Sandbox-* vocabulary, hop-by-hop) is
# the admission's rules (gateway/proxy/_admission.py, imported above), the one place every front door takes
# them from; gateway/proxy/_request.py imports them from here

ACCESS_COOKIE = COOKIE_NAME.encode() + b"="  # the access-token cookie, cut out of Cookie (never forwarded)
HOST_ACCESS_COOKIE = b"__Host-" + ACCESS_COOKIE  # its name where the scheme is https (host mode)


# -- response headers ---------------------------------------------------------
# Response heads are rewritten as a whole (llhttp has validated them: CRLF line
# ends, no obs-fold, no space before the colon), so these work on the raw head,
# which starts with the status line and ends before its final CRLF CRLF.
# Trailer is not among them (RFC 9110 6.6.2): it announces the trailer fields, which pass through with a
# chunked body; a client that reads them needs it.
HOP_BY_HOP = re.compile(  # on the lower-cased head
    rb"\r\n(connection|keep-alive|proxy-connection|te|transfer-encoding|upgrade):([^\r]*)")
_SSE_CONTENT_TYPE = re.compile(rb"\r\ncontent-type:[ \t]*text/event-stream")  # on the lower-cased head
_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding:[^\r]*", re.I)

CODING_NONE = 0     # no Transfer-Encoding
CODING_CHUNKED = 1  # chunked last: the body can pass through as it is
CODING_OTHER = 2    # some other coding last: the body ends when the connection does


def strip_hop_by_hop(head: bytes, low: bytes, match: re.Match[bytes]) -> tuple[bytes, int]:
    """``head`` without its hop-by-hop lines (``match`` is the first) except Transfer-Encoding, and
    headers named in Connection; and what the Transfer-Encoding says (CODING_*)."""
    name = match[1]
    if name == b"connection" and match[2].strip() in CONNECTION_OPTIONS:
        # The usual case: one "Connection: keep-alive" line.
        start, end = match.span()
        if HOP_BY_HOP.search(low, end) is None:
            return head[:start] + head[end:], CODING_NONE
    parts = []
    start = 0
    coding = CODING_NONE
    tokens: set[bytes] | None = None
    while match is not None:
        name = match.group(1)
        if name == b"transfer-encoding":
            coding = CODING_CHUNKED if match.group(2).rsplit(b",", 1)[-1].strip() == b"chunked" else CODING_OTHER
        else:
            if name == b"connection":
                value = match.group(2).strip()
                if value not in CONNECTION_OPTIONS:
                    named = connection_tokens(value) - FRAMING_HEADERS
                    if named:
                        tokens = named if tokens is None else tokens | named
            parts.append(head[start:match.start()])
            start = match.end()
        match = HOP_BY_HOP.search(low, match.end())
    parts.append(head[start:])
    head = b"".join(parts)
    if tokens:
        head = re.sub(rb"\r\n(?:" + b"|".join(re.escape(name) for name in tokens) + rb"):[^\r]*", b"", head,
                      flags=re.I)
    return head, coding


def plain_head(raw: bytes, pos: int, request_id: bytes) -> tuple[bytes, int] | None:
    """A common response head rewritten in one pass over its bytes, for the compiled build (C indexing; as
    Python it is correct but slow, so the pure build keeps the general rewrite): the head to send (its
    X-Request-Id added) and where the body starts, when the rewrite would only take a single
    ``Connection`` option line out of it; else None.

    None, and so the general rewrite (``strip_hop_by_hop``, which this must agree with), for anything
    else: a status line other than ``HTTP/1.1``, any other hop-by-hop line but Transfer-Encoding (kept,
    as the rewrite keeps it), a second Connection line or one naming headers, the sandbox's own
    X-Request-Id, an event stream, a control byte but tab in a line, a line that is not CRLF-ended."""
    s = raw  # compiled: a char pointer
    n = len(raw)
    while pos + 1 < n and s[pos] == 13 and s[pos + 1] == 10:
        pos += 2
    if not _is(s, n, pos, b"HTTP/1.1 ", False):
        return None
    cut = resume = -1
    line = pos  # the start of the line being read; the status line first
    while True:
        colon = _name_end(s, n, line)
        end = _line_end(s, n, colon)
        if end < 0:
            return None
        if end == line:  # the empty line: the head ends before it
            break
        verdict = _plain_line(s, n, line, colon, end) if line != pos else 0
        if verdict < 0 or (verdict == 1 and cut >= 0):  # ... or a second Connection line
            return None
        if verdict == 1:
            cut, resume = line - 2, end
        line = end + 2
    if cut < 0:
        cut = resume = line - 2
    return b"".join((raw[pos:cut], raw[resume:line - 2], b"\r\nX-Request-Id: ", request_id, b"\r\n\r\n")), line + 2


def _name_end(s: bytes, n: int, i: int) -> int:
    """Where a header name starting at ``i`` ends: its colon, or the control byte before one."""
    while i < n:
        c = s[i]
        if c == 58 or c <= 13:
            break
        i += 1
    return i


def _line_end(s: bytes, n: int, i: int) -> int:
    """Where the line containing ``i`` ends (its CR of CRLF), or -1 for a control byte but tab before it
    or a CR without LF. One comparison a byte: letters and most punctuation are above CR."""
    c = 0
    while i < n:
        c = s[i]
        if c <= 13 and c != 9:
            break
        i += 1
    return i if c == 13 and i + 1 < n and s[i + 1] == 10 else -1


def _plain_line(s: bytes, n: int, start: int, colon: int, end: int) -> int:
    """One header line (``s[start:end]``, name up to ``colon``) to :func:`plain_head`: 0 kept as it is,
    1 a Connection line with only an option (taken out), -1 one the general rewrite must see."""
    if colon >= end or s[colon] != 58:
        return -1
    size = colon - start
    if size == 10 and _is(s, n, start, b"connection", True):
        return _connection_option(s, n, colon + 1, end)
    if size == 12 and _is(s, n, start, b"content-type", True):
        i = colon + 1
        while i + 12 <= end:  # "event-stream" anywhere in the value: the general rewrite's SSE check decides
            if (s[i] | 32) == 101 and _is(s, n, i, b"event-stream", True):  # 'e' or 'E' first
                return -1
            i += 1
        return 0
    word = (b"te" if size == 2 else b"upgrade" if size == 7 else b"keep-alive" if size == 10
            else b"x-request-id" if size == 12 else b"proxy-connection" if size == 16 else None)
    return -1 if word is not None and _is(s, n, start, word, True) else 0  # Transfer-Encoding is kept


def _connection_option(s: bytes, n: int, value: int, end: int) -> int:
    """1 when the Connection value ``s[value:end]`` is one option (close, keep-alive, upgrade), else -1."""
    while value < end and (s[value] == 32 or s[value] == 9):
        value += 1
    while end > value and (s[end - 1] == 32 or s[end - 1] == 9):
        end -= 1
    size = end - value
    if ((size == 10 and _is(s, n, value, b"keep-alive", True)) or (size == 5 and _is(s, n, value, b"close", True))
            or (size == 7 and _is(s, n, value, b"upgrade", True))):
        return 1
    return -1


def _is(s: bytes, n: int, at: int, word: bytes, fold: bool) -> bool:
    """``s[at:]`` (``n`` bytes long) starts with ``word`` (lower-case letters, digits, punctuation), ASCII
    letters folded to lower case when ``fold``."""
    size = len(word)
    w = word  # compiled: a char pointer
    if at + size > n:
        return False
    for k in range(size):
        c = s[at + k]
        if fold and 65 <= c <= 90:
            c += 32
        if c != w[k]:
            return False
    return True


# -- a plain request head, read without llhttp (the compiled build) --------------
# Byte classes for plain_request, one flag a byte: a request target's byte (a conservative subset of what llhttp
# takes in a path and query), a header name's (letters, digits, '-', '_': tokens), a header value's (visible
# ASCII and space). Everything else (tab, obs-text, control bytes, '#', quotes, brackets, ...) sends the head
# to llhttp.
_T_URL, _T_NAME, _T_VALUE = 1, 2, 4
_BYTE_CLASS = bytes(
    (_T_URL if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c in b"-._~/?=&%+,;:@!$*'()") else 0)
    | (_T_NAME if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c in b"-_") else 0)
    | (_T_VALUE if 32 <= c <= 126 else 0)
    for c in range(256))
_PLAIN_METHODS = (b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH")
# on_header's table's names (_admission.REQUEST_HEADERS_EXACT) but framing ones, its own key objects, one a slot:
# plain_request hands these on, not new bytes, so a common name costs no allocation and no hashing (the table finds
# its own key by identity); equal bytes either way. Capitalised spellings win a shared slot; the other is sliced.


def _name_slot(size: int, first: int, middle: int, last: int) -> int:
    return ((size << 5) ^ first ^ (middle << 1) ^ (last << 2)) & 511


def _name_slots() -> tuple[bytes | None, ...]:
    slots: list[bytes | None] = [None] * 512
    for name in sorted(REQUEST_HEADERS_EXACT, key=lambda name: name[:1].islower()):
        slot = _name_slot(len(name), name[0], name[len(name) >> 1], name[-1])
        if slots[slot] is None and name.lower() not in (
                b"content-length", b"transfer-encoding", b"connection", b"proxy-connection", b"upgrade"):
            slots[slot] = name
    return tuple(slots)


_NAME_SLOTS = _name_slots()


def plain_request(data: bytes) -> list[bytes] | None:
    """A read that is exactly one plain request head, for the compiled build (C indexing; as Python correct but
    slow: the pure build leaves every head to llhttp): ``[method, target, name, value, ...]``; else None.

    Plain: a common method but CONNECT, a target in origin-form of ``_BYTE_CLASS``'s bytes, ``HTTP/1.1``, lines
    of a token name, ``:``, spaces, a non-empty value of visible ASCII and inner spaces, CRLF, the empty line,
    nothing after it, and no Content-Length, Transfer-Encoding, Connection, Proxy-Connection or Upgrade line:
    no body, keep-alive, no upgrade, so llhttp would end the message there and stay where it is. The rest
    (framing, obs-fold, bare CR or LF, tabs, trailing spaces, other bytes, pipelining, HTTP/1.0) is llhttp's;
    tests/test_plain_request.py holds the two to the same answers."""
    s = data  # compiled: a char pointer
    n = len(data)
    if n < 18 or s[n - 1] != 10 or s[n - 2] != 13 or s[n - 3] != 10 or s[n - 4] != 13:
        return None  # from here on, every scan stops at the final LF at the latest
    method = _plain_method(s, n)
    if method is None:
        return None
    size = len(method)
    i = size + 1
    table = _BYTE_CLASS  # compiled: a char pointer (no bounds check a byte)
    while table[s[i]] & _T_URL:
        i += 1
    if i == size + 1 or s[size + 1] != 47 or not _is(s, n, i, b" HTTP/1.1\r\n", False):  # "/..."
        return None
    parts = [method, s[size + 1:i]]  # compiled: bytes made from the char pointer (no slice object)
    line = i + 11
    while line < n - 2:
        colon = _colon(s, line)
        value = _value(s, colon)
        end = _value_end(s, value)
        if end < 0 or _framing_name(s, n, line, colon - line):
            return None
        parts.append(_header_name(s, n, line, colon))
        parts.append(s[value:end])
        line = end + 2
    return parts if line == n - 2 else None


def plain_response(data: bytes, request_id: bytes) -> tuple[bytes, int, int] | None:
    """A read that is exactly one plain keep-alive response, head and whole body, for the compiled build: what
    the client is sent (the head as :func:`plain_head` rewrites it, then the body), the status and the body's
    size; else None, and llhttp reads it. Plain means: ``HTTP/1.1``, a 2xx status but 204 and 205, a reason
    of visible ASCII and spaces, header lines as :func:`plain_request` takes them, one Content-Length of
    digits that the bytes after the head match exactly, at most one ``Connection: keep-alive``, and none of
    what the general rewrite must see (see :func:`plain_head`). tests/test_plain_request.py holds it to
    llhttp and plain_head."""
    n = len(data)  # every scan below stops at a byte out of its class, the NUL after a bytes object's last at the latest
    if not COMPILED:
        data += b"\0"  # as Python, that NUL is there too
    s = data  # compiled: a char pointer
    line = _status_end(s, n)
    if line < 0:
        return None
    length = cut = resume = -1
    while s[line] != 13 or s[line + 1] != 10:  # until the empty line (a CR is before the NUL: s[line + 1] is in)
        colon = _colon(s, line)
        value = _value(s, colon)
        end = _value_end(s, value)
        kind = _response_line(s, n, line, colon, value, end)
        if kind == _R_LENGTH and length < 0:
            length = _digits(s, value, end)
            if length < 0:
                return None
        elif kind == _R_KEEP_ALIVE and cut < 0:
            cut, resume = line - 2, end
        elif kind != _R_PLAIN:
            return None
        line = end + 2
    head = line + 2  # the head's size, its empty line in
    if length < 0 or n - head != length:
        return None
    if cut < 0:
        cut = resume = line - 2
    return (b"".join((s[:cut], s[resume:line - 2], b"\r\nX-Request-Id: ", request_id, b"\r\n\r\n", s[head:n])),
            (s[9] - 48) * 100 + (s[10] - 48) * 10 + s[11] - 48, length)


_R_PLAIN, _R_LENGTH, _R_KEEP_ALIVE, _R_OTHER = 0, 1, 2, 3  # _response_line's kinds of line


def _response_line(s: bytes, n: int, line: int, colon: int, value: int, end: int) -> int:
    """A plain response's header line (name ``s[line:colon]``, value ``s[value:end]``; ``end`` -1 when the
    line is not plain): Content-Length, ``Connection: keep-alive``, another plain line, or other."""
    if end < 0:
        return _R_OTHER
    size = colon - line
    if size == 14 and _is(s, n, line, b"content-length", True):
        return _R_LENGTH
    if size == 10 and _is(s, n, line, b"connection", True):
        return _R_KEEP_ALIVE if end - value == 10 and _is(s, n, value, b"keep-alive", True) else _R_OTHER
    if _plain_line(s, n, line, colon, end) != 0 or _framing_name(s, n, line, size):
        return _R_OTHER
    return _R_PLAIN


def _status_end(s: bytes, n: int) -> int:
    """Where the headers start after a plain response's status line (``HTTP/1.1``, 2xx but 204 and 205, a reason
    of visible ASCII and spaces), in a head of ``n`` bytes; else -1."""
    if n < 19 or not _is(s, n, 0, b"HTTP/1.1 2", False) or not (48 <= s[10] <= 57 and 48 <= s[11] <= 57):
        return -1
    if s[12] != 32 or (s[10] == 48 and (s[11] == 52 or s[11] == 53)):  # 204, 205: no body
        return -1
    i = 13
    table = _BYTE_CLASS  # compiled: a char pointer (no bounds check a byte)
    while table[s[i]] & _T_VALUE:
        i += 1
    return i + 2 if s[i] == 13 and s[i + 1] == 10 else -1


def _header_name(s: bytes, n: int, line: int, colon: int) -> bytes:
    """The name ``s[line:colon]`` (not empty): the one in its slot of ``_NAME_SLOTS`` when that is it, else new bytes."""
    size = colon - line
    word = _NAME_SLOTS[_name_slot(size, s[line], s[line + (size >> 1)], s[colon - 1])]
    if word is not None and len(word) == size and _is(s, n, line, word, False):
        return word
    return s[line:colon]


def _plain_method(s: bytes, n: int) -> bytes | None:
    """The request line's method, when it is one of _PLAIN_METHODS followed by a space."""
    for word in _PLAIN_METHODS:
        if _is(s, n, 0, word, False) and s[len(word)] == 32:
            return word
    return None


def _colon(s: bytes, line: int) -> int:
    """Where a header line's token name starting at ``line`` ends in its colon; -1 for no such name."""
    i = line
    table = _BYTE_CLASS  # compiled: a char pointer (no bounds check a byte)
    while table[s[i]] & _T_NAME:
        i += 1
    return i if i > line and s[i] == 58 else -1


def _value(s: bytes, colon: int) -> int:
    """Where the value after ``colon`` starts (past its spaces); -1 when ``colon`` is."""
    if colon < 0:
        return -1
    i = colon + 1
    while s[i] == 32:
        i += 1
    return i


def _value_end(s: bytes, value: int) -> int:
    """Where a non-empty value of visible ASCII and inner spaces starting at ``value`` ends in CRLF; else -1."""
    if value < 0:
        return -1
    end = value
    table = _BYTE_CLASS  # compiled: a char pointer (no bounds check a byte)
    while table[s[end]] & _T_VALUE:
        end += 1
    return end if end > value and s[end] == 13 and s[end + 1] == 10 and s[end - 1] != 32 else -1


def _digits(s: bytes, value: int, end: int) -> int:
    """``s[value:end]`` as a decimal number when it is only digits (at most 15), else -1."""
    if end - value > 15:
        return -1
    number = 0
    for k in range(value, end):
        if not 48 <= s[k] <= 57:
            return -1
        number = number * 10 + s[k] - 48
    return number


def _framing_name(s: bytes, n: int, start: int, size: int) -> bool:
    """A header name llhttp acts on (framing, keep-alive, upgrade): such a head is llhttp's to read."""
    word = (b"content-length" if size == 14 else b"transfer-encoding" if size == 17 else b"connection"
            if size == 10 else b"proxy-connection" if size == 16 else b"upgrade" if size == 7 else None)
    return word is not None and _is(s, n, start, word, True)


def is_event_stream(low: bytes) -> bool:
    """Content-Type: text/event-stream, in a lower-cased head."""
    return low.find(b"event-stream") >= 0 and _SSE_CONTENT_TYPE.search(low) is not None


def declares_stream(headers: list[bytes]) -> bool:
    """The request asks for an event stream (``Accept: text/event-stream``); ``headers`` as in Exchange."""
    for i in range(0, len(headers), 4):
        if headers[i].lower() == b"accept" and b"text/event-stream" in headers[i + 2].lower():
            return True
    return False


def without_transfer_encoding(head: bytes) -> bytes:
    return _TRANSFER_ENCODING.sub(b"", head)


# Connection tokens that are options, not header names.
CONNECTION_OPTIONS = frozenset((b"close", b"keep-alive", b"upgrade"))
# Never removed because a Connection header named them: they frame the message.
FRAMING_HEADERS = frozenset((b"content-length", b"transfer-encoding"))

IDEMPOTENT_METHODS = frozenset((b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"))

# -- fixed byte strings -------------------------------------------------------
CRLF = b"\r\n"
SP = b" "
HTTP11_CRLF = b" HTTP/1.1\r\n"
COLON = b": "
CHUNK_END = b"0\r\n\r\n"
CONTINUE_100 = b"HTTP/1.1 100 Continue\r\n\r\n"
XFP_HTTP = b"X-Forwarded-Proto: http\r\n"
TE_CHUNKED = b"Transfer-Encoding: chunked\r\n"
WS_UPGRADE = b"Connection: Upgrade\r\nUpgrade: websocket\r\n"


def last_chunk(trailers: list[bytes] | None) -> bytes:
    """The end of a chunked body, with the request's trailer fields (RFC 9112 7.1.2) when it had some."""
    return CHUNK_END if trailers is None else b"0\r\n" + b"".join(trailers) + CRLF


CONN_CLOSE = b"Connection: close\r\n"
CONN_KEEP_ALIVE = b"Connection: keep-alive\r\n"

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}


def connection_tokens(value: bytes) -> set[bytes]:
    """Header names listed in a Connection header (its options removed)."""
    tokens = {token.strip().lower() for token in value.split(b",")}
    return {token for token in tokens if token and token not in CONNECTION_OPTIONS}


def without_headers(parts: list[bytes], names: set[bytes]) -> list[bytes]:
    """``parts`` holds groups of (name, ": ", value, CRLF); drop groups whose name is in ``names``."""
    names = names - FRAMING_HEADERS
    if not names:
        return parts
    kept: list[bytes] = []
    for i in range(0, len(parts), 4):
        if parts[i].lower() not in names:
            kept += parts[i:i + 4]
    return kept


def cut_access_cookie(value: bytes) -> tuple[bytes, list[bytes]]:
    """A ``Cookie`` value without the access-token cookie(s), and their values."""
    kept = []
    tokens = []
    for pair in value.split(b";"):
        item = pair.strip()
        if item.startswith(ACCESS_COOKIE):
            tokens.append(item[len(ACCESS_COOKIE):])
        elif item.startswith(HOST_ACCESS_COOKIE):
            tokens.append(item[len(HOST_ACCESS_COOKIE):])
        elif item:
            kept.append(item)
    return b"; ".join(kept), tokens


def host_line(host: str, port: int) -> bytes:
    try:
        name = host.encode("ascii")
    except UnicodeEncodeError:
        name = host.encode("idna")
    if b":" in name:
        name = b"[" + name + b"]"
    return b"Host: %s:%d\r\n" % (name, port)


def status_line(status: int, reason: bytes) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, reason or _REASONS.get(status, b"Unknown"))


def error_response(exc: GatewayError, request_id: bytes, *, close: bool, keep_alive_10: bool = False,
                   as_html: bool = False, extra: bytes = b"") -> bytes:
    """A complete error response (head and body) for a request the proxy answers itself: JSON, or the
    same error as a page for a browser's navigation (``as_html``, see :func:`navigation`)."""
    content_type, body, headers = render(exc, as_html=as_html)
    parts = [
        b"HTTP/1.1 %d %s\r\n" % (exc.status, _REASONS.get(exc.status, b"Error")),
        b"Content-Type: %s\r\nContent-Length: %d\r\nX-Request-Id: " % (content_type.encode(), len(body)),
        request_id,
        CRLF,
    ]
    for name, value in headers.items():
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    parts.append(extra)  # whole header lines (CRLF-ended) the caller adds
    parts.append(CONN_CLOSE if close else CONN_KEEP_ALIVE if keep_alive_10 else b"")
    parts.append(CRLF)
    parts.append(body)
    return b"".join(parts)


# A refused connection's answer, but for its request ID, per refusal message (a handful: one per listener and
# bound, and a new one only when a reload moves a bound). Under a connection flood a listener refuses thousands
# a second, and rendering the same JSON error each time was a twentieth of the gateway's CPU.
_REFUSALS: dict[str, tuple[bytes, bytes]] = {}
_ID_MARK = b"\x00"  # in no rendered error: JSON escapes it and a message is text


def refusal_response(message: str, request_id: bytes) -> bytes:
    """``error_response(TooManyConnections(message), request_id, close=True)``, its bytes either side of the
    request ID made once per message."""
    parts = _REFUSALS.get(message)
    if parts is None:
        if len(_REFUSALS) >= 64:  # bounds that moved many times: start over
            _REFUSALS.clear()
        head, _, tail = error_response(TooManyConnections(message), _ID_MARK, close=True).partition(_ID_MARK)
        parts = _REFUSALS[message] = (head, tail)
    return parts[0] + request_id + parts[1]


def body_length(response: bytes) -> int:
    """The body bytes of a whole response the gateway wrote itself (what the access log counts)."""
    return len(response) - response.find(b"\r\n\r\n") - 4


def navigation(headers: list[bytes]) -> bool:
    """A browser's navigation (errors.wants_html) by the request's forwarded headers (as in Exchange).
    Read only when an error is answered, so the hot path pays nothing for it."""
    fetch_mode = accept = None
    for i in range(0, len(headers), 4):
        name = headers[i].lower()
        if name == b"sec-fetch-mode":
            fetch_mode = headers[i + 2]
        elif name == b"accept":
            accept = headers[i + 2]
    return wants_html(fetch_mode, accept)


def redirect_response(status: int, location: bytes, set_cookie: bytes | None, request_id: bytes, *, close: bool) -> bytes:
    """A body-less redirect the proxy answers itself (an access token in the URL swapped for a cookie)."""
    parts = [b"HTTP/1.1 %d %s\r\nLocation: " % (status, _REASONS.get(status, b"Redirect")), location,
             b"\r\nContent-Length: 0\r\nCache-Control: no-store\r\nX-Request-Id: ", request_id, CRLF]
    if set_cookie is not None:
        parts += (b"Set-Cookie: ", set_cookie, CRLF)
    parts.append(CONN_CLOSE if close else b"")
    parts.append(CRLF)
    return b"".join(parts)


H2_PREFACE = b"PRI * HTTP/2.0\r\n"


def h2_refusal(grpc_port: int) -> BadRequest:
    """The answer to an HTTP/2 prior-knowledge preface: this port speaks HTTP/1.1; gRPC has its own port."""
    where = f"port {grpc_port}" if grpc_port else "the gRPC port (settings.grpc_port)"
    return BadRequest(f"this is the HTTP/1.1 data plane (WebSocket and SSE included); HTTP/2 with prior knowledge "
                      f"and gRPC go to the gateway's gRPC front on {where} (h2c)", code="http2_not_supported")


sane_request_id = re.compile(rb"[A-Za-z0-9._:/+=@-]{1,128}").fullmatch


class RequestIds:
    """Unique request IDs without a syscall per request: a random per-process prefix and a counter
    (compiled: a C integer, and ``next`` a C call from the data plane's hot path)."""

    __slots__ = ("prefix", "count")

    def __init__(self) -> None:
        self.prefix = f"{secrets.token_hex(4)}{os.getpid():x}-"
        self.count = 0

    def next(self) -> bytes:
        self.count += 1
        # An f-string of a C integer and an ASCII encode: compiled, no ``bytes %`` (its format parser).
        return f"{self.prefix}{self.count:x}".encode("ascii")
