"""The upstream side: one protocol per connection to a sandbox, and a keep-alive pool per endpoint.

An :class:`UpstreamConnection` lets httptools (llhttp) validate each response
and find where it ends, while the bytes go to the client as they arrive: the
head is rewritten once from its raw bytes (hop-by-hop headers stripped; no
Python call per header), and body bytes are written through untouched with the
upstream's own framing (Content-Length or chunked), so llhttp needs no Python
callback for them. Only unusual framings are re-framed: a body delimited by the
upstream closing is re-chunked (or the client's connection closed too), a
chunked body for an HTTP/1.0 client is decoded. What one read produced leaves in
one write. A 101 turns the connection into half of a raw byte splice.
"""

from __future__ import annotations

import asyncio
import logging
import os
from time import perf_counter
from typing import TYPE_CHECKING

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

from gateway._compiled import COMPILED
from gateway.errors import UpstreamError
from gateway.proxy._browser import (
    PATH_MODE_HEADERS, host_only_cookies, private_to_caches, rewrite_under_prefix, without_clear_site_data,
)
from gateway.proxy._exchange import BODY, NO_BODY, F_DECHUNK, F_NONE, F_PASS, F_RAW, F_RECHUNK, TUNNEL, WAITING, Exchange
from gateway.proxy._framing import Dechunker, body_framing
from gateway.proxy._wire import (
    CHUNK_END, CODING_CHUNKED, CODING_NONE, CONN_CLOSE, CONN_KEEP_ALIVE, CRLF, HOP_BY_HOP, IDEMPOTENT_METHODS,
    host_line, is_event_stream, plain_head, plain_response, strip_hop_by_hop, without_transfer_encoding,
)
from gateway.proxy._wsframe import MessageSizeGuard

if TYPE_CHECKING:
    from gateway.proxy._downstream import DownstreamConnection
    from gateway.proxy._plane import DataPlane

log = logging.getLogger("gateway.proxy")

MAX_RESPONSE_HEAD = 256 * 1024
_ANY_SIZE = 1 << 64  # the sandbox's messages are not limited; its frames are only followed
_find_hop_by_hop = HOP_BY_HOP.search


_UNREAD_LIMIT = 65536  # what is read of a reset tunnel's last bytes: a close frame is at most 127


def unread(transport: asyncio.BaseTransport) -> bytes:
    """Bytes the peer sent before it reset the connection, still in the kernel's receive buffer.

    A write that fails with ECONNRESET ends the transport at once, before the loop reads what
    arrived ahead of the reset: a sandbox that refuses a large WebSocket message sends its close
    frame (1009) and drops the connection while the client's bytes are still going in, and that
    close frame is what the client must see. The descriptor is still open in connection_lost
    (asyncio and uvloop close it after) and non-blocking."""
    sock = transport.get_extra_info("socket")
    chunks: list[bytes] = []
    try:
        fd = sock.fileno()
        size = 0
        while size < _UNREAD_LIMIT:
            chunk = os.read(fd, _UNREAD_LIMIT - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except (OSError, AttributeError, ValueError):
        pass  # nothing more (EAGAIN, ECONNRESET), or no descriptor any more
    return b"".join(chunks)


class UpstreamPool:
    """Idle keep-alive connections to one endpoint, most recently used last."""

    __slots__ = ("plane", "host", "port", "host_line", "idle", "size")

    def __init__(self, plane: DataPlane, host: str, port: int, size: int) -> None:
        self.plane = plane
        self.host = host
        self.port = port
        self.host_line = host_line(host, port)
        self.idle: list[UpstreamConnection] = []
        self.size = size

    def take(self) -> UpstreamConnection | None:
        """The most recently used idle connection that is still open, or None."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                conn.reused = True
                return conn
        return None

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` (its exchange complete) for the next request, or close it when the pool is full."""
        if len(self.idle) >= self.size or self.plane.closed:
            conn.close()
            return
        conn.idle_since = self.plane.now
        self.idle.append(conn)

    def forget(self, conn: UpstreamConnection) -> None:
        try:
            self.idle.remove(conn)
        except ValueError:
            pass

    def expire(self, before: float) -> None:
        idle = self.idle
        while idle and idle[0].idle_since < before:
            idle.pop(0).close()

    def close_all(self) -> None:
        while self.idle:
            self.idle.pop().close()


class UpstreamConnection:
    """One connection to a sandbox; ``ex`` is the exchange it serves, None while pooled. The transport
    calls it as an ``asyncio.Protocol`` (not a subclass, so that the compiled build can make it an
    extension type)."""

    __slots__ = (
        "plane", "pool", "transport", "parser", "ex", "client_tr", "reused", "closed", "broken",
        "idle_since", "rpaused", "wpaused", "done", "keep", "interim", "extra", "tunneled", "raw",
        "raw_pos", "head_out", "framing", "dechunker", "frames", "sse_end",
    )

    def __init__(self, plane: DataPlane, pool: UpstreamPool) -> None:
        self.plane = plane
        self.pool = pool
        self.transport: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.parser = HttpResponseParser(self)
        self.ex: Exchange | None = None
        self.client_tr: asyncio.Transport | None = None
        self.reused = False
        self.closed = False
        self.broken = False
        self.idle_since = 0.0
        self.rpaused = False     # reading paused because the client is slow
        self.wpaused = False     # our write buffer is full: the client's reading is paused
        self.done = False        # the current response is complete
        self.keep = False        # ... and the upstream allows reusing the connection
        self.interim = False     # a 1xx response is being parsed
        self.extra = False       # bytes after the end of the response: the upstream is confused
        self.tunneled = False
        self.raw: bytes | None = None   # response bytes until the final head is complete
        self.raw_pos = 0                # where the next head starts in raw; then where the body starts
        self.head_out = b""             # the rewritten head, sent with the first body bytes
        self.framing = F_NONE
        self.dechunker: Dechunker | None = None
        self.frames: MessageSizeGuard | None = None  # a tunnel's frame boundaries (sandbox to client)
        self.sse_end: bytes | None = None  # what ends an event stream cleanly for the client (None: nothing can)

    # -- pausing ------------------------------------------------------------
    def sync_pauses(self, client: DownstreamConnection) -> None:
        """On attach: a slow client pauses our reading; our full buffer pauses the client's."""
        if client.wpaused:
            self.pause_for_client()
        if self.wpaused:
            client.pause(1)

    def pause_for_client(self) -> None:
        if not self.rpaused and not self.closed:
            self.rpaused = True
            self.transport.pause_reading()

    def resume_for_client(self) -> None:
        if self.rpaused:
            self.rpaused = False
            if not self.closed:
                self.transport.resume_reading()

    def _detach(self, ex: Exchange) -> None:
        self.ex = None
        self.client_tr = None
        ex.upstream = None
        if self.wpaused:
            ex.client.resume(1)
        if self.rpaused:
            self.resume_for_client()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection now: it saw an error or an unfinished exchange."""
        self.closed = self.broken = True
        ex = self.ex
        if ex is not None:
            self._detach(ex)
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio.Protocol ---------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.set_write_buffer_limits(high=self.plane.write_high)  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.wpaused = True
        if self.ex is not None:
            self.ex.client.pause(1)

    def resume_writing(self) -> None:
        self.wpaused = False
        if self.ex is not None:
            self.ex.client.resume(1)

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None or self.tunneled:
            self._data_special(data)
            return
        ex.active_at = self.plane.now
        if ex.started:
            # Body bytes: llhttp checks the framing and finds the end; the bytes go on as they came.
            try:
                self.parser.feed_data(data)
            except HttpParserError as exc:
                self._protocol_error(ex, str(exc))
                return
            self._body(ex, data, b"")
            if self.plane.draining and ex.protocol == "sse" and self.ex is ex:
                self._end_stream_at_event(ex, data)
            return
        raw = self._head_so_far(ex, data)
        if raw is None:
            return
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade as exc:
            self._upgraded(ex, data[exc.args[0]:])
            return
        except HttpParserError as exc:
            self._protocol_error(ex, str(exc))
            return
        if ex.state == BODY:  # the head is complete; what follows it is body
            self.raw = None
            body_at = self.raw_pos
            if self.framing != F_PASS or self.extra:
                self._body(ex, raw[body_at:] if body_at < len(raw) else b"", self.head_out)
                return
            ex.started = True
            try:
                if body_at < len(raw):
                    body = raw[body_at:]
                    ex.bytes_out += len(body)
                    self.client_tr.write(self.head_out + body)  # type: ignore[union-attr]
                else:
                    self.client_tr.write(self.head_out)  # type: ignore[union-attr]
            except RuntimeError:  # uvloop: the client's transport closed under us
                self.abort()
                return
            if self.done:
                self._complete(ex)

    def _body(self, ex: Exchange, data: bytes, head: bytes) -> None:
        """Send ``head`` (if any) and the body bytes ``data`` the way the client takes them."""
        if self.extra:
            self._protocol_error(ex, "bytes after the end of the response")
            return
        framing = self.framing
        if data:
            ex.bytes_out += len(data)
            if framing == F_RECHUNK:
                data = b"%x\r\n%s\r\n" % (len(data), data)
            elif framing == F_DECHUNK:
                data = self.dechunker.decode(data)  # type: ignore[union-attr]
            elif framing == F_NONE:
                self.broken = True  # a body where none may be: never reuse this connection
                data = b""
        try:
            if head:
                ex.started = True
                self.client_tr.write(head + data if data else head)  # type: ignore[union-attr]
            elif data:
                self.client_tr.write(data)  # type: ignore[union-attr]
        except RuntimeError:  # uvloop: the client's transport closed under us
            self.abort()
            return
        if self.done:
            self._complete(ex)

    def _data_special(self, data: bytes) -> None:
        ex = self.ex
        if ex is not None:  # tunneled
            ex.bytes_out += len(data)
            ex.active_at = self.plane.now
            try:
                self.client_tr.write(data)  # type: ignore[union-attr]
            except RuntimeError:  # uvloop: the client's transport closed under us
                self.abort()
                return
            frames = self.frames
            if frames is not None:
                frames.feed(data)
                if self.plane.draining and frames.at_boundary:
                    ex.client.going_away(ex)  # shutdown began mid-frame: this frame is complete now
            return
        # Bytes on an idle connection: the upstream is confused; never reuse it.
        self.broken = True
        self.pool.forget(self)
        self.close()

    def eof_received(self) -> bool | None:
        self.closed = True  # never handed out again; connection_lost settles the exchange
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.ex
        if ex is None:
            self.pool.forget(self)
            self.parser = None  # it holds our bound callbacks: a cycle (see DownstreamConnection.connection_lost)
            return
        if exc is not None and self.tunneled:
            last = unread(self.transport)  # the sandbox's close frame, ahead of its reset
            if last:
                self._data_special(last)
        self._detach(ex)
        self.wpaused = False
        client = ex.client
        if self.tunneled:
            client.finish(ex, True)
        elif ex.state == BODY:
            if not self.done and (self.framing == F_RECHUNK or self.framing == F_RAW):
                # The body was delimited by the upstream closing: that is its end.
                if self.framing == F_RECHUNK and not client.transport.is_closing():
                    client.transport.write(CHUNK_END)
                client.finish(ex, ex.close_after or not ex.req_done)
            else:
                client.abort(ex, "upstream_closed", "the sandbox closed the connection mid-response")
        elif ex.state == WAITING:
            if (self.raw is None and self.reused and not ex.retried and ex.body == NO_BODY
                    and ex.method in IDEMPOTENT_METHODS):
                client.retry(ex)  # a stale keep-alive connection; the request is safe to repeat
            else:
                sandbox_id = ex.route.sandbox_id if ex.route else None
                client.fail(ex, UpstreamError(f"sandbox {sandbox_id} closed the connection before responding",
                                              sandbox_id=sandbox_id))
        self.parser = None

    def _head_so_far(self, ex: Exchange, data: bytes) -> bytes | None:
        """The response's bytes so far, for llhttp; None when done: sent whole (read_plain) or too large."""
        raw = self.raw
        if raw is None:
            if COMPILED and ex.keyed is None and self.read_plain(ex, data):
                return None
            self.raw = data
            return data
        raw = self.raw = raw + data
        if len(raw) > MAX_RESPONSE_HEAD:
            self._protocol_error(ex, f"response head larger than {MAX_RESPONSE_HEAD} bytes")
            return None
        return raw

    def read_plain(self, ex: Exchange, data: bytes) -> bool:
        """A first read that is one whole plain response (``_wire.plain_response``), done as llhttp's path does
        it, without llhttp (left at the start of a message); False, with nothing done, for anything else."""
        if not (ex.keep_alive and ex.req_done and not ex.version10 and ex.method != b"HEAD" and not self.plane.draining):
            return False  # _passes_through's conditions on the exchange; plain_response checks the response's
        plain = plain_response(data, ex.request_id)
        if plain is None:
            return False
        out, ex.status, body = plain
        ex.upstream_time = perf_counter() - ex.sent_at
        self.framing, ex.state, ex.started, self.keep = F_PASS, BODY, True, True
        ex.bytes_out += body
        try:
            self.client_tr.write(out)  # type: ignore[union-attr]
        except RuntimeError:  # uvloop: the client's transport closed under us
            self.abort()
            return True
        self._complete(ex)
        return True

    # -- httptools callbacks ------------------------------------------------
    # No on_header and no on_body: the head is rewritten from the raw bytes in one
    # go, and body bytes are forwarded as they came, so llhttp works in C alone.
    def on_message_begin(self) -> None:
        if self.done:
            self.extra = self.broken = True

    def on_headers_complete(self) -> None:
        ex = self.ex
        raw = self.raw
        assert ex is not None and raw is not None
        pos = self.raw_pos
        if COMPILED and ex.keyed is None:  # the common head, rewritten in one C scan (_wire.plain_head)
            status = self.parser.get_status_code()
            plain = plain_head(raw, pos, ex.request_id) if status >= 200 and self._passes_through(ex, status) else None
            if plain is not None:
                self.head_out, self.raw_pos = plain
                self.framing, ex.state, ex.status = F_PASS, BODY, status
                ex.upstream_time = perf_counter() - ex.sent_at
                return
        while raw.startswith(b"\r\n", pos):
            pos += 2
        end = raw.find(b"\r\n\r\n", pos)
        self.raw_pos = end + 4
        status = self.parser.get_status_code()
        if status < 200 and self._not_final(ex, status):
            return
        ex.status = status
        ex.upstream_time = perf_counter() - ex.sent_at
        head = raw[pos:end]
        low = head.lower()
        match = _find_hop_by_hop(low)
        coding = CODING_NONE
        if match is not None:
            head, coding = strip_hop_by_hop(head, low, match)
        if not head.startswith(b"HTTP/1.1 "):
            head = b"HTTP/1.1" + head[8:]
        if ex.keyed is not None:
            head = self._keyed_head(ex, head, low)
        if b"\r\nx-request-id:" not in low:  # the client can quote it; a sandbox's own one is kept
            head += b"\r\nX-Request-Id: " + ex.request_id  # type: ignore[operator]
        if self._passes_through(ex, status):
            # The common case: a keep-alive response with its own framing (Content-Length or
            # chunked; llhttp would not call it keep-alive otherwise), passed through as it is.
            self.framing = F_PASS
            self.head_out = head + b"\r\n\r\n"
            if b"event-stream" in low and is_event_stream(low):
                ex.protocol = "sse"
                self.sse_end = CHUNK_END if b"\r\ntransfer-encoding:" in low else None
                self.plane.stream_began(ex)
        else:
            self._frame(ex, status, head, low, coding)
        ex.state = BODY

    def _not_final(self, ex: Exchange, status: int) -> bool:
        """A 1xx head: True when it is not the response the client gets (an interim 100/102/103, or a
        101 to a request that asked for no upgrade, which the upgrade handling answers with a 502)."""
        if status != 101:
            self.interim = True
            return True
        if not ex.websocket:
            self.broken = True
            return True
        return False

    def _passes_through(self, ex: Exchange, status: int) -> bool:
        """Whether the response goes to the client with its own framing on a connection both sides keep."""
        return (status < 300 and status != 204 and ex.keep_alive and ex.req_done and not ex.version10
                and self.parser.should_keep_alive() and ex.method != b"HEAD" and not self.plane.draining)

    def _keyed_head(self, ex: Exchange, head: bytes, low: bytes) -> bytes:
        """A keyed request's response head (gateway/proxy/_browser.py): private to caches, no
        Clear-Site-Data; in path mode Location and Set-Cookie put under the prefix (and the shared
        origin's headers), in host mode cookies host-only."""
        keyed = ex.keyed
        head = private_to_caches(head, low)
        if b"\r\nclear-site-data:" in low:
            head = without_clear_site_data(head)
        if keyed.prefix is not None:
            if b"\r\nlocation:" in low or b"\r\nset-cookie:" in low:
                head = rewrite_under_prefix(head, keyed.prefix, self._authorities(ex))
            if keyed.shared_origin:
                head += PATH_MODE_HEADERS  # no page, no script, no referrer on the origin all sandboxes share
        elif b"\r\nset-cookie:" in low:
            head = host_only_cookies(head)
        return head

    def _authorities(self, ex: Exchange) -> tuple[bytes, ...]:
        """The hosts an absolute Location may name and still mean this sandbox in path mode: the one
        the sandbox was sent (Host) and the one the client used (X-Forwarded-Host)."""
        sent = self.pool.host_line[len(b"Host: "):-2].lower()
        return (sent, ex.host.lower()) if ex.host is not None else (sent,)

    def _frame(self, ex: Exchange, status: int, head: bytes, low: bytes, coding: int) -> None:
        """Choose how the body reaches the client, and the head's Connection line, in general."""
        close = not ex.keep_alive or not ex.req_done or self.plane.draining
        framing, extra = body_framing(ex, status, coding, b"\r\ncontent-length:" in low)
        if framing == F_NONE and status != 101 and ex.method == b"HEAD":
            # httptools cannot be told the request was HEAD: the message ends here, and
            # the next one starts on a fresh parser.
            self.done = True
            self.keep = self.parser.should_keep_alive()
        elif framing == F_DECHUNK:
            head = without_transfer_encoding(head)
            self.dechunker = Dechunker()
        close = close or framing == F_DECHUNK or framing == F_RAW  # these end where the connection does
        self.framing = framing
        ex.close_after = close
        if close:
            if status != 101:
                extra += CONN_CLOSE
        elif ex.version10:
            extra += CONN_KEEP_ALIVE
        self.head_out = b"".join((head, CRLF, extra, CRLF))
        if framing != F_NONE and is_event_stream(low):
            ex.protocol = "sse"
            chunked = framing == F_RECHUNK or (framing == F_PASS and coding == CODING_CHUNKED)
            self.sse_end = CHUNK_END if chunked else b"" if framing != F_PASS else None
            self.plane.stream_began(ex)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        ex = self.ex
        if ex is None or self.done or ex.status == 101:
            return
        self.done = True
        self.keep = self.parser.should_keep_alive()

    # -- outcomes ------------------------------------------------------------
    def _complete(self, ex: Exchange) -> None:
        """The response is complete: pool or close this connection, then let the client go on."""
        self.done = False
        if ex.method == b"HEAD":
            self.parser = HttpResponseParser(self)
        if self.dechunker is not None:
            self.dechunker = None
            self.broken = True
        self.ex = None
        self.client_tr = None
        ex.upstream = None
        if self.wpaused or self.rpaused:
            if self.wpaused:
                ex.client.resume(1)
            self.resume_for_client()
        if self.keep and ex.req_done and not self.broken and not self.closed:
            self.pool.release(self)
        elif ex.req_done:
            self.close()
        else:
            self.abort()  # the request body is still coming: this connection is unusable
        ex.client.finish(ex, ex.close_after or self.plane.draining)

    def _end_stream_at_event(self, ex: Exchange, data: bytes) -> None:
        """Shutdown: an event stream whose latest bytes end an event is ended for the client there (the
        last chunk, or the close that delimits it), instead of being cut mid-event at drain_timeout."""
        end = self.sse_end
        if end is None:
            return  # delimited by Content-Length: no clean early end exists
        if self.framing == F_PASS or self.framing == F_DECHUNK:  # the bytes still carry chunk framing
            boundary = data.endswith((b"\n\n\r\n", b"\r\r\r\n"))
        else:
            boundary = data.endswith((b"\n\n", b"\r\r"))
        if not boundary:
            return
        client = ex.client
        self.abort()
        if end and not client.transport.is_closing():
            client.transport.write(end)
        client.finish(ex, True)

    def at_frame_boundary(self) -> bool:
        return self.frames is not None and self.frames.at_boundary

    def _upgraded(self, ex: Exchange, rest: bytes) -> None:
        if ex.status != 101 or not ex.websocket:
            self._protocol_error(ex, "unexpected protocol upgrade")
            return
        self.raw = None
        if rest:
            ex.bytes_out += len(rest)
        ex.started = True
        try:
            self.client_tr.write(self.head_out + rest)  # type: ignore[union-attr]
        except RuntimeError:  # uvloop: the client's transport closed under us
            self.abort()
            return
        self.tunneled = True
        self.frames = MessageSizeGuard(_ANY_SIZE, rsv_ok=True)
        if rest:
            self.frames.feed(rest)
        self.broken = True  # never pooled again
        ex.state = TUNNEL
        ex.protocol = "websocket"
        self.plane.stream_began(ex)
        ex.client.start_tunnel(ex, self)

    def _protocol_error(self, ex: Exchange, detail: str) -> None:
        sandbox_id = ex.route.sandbox_id if ex.route else None
        log.warning("malformed response from sandbox %s: %s", sandbox_id, detail)
        client = ex.client
        self.abort()
        if ex.started:
            client.abort(ex, "upstream_protocol_error", detail)
        else:
            client.fail(ex, UpstreamError(f"sandbox {sandbox_id} sent a malformed response", sandbox_id=sandbox_id))


__all__ = ["UpstreamConnection", "UpstreamPool"]
