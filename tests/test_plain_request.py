"""The compiled build reads the plainest request heads without llhttp (gateway/proxy/_wire.py ``plain_request``):
held here to llhttp's answers on generated heads, plain and hostile.

For every head, either ``plain_request`` defers (None: llhttp reads it, as before) or llhttp accepts the same
bytes as one whole keep-alive HTTP/1.1 request without a body or an upgrade, with the same method, target and
header lines, and is left ready for the next request. Run both ways: the compiled scan, and the same function
as Python.
"""

from __future__ import annotations

import random

import httptools
import pytest

from gateway.proxy._admission import REQUEST_HEADERS_EXACT
from gateway.proxy._wire import plain_head, plain_request, plain_response

# Bytes that make heads hostile: line ends, whitespace, separators, control and non-ASCII bytes.
ODD = [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"\x00", b"\x7f", b"\x80", b"\xff", b"\x0b", b"\x0c", b"#",
       b'"', b"<", b"\\", b"{", b"|", b"^", b"`", b"[", b",", b";", b"=", b"/", b"?", b"%", b"@", b"_", b"-",
       b"~", b"'", b"(", b"*", b"+", b".", b"!", b"$", b"&", b"\r\n\r\n", b"\r\n ", b"\r\n\t"]
METHODS = [b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"CONNECT", b"TRACE", b"PRI", b"get",
           b"GETS", b"G"]
NAMES = [b"Host", b"X-User-Id", b"X-Session-Id", b"X-Org-Id", b"Accept", b"User-Agent", b"Cookie", b"X-Sandbox-Id",
         b"Content-Length", b"content-length", b"CONTENT-LENGTH", b"Transfer-Encoding", b"Connection",
         b"Proxy-Connection", b"Upgrade", b"upgrade", b"Expect", b"Keep-Alive", b"TE", b"Content-Lengths",
         b"X_Under", b"Authorization", b"X-Request-Id", b"Trailer", b"Connectio", b"X-Forwarded-For"]
VALUES = [b"127.0.0.1:8080", b"bench-user", b"0", b"5", b"chunked", b"close", b"keep-alive", b"websocket",
          b"100-continue", b"a b", b"text/html, */*; q=0.8", b"Bearer abc.def", b"x" * 300, b"1, 2", b"gzip, chunked"]
TARGETS = [b"/", b"/index.html", b"/a/b?c=d&e=f", b"/p%20q", b"/x;y=z", b"/~u/@v:w", b"*", b"http://h/x",
           b"/a#frag", b'/q"', b"/{}", b"/a|b", b"/a\\b", b"//x", b"/" + b"y" * 2000]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.2", b"http/1.1", b"HTTP/0.9"]


class Recorder:
    """httptools' request callbacks, recorded."""

    def __init__(self) -> None:
        self.url = b""
        self.headers: list[bytes] = []
        self.begun = self.complete = 0
        self.body = b""

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers += (name, value)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete += 1


def llhttp_reads(data: bytes) -> tuple[Recorder, httptools.HttpRequestParser] | None:
    """What llhttp makes of ``data`` fed in one piece, or None when it refuses it or asks for an upgrade."""
    recorder = Recorder()
    parser = httptools.HttpRequestParser(recorder)
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        return None
    return recorder, parser


def assert_agrees(data: bytes) -> bool:
    """``plain_request`` defers, or llhttp reads ``data`` as the same one plain request; True when it did not defer."""
    parts = plain_request(data)
    if parts is None:
        return False
    read = llhttp_reads(data)
    assert read is not None, f"llhttp refuses what the plain path takes: {data!r}"
    recorder, parser = read
    assert (recorder.begun, recorder.complete, recorder.body) == (1, 1, b""), data
    assert parser.get_method() == parts[0] and recorder.url == parts[1], data
    assert recorder.headers == parts[2:], data
    assert parser.get_http_version() == "1.1" and parser.should_keep_alive() and not parser.should_upgrade(), data
    # llhttp is left at the start of a message: the next request parses as if it were the first.
    parser.feed_data(b"GET /next HTTP/1.1\r\nHost: h\r\n\r\n")
    assert recorder.begun == recorder.complete == 2 and recorder.url.endswith(b"/next"), data
    return True


def mutated(rng: random.Random, data: bytes, times: int) -> bytes:
    """``data`` with ``times`` hostile edits at random places: an odd byte put in, bytes taken out, or doubled."""
    for _ in range(times):
        at = rng.randrange(len(data) + 1)
        roll = rng.random()
        if roll < 0.5:
            data = data[:at] + rng.choice(ODD) + data[at:]
        elif roll < 0.75:
            data = data[:at] + data[at + rng.randrange(1, 4):]
        else:
            data = data[:at] + data[at:at + rng.randrange(1, 8)] + data[at:]
    return data


def random_head(rng: random.Random) -> bytes:
    """A request head: mostly well-formed, often with a few odd bytes put in, taken out or doubled."""
    lines = [b" ".join((rng.choice(METHODS[:7]) if rng.random() < 0.8 else rng.choice(METHODS),
                        rng.choice(TARGETS[:7]) if rng.random() < 0.8 else rng.choice(TARGETS),
                        VERSIONS[0] if rng.random() < 0.85 else rng.choice(VERSIONS)))]
    for _ in range(rng.randrange(0, 7)):
        name = rng.choice(NAMES[:8]) if rng.random() < 0.7 else rng.choice(NAMES)
        lines.append(name + b":" + b" " * rng.choice((0, 1, 1, 1, 2)) + rng.choice(VALUES))
    data = b"\r\n".join(lines) + b"\r\n\r\n"
    data = mutated(rng, data, rng.choice((0, 0, 1, 1, 2, 3)))
    if rng.random() < 0.05:  # a body or a second request after the head
        data += rng.choice((b"hello", b"GET / HTTP/1.1\r\nHost: h\r\n\r\n", b"\r\n"))
    return data


PLAIN = [
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /index.html HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-User-Id: bench-user\r\nX-Session-Id: bench-session\r\n\r\n",
    b"DELETE /a/b?c=d&e=%20 HTTP/1.1\r\nHost:h\r\nAccept:  text/html, */*; q=0.8\r\nX_Under: a  b\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",  # no Host: the reader refuses it, as after llhttp
    b"OPTIONS /~u/@v:w;p=(1)*!$' HTTP/1.1\r\nHost: h\r\nConnectio: x\r\nContent-Lengths: 5\r\n\r\n",
]


@pytest.mark.parametrize("data", PLAIN)
def test_plain_heads_are_read_without_llhttp_and_as_llhttp_reads_them(data: bytes) -> None:
    assert assert_agrees(data)


DEFERRED = [
    b"GET / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\ncontent-LENGTH: 5\r\n\r\nhello",
    b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nProxy-Connection: keep-alive\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\n\r\n",
    b"GET / HTTP/1.0\r\nHost: h\r\n\r\n",
    b"CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET http://h/x HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n c\r\n\r\n",  # obs-fold
    b"GET / HTTP/1.1\r\nHost: h\r\nX-A: b \r\n\r\n",  # trailing space
    b"GET / HTTP/1.1\r\nHost: h\r\nX-A:\tb\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\nX-A:\r\n\r\n",  # empty value
    b"GET / HTTP/1.1\r\nHost: h\nX-A: b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\rX-A: b\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost : h\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\xc3\xa4\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",  # pipelined
    b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
    b"GET /a#b HTTP/1.1\r\nHost: h\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
]


@pytest.mark.parametrize("data", DEFERRED)
def test_heads_llhttp_decides_are_left_to_it(data: bytes) -> None:
    assert plain_request(data) is None


def test_generated_heads_are_deferred_or_read_as_llhttp_reads_them() -> None:
    rng = random.Random(33)
    taken = 0
    for _ in range(30_000):
        taken += assert_agrees(random_head(rng))
    assert taken > 3_000  # the generator reaches the plain path, not only the deferrals


def test_every_single_byte_in_each_place_agrees() -> None:
    """Each byte value put in the target, a header name and a header value (and in place of each separator)."""
    template = b"GET /a%sb HTTP/1.1\r\nHost: h\r\nX-N%sm: v%sw\r\n\r\n"
    for c in range(256):
        byte = bytes((c,))
        for where in range(3):
            fill = [b"", b"", b""]
            fill[where] = byte
            assert_agrees(template % tuple(fill))
        base = b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"
        for at in range(len(base)):
            assert_agrees(base[:at] + byte + base[at + 1:])


# -- responses: plain_response against llhttp and the general path's plain_head ---------------------------------

class ResponseRecorder:
    """httptools' response callbacks, recorded; keep-alive as UpstreamConnection reads it, at the message's end."""

    def __init__(self) -> None:
        self.body = b""
        self.complete = 0
        self.keep: list[bool] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete += 1
        self.keep.append(self.parser.should_keep_alive())


RESPONSE_NAMES = [b"Server", b"Date", b"Content-Type", b"Content-Length", b"content-length", b"Connection",
                  b"ETag", b"Transfer-Encoding", b"X-Request-Id", b"Keep-Alive", b"Upgrade", b"TE", b"Set-Cookie",
                  b"Proxy-Connection", b"Trailer", b"X_Under", b"Cache-Control"]
RESPONSE_VALUES = [b"nginx/1.22.1", b"Fri, 27 Nov 2026 15:00:00 GMT", b"text/html", b"text/event-stream", b"13",
                   b"0", b"5", b"013", b"keep-alive", b"Keep-Alive", b"close", b"upgrade", b"chunked", b"a=b; Path=/",
                   b"1 3", b"+13", b"no-cache, private"]
STATUS_LINES = [b"HTTP/1.1 200 OK", b"HTTP/1.1 201 Created", b"HTTP/1.1 204 No Content", b"HTTP/1.1 205 Reset",
                b"HTTP/1.1 299 X", b"HTTP/1.1 200 ", b"HTTP/1.1 200", b"HTTP/1.1 304 Not Modified",
                b"HTTP/1.1 101 Switching", b"HTTP/1.1 100 Continue", b"HTTP/1.0 200 OK", b"HTTP/1.1 2x0 OK",
                b"HTTP/1.1 404 Not Found", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK"]


def assert_response_agrees(data: bytes) -> bool:
    """``plain_response`` defers, or llhttp reads ``data`` as one whole keep-alive response with that status and
    body, and the bytes sent are plain_head's rewrite and the body (what the llhttp path sends); True when taken."""
    plain = plain_response(data, b"rid-1")
    if plain is None:
        return False
    out, status, body = plain
    recorder = ResponseRecorder()
    parser = recorder.parser
    try:
        parser.feed_data(data)
    except (httptools.HttpParserError, httptools.HttpParserUpgrade):
        raise AssertionError(f"llhttp refuses what the plain path takes: {data!r}") from None
    assert recorder.complete == 1 and recorder.keep == [True] and parser.get_status_code() == status, data
    assert 200 <= status < 300 and status not in (204, 205) and body == len(recorder.body), data
    head = plain_head(data, 0, b"rid-1")
    assert head is not None and out == head[0] + data[head[1]:] and data[head[1]:] == recorder.body, data
    parser.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")  # left at the start of a message
    assert recorder.complete == 2, data
    return True


def random_response(rng: random.Random) -> bytes:
    body = rng.choice((b"hello, world\n", b"", b"x" * 40, b"\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"))
    lines = [STATUS_LINES[0] if rng.random() < 0.6 else rng.choice(STATUS_LINES)]
    names = rng.sample(RESPONSE_NAMES[:7], rng.randrange(0, 6)) + rng.sample(RESPONSE_NAMES, rng.randrange(0, 2))
    for name in names:
        value = (str(len(body)).encode() if name.lower() == b"content-length" and rng.random() < 0.8
                 else rng.choice(RESPONSE_VALUES))
        lines.append(name + b":" + b" " * rng.choice((0, 1, 1, 2)) + value)
    if rng.random() < 0.7:
        lines.insert(rng.randrange(1, len(lines) + 1), b"Content-Length: %d" % len(body))
    data = b"\r\n".join(lines) + b"\r\n\r\n" + body
    data = mutated(rng, data, rng.choice((0, 0, 1, 1, 2)))
    return data


NGINX = (b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Fri, 27 Nov 2026 15:00:00 GMT\r\nContent-Type: text/html\r\n"
         b"Content-Length: 13\r\nConnection: keep-alive\r\nETag: \"6925f0b0-d\"\r\n\r\nhello, world\n")


@pytest.mark.parametrize("data", [
    NGINX, NGINX.replace(b"Connection: keep-alive\r\n", b""), b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nCONNECTION: Keep-Alive\r\ncontent-length:  013\r\n\r\n" + b"y" * 13,
])
def test_plain_responses_are_sent_as_the_llhttp_path_sends_them(data: bytes) -> None:
    assert assert_response_agrees(data)


@pytest.mark.parametrize("data", [
    NGINX.replace(b"keep-alive", b"close"), NGINX + b"x", NGINX[:-1], NGINX.replace(b"200 OK", b"204 No Content"),
    NGINX.replace(b"Content-Length: 13", b"Content-Length: 13\r\nContent-Length: 13"),
    NGINX.replace(b"Content-Length: 13", b"Transfer-Encoding: chunked"),
    NGINX.replace(b"Content-Length: 13", b"Content-Length: 13\r\nTransfer-Encoding: chunked"),
    NGINX.replace(b"text/html", b"text/event-stream"), NGINX.replace(b"ETag", b"X-Request-Id"),
    NGINX.replace(b"HTTP/1.1", b"HTTP/1.0"), NGINX.replace(b"nginx/1.22.1", b"nginx\t1"),
    NGINX.replace(b"Server: nginx/1.22.1", b"Server: nginx\r\n /1.22.1"), NGINX.replace(b"\r\nDate", b"\nDate"),
    NGINX.replace(b"Content-Length: 13", b"Content-Length: 1 3"),
    NGINX.replace(b"Content-Length: 13", b"Content-Length: x\r\nContent-Length: 13"),
    NGINX.replace(b"Connection: keep-alive", b"Connection: keep-alive\r\nConnection: keep-alive"),
])
def test_responses_llhttp_or_the_general_rewrite_decide_are_left_to_them(data: bytes) -> None:
    assert plain_response(data, b"rid-1") is None


def test_generated_responses_are_deferred_or_sent_as_the_llhttp_path_sends_them() -> None:
    rng = random.Random(3333)
    taken = sum(assert_response_agrees(random_response(rng)) for _ in range(20_000))
    assert taken > 1_000


def test_common_names_are_the_tables_own_objects():
    """A name of on_header's table comes back as the table's own key (no new bytes, its hash kept); another name,
    or one in another case, as new bytes equal to what was sent."""
    parts = plain_request(b"GET / HTTP/1.1\r\nHost: h\r\nX-User-Id: u\r\nx-session-id: s\r\nUser-Agent: a\r\n"
                          b"X-Custom: c\r\nHOST: H\r\nX-USER-ID: U\r\n\r\n")
    assert parts is not None
    names = parts[2::2]
    assert names == [b"Host", b"X-User-Id", b"x-session-id", b"User-Agent", b"X-Custom", b"HOST", b"X-USER-ID"]
    keys = {id(name) for name in REQUEST_HEADERS_EXACT}
    assert [id(name) in keys for name in names] == [True, True, True, True, False, False, False]
