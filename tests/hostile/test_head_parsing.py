"""Hostile data-plane heads: CR/LF/NUL where they do not belong, sizes, odd request lines, slowloris."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from tests.hostile.harness import (
    HEAD_TIMEOUT, IO_TIMEOUT, MALFORMED, TOO_LARGE, URI_TOO_LONG, W, answer, bad_identity, bot_value, Build, check_rejected,
    Err, get, Hostile, ident, org_value, raw_client, session_value, user_value,
)

pytestmark = pytest.mark.asyncio(loop_scope="package")

BAD_TARGET = Err(400, "bad_request", "the request target must be a path (/...) or an absolute http(s) URL")

DATA_CASES: list[Any] = [
    # -- CR / LF / CRLF in header names, values, request lines ------------------------------------
    pytest.param(get(b"/", b"X-Note: a\rb\r\n"), MALFORMED, id="cr-in-header-value"),
    pytest.param(get(b"/", b"X-Note: a\nb\r\n"), MALFORMED, id="lf-in-header-value"),
    pytest.param(get(b"/", b"X-Note: a\r\n b\r\n"), MALFORMED, id="obs-fold-continuation-line"),
    pytest.param(get(b"/", b"X-No\rte: b\r\n"), MALFORMED, id="cr-in-header-name"),
    pytest.param(get(b"/", b"X-No\nte: b\r\n"), MALFORMED, id="lf-in-header-name"),
    pytest.param(get(b"/", b"X-No\r\nte: b\r\n"), MALFORMED, id="crlf-in-header-name"),
    pytest.param(user_value(b"mal\rlory"), MALFORMED, id="cr-in-user-id"),
    pytest.param(org_value(b"rej\norg"), MALFORMED, id="lf-in-org-id"),
    pytest.param(session_value(b"rej\r\nX-User-Id: victim"), bad_identity("X-User-Id", "must be given once"),
                 id="crlf-injected-second-user"),
    pytest.param(org_value(b"rej-org\r\nX-Org-Id: victim-org"), bad_identity("X-Org-Id", "must be given once"),
                 id="crlf-injected-second-org"),
    pytest.param(lambda s: b"GET /a\r\nX-User-Id: victim HTTP/1.1\r\n" + ident(s) + b"\r\n",
                 bad_identity("X-User-Id", "must be given once"), id="crlf-injected-header-via-url"),
    pytest.param(get(b"/a\rb"), MALFORMED, id="cr-in-url"),
    pytest.param(get(b"/a\nb"), MALFORMED, id="lf-in-url"),
    pytest.param(lambda s: (b"GET / HTTP/1.1\r\n" + ident(s) + b"\r\n").replace(b"\r\n", b"\n"), MALFORMED,
                 id="bare-lf-line-endings"),
    pytest.param(lambda s: (b"GET / HTTP/1.1\r\n" + ident(s) + b"\r\n").replace(b"\r\n", b"\r"), MALFORMED,
                 id="bare-cr-line-endings"),
    pytest.param(lambda s: b"GE\r\nT / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="crlf-in-method"),
    pytest.param(lambda s: b"GET / HTTP/1.1\r\n X-User-Id: victim\r\n" + ident(s) + b"\r\n", MALFORMED,
                 id="whitespace-before-first-header"),
    pytest.param(get(b"/", b"Not A Header Line\r\n"), MALFORMED, id="header-line-without-colon"),
    pytest.param(get(b"/", b": no-name\r\n"), MALFORMED, id="empty-header-name"),
    pytest.param(get(b"/", b"X-\xc3\x84: 1\r\n"), MALFORMED, id="non-ascii-header-name"),
    pytest.param(get(b"/", b"X Note: 1\r\n"), MALFORMED, id="space-in-header-name"),
    pytest.param(lambda s: b"GET / HTTP/1.1\r\nX-User-Id : victim\r\n" + ident(s) + b"\r\n", MALFORMED,
                 id="space-before-colon-identity-header"),
    # -- NUL bytes --------------------------------------------------------------------------------
    pytest.param(get(b"/", b"X-Note: a\x00b\r\n"), MALFORMED, id="nul-in-header-value"),
    pytest.param(get(b"/", b"X-No\x00te: b\r\n"), MALFORMED, id="nul-in-header-name"),
    pytest.param(get(b"/a\x00b"), MALFORMED, id="nul-in-url"),
    pytest.param(org_value(b"rej\x00org"), MALFORMED, id="nul-in-org-id"),
    pytest.param(user_value(b"mallory\x00"), MALFORMED, id="nul-in-user-id"),
    pytest.param(session_value(b"\x00rej"), MALFORMED, id="nul-in-session-id"),
    pytest.param(lambda s: b"G\x00ET / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="nul-in-method"),
    pytest.param(lambda s: b"\x00" * 100, MALFORMED, id="nul-bytes-only"),
    pytest.param(lambda s: b"\x00GET / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="nul-before-request"),
    # -- sizes --------------------------------------------------------------------------------------
    pytest.param(get(b"/", b"X-Big: " + b"a" * 65_536 + b"\r\n"), TOO_LARGE, id="64kb-single-header"),
    pytest.param(get(b"/" + b"a" * 65_536), URI_TOO_LONG, id="64kb-url"),
    pytest.param(get(b"/", b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 200) for i in range(100))), TOO_LARGE,
                 id="100-headers-totalling-20kb"),
    pytest.param(get(b"/", b"a: b\r\n" * 3000), TOO_LARGE, id="3000-tiny-headers"),
    pytest.param(org_value(b"o" * 65_536), TOO_LARGE, id="64kb-org-id"),
    pytest.param(org_value(b"o" * 10_000), bad_identity("X-Org-Id", "must be at most 256 characters (got 10000)"),
                 id="10k-char-org-id"),
    pytest.param(user_value(b"u" * 257), bad_identity("X-User-Id", "must be at most 256 characters (got 257)"),
                 id="257-char-user-id"),
    pytest.param(session_value(b"s" * 257), bad_identity("X-Session-Id", "must be at most 256"),
                 id="257-char-session-id"),
    pytest.param(org_value("\u00e9".encode() * 257),
                 bad_identity("X-Org-Id", "must be at most 256 characters (got 257)"),
                 id="257-two-byte-chars-org-id"),
    pytest.param(bot_value(b"b" * 300), bad_identity("X-Bot-Id", "must be at most 256"), id="300-char-bot-id"),
    pytest.param(lambda s: b"A" * 10_000 + b" / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="10k-method"),
    # -- request lines: HTTP/0.9, garbage, absurd methods and versions ---------------------------
    pytest.param(lambda s: b"GET /\r\n\r\n", bad_identity("X-User-Id", "is required"), id="http-0.9-request"),
    pytest.param(lambda s: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(32)), MALFORMED,
                 id="tls-client-hello"),
    # The HTTP/2 preface is answered in HTTP/2 (GOAWAY naming the gRPC port): tests/test_grpc_h2_refusal.py
    pytest.param(lambda s: b"HELLO\r\n\r\n", MALFORMED, id="garbage-request-line"),
    pytest.param(lambda s: b"SSH-2.0-OpenSSH_9.6\r\n", MALFORMED, id="ssh-banner"),
    pytest.param(lambda s: b"FOOBAR / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="absurd-method"),
    pytest.param(lambda s: b"get / HTTP/1.1\r\n" + ident(s) + b"\r\n", MALFORMED, id="lowercase-method"),
    pytest.param(get(b"/", version=b"HTTP/1.2"), MALFORMED, id="http-1.2"),
    pytest.param(get(b"/", version=b"HTTP/9.9"), MALFORMED, id="http-9.9"),
    pytest.param(get(b"/", version=b"http/1.1"), MALFORMED, id="lowercase-version"),
    pytest.param(get(b"/", version=b""), MALFORMED, id="empty-version"),
    pytest.param(get(b"echo/x"), MALFORMED, id="target-without-slash"),
    pytest.param(get(b"ftp://evil.example/echo/x"), BAD_TARGET, id="absolute-form-not-http"),
    pytest.param(get(b"http://user:secret@evil.example/echo/x"), BAD_TARGET, id="absolute-form-with-userinfo"),
    pytest.param(get(b"http:///echo/x"), BAD_TARGET, id="absolute-form-without-a-host"),
    pytest.param(get(b"?a=b"), MALFORMED, id="query-only-target"),
    pytest.param(get(b"/a\tb"), MALFORMED, id="tab-in-url"),
    pytest.param(get("/caf\u00e9".encode()), MALFORMED, id="raw-utf8-in-url"),
    pytest.param(get(b"/\xff\xfe"), MALFORMED, id="raw-high-bytes-in-url"),
    pytest.param(lambda s: b"CONNECT 127.0.0.1:22 HTTP/1.1\r\n" + ident(s) + b"\r\n",
                 Err(400, "method_not_supported", "CONNECT is not supported"), id="connect-to-caller-chosen-port"),
]


@pytest.mark.parametrize(("build", "expected"), DATA_CASES)
async def test_data_plane_rejects_hostile_input(gw: Hostile, request: pytest.FixtureRequest, build: Build,
                                                expected: Err) -> None:
    await check_rejected(gw, request, build, expected)


# -- slowloris --------------------------------------------------------------------------------------
async def read_until_closed(reader: asyncio.StreamReader, timeout: float) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    except ConnectionResetError:
        return b""


async def trickle(writer: asyncio.StreamWriter, data: bytes, interval: float, sent: list[int]) -> None:
    """Pacing, not synchronisation: one byte per ``interval`` until done or cut off."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            sent[0] += 1
            await asyncio.sleep(interval)


SLOW_HEAD = b"GET /echo/slow HTTP/1.1\r\n" + W + b"X-Padding: " + b"p" * 40 + b"\r\n\r\n"


@pytest.mark.parametrize(("prefix", "slow"), [
    pytest.param(b"", b"", id="silent-connection"),
    pytest.param(b"GET /ec", b"", id="half-a-request-line"),
    pytest.param(SLOW_HEAD[:-20], b"", id="head-without-its-end"),
    pytest.param(b"", b"\r\n" * 200, id="endless-empty-lines"),
    pytest.param(b"", SLOW_HEAD, id="head-a-byte-at-a-time"),
    pytest.param(b"GET /echo/x HTTP/1.1\r\n" + W, b"".join(b"X-H%d: v\r\n" % i for i in range(200)),
                 id="endless-header-lines"),
])
async def test_slowloris_is_cut_off(gw: Hostile, prefix: bytes, slow: bytes) -> None:
    async with raw_client(gw.data_port) as (reader, writer):
        started = time.monotonic()
        writer.write(prefix)
        sent = [0]
        pacer = asyncio.create_task(trickle(writer, slow, 0.02, sent))
        try:
            data = await read_until_closed(reader, HEAD_TIMEOUT + 4)
        finally:
            pacer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer
        elapsed = time.monotonic() - started
    assert data == b"", f"expected a silent close, got {data[:200]!r}"
    assert elapsed < HEAD_TIMEOUT + 2, f"closed after {elapsed:.2f}s (header_read_timeout {HEAD_TIMEOUT}s)"
    if slow:
        assert sent[0] < len(slow), "the whole head got through before the deadline: the pacing is too fast"


async def test_slowloris_after_a_served_request_on_a_kept_alive_connection(gw: Hostile) -> None:
    async with raw_client(gw.data_port) as (reader, writer):
        writer.write(b"GET /echo/first HTTP/1.1\r\n" + W + b"\r\n")
        first = await asyncio.wait_for(answer(reader), IO_TIMEOUT)
        assert first is not None and first.status == 200
        started = time.monotonic()
        sent = [0]
        pacer = asyncio.create_task(trickle(writer, SLOW_HEAD, 0.02, sent))
        try:
            data = await read_until_closed(reader, HEAD_TIMEOUT + 4)
        finally:
            pacer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer
    assert data == b"" and time.monotonic() - started < HEAD_TIMEOUT + 2
    assert sent[0] < len(SLOW_HEAD)
