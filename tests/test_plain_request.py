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

from gateway.proxy._wire import plain_request

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


def random_head(rng: random.Random) -> bytes:
    """A request head: mostly well-formed, often with a few odd bytes put in, taken out or doubled."""
    lines = [b" ".join((rng.choice(METHODS[:7]) if rng.random() < 0.8 else rng.choice(METHODS),
                        rng.choice(TARGETS[:7]) if rng.random() < 0.8 else rng.choice(TARGETS),
                        VERSIONS[0] if rng.random() < 0.85 else rng.choice(VERSIONS)))]
    for _ in range(rng.randrange(0, 7)):
        name = rng.choice(NAMES[:8]) if rng.random() < 0.7 else rng.choice(NAMES)
        lines.append(name + b":" + b" " * rng.choice((0, 1, 1, 1, 2)) + rng.choice(VALUES))
    data = b"\r\n".join(lines) + b"\r\n\r\n"
    for _ in range(rng.choice((0, 0, 1, 1, 2, 3))):
        at = rng.randrange(len(data) + 1)
        roll = rng.random()
        if roll < 0.5:
            data = data[:at] + rng.choice(ODD) + data[at:]
        elif roll < 0.75:
            data = data[:at] + data[at + rng.randrange(1, 4):]
        else:
            data = data[:at] + data[at:at + rng.randrange(1, 8)] + data[at:]
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
