"""One gRPC call through the front: admit it, open a stream to the sandbox, relay both ways.

Messages are relayed as the bytes of their length-prefixed frames (compression
flag included), taken from one HTTP/2 stream's receive buffer and written to the
other's (``relay``: a received DATA frame's bytes are acknowledged, opening the
sender's window, only when the relay takes them, and ``send_data`` waits for the
peer's window and for the transport's write buffer): so a slow reader on either
side stops the writer on the other, end to end, and what the gateway holds per
call is bounded by the HTTP/2 windows plus one relay piece. A large message is
relayed piece by piece and is never held whole.

Termination is reported through a stream's ``owner``: the call gives each of
its two streams a :class:`_Side`, which records which side
ended (the client reset or left, the sandbox reset or its connection dropped)
and ends the call: at once when it is served by callbacks (``Call.start``),
else by cancelling its task, which then settles the other side. What the client
is then told (and every other answer the gateway gives itself) is in ``ending``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway.errors import UnsupportedMediaType, UpstreamError
from gateway.grpcfront.ending import answer_http, ended_early, failed
from gateway.grpcfront.frames import CANCEL, NO_ERROR
from gateway.grpcfront.head import (
    INTERNAL, Headers, forwardable, header_text, http_status, read_head, remember, sandbox_head, status_of, timeout_left
)
from gateway.grpcfront.relay import CHUNK, Truncated, relay
from gateway.grpcfront.stream import Stream, StreamClosed, relay_now
from gateway.grpcfront.upstream import Target

if TYPE_CHECKING:
    from gateway.grpcfront.connection import Connection
    from gateway.grpcfront.front import GrpcFront, _ServerSide
    from routing import Identity


class _Side:
    """The owner of one of the call's streams: told when that stream ends early."""

    __slots__ = ("call", "name")

    def __init__(self, call: Call, name: str) -> None:
        self.call = call
        self.name = name

    def stream_ended(self, reset: bool) -> None:
        call = self.call
        if self.name == "sandbox":
            if call.up is not None and call.may_resend(call.up):
                return  # the call sends it again (_response_head): nothing has ended for the client
            call.sandbox_reset = call.sandbox_reset or reset
        call.terminated(self.name)


_HEADS_REMEMBERED = 16  # distinct request heads per client connection; more and the memo starts over



class Call:
    """One call: begun by :meth:`start`, and served by callbacks where it can (a unary call to a sandbox that is
    ready, typically), else by a task (:meth:`run`) that takes it from where the callbacks left it."""

    __slots__ = ("front", "conn", "down", "headers", "task", "up", "pump", "side",
                 "sandbox_reset", "head_sent", "done", "status", "path", "t0", "route", "deadline", "stream_key",
                 "to_sandbox", "to_client", "org_id", "refused", "running", "identity", "request", "resent",
                 "error", "code", "sent_at", "upstream", "timeout", "trace", "fast", "timer", "target",
                 "sandbox_head")

    def __init__(self, front: GrpcFront, conn: _ServerSide, down: Stream) -> None:
        self.front = front
        self.conn = conn
        self.down = down
        self.headers: Headers = down.headers  # type: ignore[assignment]  # a stream is accepted with its head
        self.task: asyncio.Task[None] | None = None
        self.up: Stream | None = None
        self.pump: asyncio.Task[None] | None = None
        self.side: str | None = None        # who ended the call early: "client", "sandbox", "stopping"
        self.sandbox_reset = False          # the sandbox reset its stream (rather than its connection dropping)
        self.head_sent = False
        self.done = False                   # the client has its final status (or is gone)
        self.status = INTERNAL
        self.path = "-"
        self.t0 = time.perf_counter()
        self.route = None
        self.deadline: float | None = None
        self.timeout: tuple[bytes, float] | None = None  # the client's grpc-timeout, and in seconds
        self.stream_key: str | None = None
        self.to_sandbox = 0
        self.to_client = 0
        self.org_id: str | None = None
        self.refused: str | None = None
        self.identity: Identity | None = None
        self.running = False                # run() has begun (a task cancelled before it starts never runs)
        self.request: bytes | None = None   # the whole request, when it was sent at once (kept to resend)
        self.resent = False
        self.error: str | None = None       # why the sandbox side failed: an UpstreamError code (access log)
        self.code: str | None = None        # the error code of an answer the gateway gave itself
        self.sent_at = 0.0                  # perf_counter() when the head went to the sandbox
        self.upstream: float | None = None  # from then to the sandbox's response head
        self.trace: Any = None              # a gateway.tracing.RequestTrace when tracing is on
        self.fast = False                   # served by callbacks (start), no task: until it ends or a task takes it
        self.timer: asyncio.TimerHandle | None = None  # the client's deadline, while served by callbacks
        self.target: Target | None = None   # where the sandbox answers, and the head sent it (kept to resend)
        self.sandbox_head: Headers | None = None
        down.owner = _Side(self, "client")

    # -- termination reported by the streams ----------------------------------------
    def terminated(self, side: str) -> None:
        if self.done or self.side is not None:
            return
        if side == "sandbox" and self._sandbox_answered():
            return  # the sandbox reset after its final status: the call is complete as far as it goes
        self.side = side
        if self.fast:
            ended_early(self)
            self._finish()
        elif self.running and self.task is not None:
            self.task.cancel()

    def stop(self) -> None:
        """The gateway is stopping: the call ends UNAVAILABLE now (one whose task has not begun does as it begins;
        a task cancelled before it starts would never run, nor its cleanup)."""
        if self.fast:
            self.terminated("stopping")
        elif self.task is not None and self.running and not self.task.done():
            self.side = "stopping"
            self.task.cancel()

    def _sandbox_answered(self) -> bool:
        up = self.up
        return up is not None and (up.trailers is not None or (up.headers is not None and
                                                                 status_of(up.headers) is not None))

    # -- served by callbacks ------------------------------------------------------------
    def start(self) -> None:
        """Begin the call (scheduled by the front as the client's stream is accepted): :meth:`_start`; then the
        metrics and access lines of the calls that ended before (``GrpcFront.finished``), once this one's request
        is on its way to the sandbox: off the path from a client's request to its answer."""
        self._start()
        front = self.front
        if front.unaccounted:
            front.account()

    def _start(self) -> None:
        """A call whose route is cached
        and whose sandbox has a connection with a free stream is sent from here, and answered from
        :meth:`_head_in`, with no task: a task's creation, steps and futures were about a seventh of a unary call's
        instructions. Anything else (a route to resolve: the sandbox may be created or woken; a connection to make;
        tracing; an answer that does not come whole) goes on in :meth:`run`, a task, from where this left it."""
        if self.side is not None or self.front.tracer is not None:
            self._spawn()
            return
        self.fast = True
        try:
            out = self._admit()
            conn, identity = self.conn, self.identity  # the connection's last route for it is not owner-checked again
            route = self.front.router.cached_route(identity, conn.owned if identity is conn.owned_by else None)
            if route is None:
                self._spawn(out)
                return
            conn.owned_by, conn.owned = identity, route
            self._routed(route)
            connection = self.front.channels.ready(self.target)  # type: ignore[arg-type]
            if connection is None:
                self._spawn(out)
                return
            if self.deadline is not None:
                self.timer = self.down.conn.loop.call_at(self.deadline, self._expired)
            self._send_head(connection, out)
        except UnsupportedMediaType:  # answered in plain HTTP once the request is read: by the task
            self._spawn()
        except Exception as exc:
            if self.fast:  # else it ended meanwhile (the client's request ended inside a message)
                failed(self, exc)
                self._finish()

    def _head_in(self) -> None:
        """The sandbox's stream has its head, or has ended (``Stream.on_head``, called once the frames that came
        with it are read). When its whole answer is here and the client's stream takes it now (a unary answer,
        typically), it is given from here; else the task relays it, or sends a request refused unprocessed again."""
        if not self.fast:
            return  # ended meanwhile
        up: Stream = self.up  # type: ignore[assignment]
        buffer = up.buffer
        if up.headers is None or not buffer.complete or buffer.size > CHUNK or not self.down.takes_now(buffer.size):
            self._spawn()
            return
        try:
            self.upstream = time.perf_counter() - self.sent_at
            self.request = None  # answered: processed, never to be sent again
            conn = self.down.conn
            held = self._hold_alone(conn)  # _alone, inline
            try:
                status = self._answer_now(up.headers, self.route.sandbox_id)
            finally:
                if held:
                    conn.flush()
            self._settled(status)
        except Exception as exc:
            failed(self, exc)
        self._finish()

    def _expired(self) -> None:
        """The client's deadline, while the call is served by callbacks (the task's is ``asyncio.timeout_at``)."""
        self.timer = None
        failed(self, TimeoutError())
        self._finish()

    def _spawn(self, out: Sequence[tuple[bytes, bytes]] | None = None) -> None:
        """The rest of the call in a task (:meth:`run`); ``out``: the head is read and the call admitted."""
        self._leave_callbacks()
        self.task = self.down.conn.loop.create_task(self.run(out))

    def _finish(self) -> None:
        self._leave_callbacks()
        self._cleanup()

    def _leave_callbacks(self) -> None:
        self.fast = False
        timer = self.timer
        if timer is not None:
            self.timer = None
            timer.cancel()
        if self.up is not None:
            self.up.on_head = None

    # -- served by a task ------------------------------------------------------------------
    async def run(self, out: Sequence[tuple[bytes, bytes]] | None = None) -> None:
        """The call, or what :meth:`start` left of it: all of it; the rest after the head is read and the call
        admitted (``out``, the headers to forward); the answer, once the sandbox's stream is open."""
        self.running = True
        if self.front.tracer is not None:
            self.trace = self.front.tracer.begin_call(self)  # gateway/tracing.py
        try:
            if self.side is not None:  # ended before it began (the client reset at once, or we are draining)
                ended_early(self)
                return
            if self.up is None and out is None:
                out = self._admit()
            if self.deadline is None:
                if self.up is None:
                    await self._forward(out)  # type: ignore[arg-type]
                await self._relay_back()
            else:
                async with asyncio.timeout_at(self.deadline):
                    if self.up is None:
                        await self._forward(out)  # type: ignore[arg-type]
                    await self._relay_back()
        except asyncio.CancelledError:
            if self.side is None:
                self.side = "stopping"
            self.task.uncancel()  # type: ignore[union-attr]
            ended_early(self)
        except UnsupportedMediaType as exc:
            self.code = exc.code
            await answer_http(self, exc)
        except Exception as exc:
            failed(self, exc)
        finally:
            self._cleanup()

    def _admit(self) -> Sequence[tuple[bytes, bytes]]:
        """Validate the request head, take the identity metadata out, admit the call (the org's limits); returns
        the headers to forward.

        A client sends the same head call after call: what a head of up to 8 KiB reads as is remembered per
        connection (``_ServerSide.heads``, by the id of the tuple its codec decodes it to, kept in the entry), so a
        repeated one is validated and sorted once (reading it cost about 14 us a call on the 2-core VM at load 12).
        Only the identity is looked up per call (the admission's own memo), and the deadline is counted from now;
        a refused head is never kept."""
        heads = self.conn.heads
        headers = self.headers
        entry = heads.get(id(headers))
        if entry is not None and entry[0] is headers:
            head = entry[1]
        else:
            head = read_head(headers, self)
            remember(heads, id(headers), (headers, head), headers, _HEADS_REMEMBERED)
        out, self.path, timeout, credentials = head
        if timeout is not None:
            self.deadline = self.down.conn.loop.time() + timeout[1]
            self.timeout = timeout
        admission = self.front.admission
        identity = self.identity = admission.identify(self.conn, credentials)
        self.org_id = identity.org_id
        if admission.limited:  # every call is a stream (it holds a slot for as long as it runs)
            self.stream_key = admission.admit(identity, True)
        return out

    def _routed(self, route: Any) -> None:
        front = self.front
        self.route = route
        front.router.stream_opened(route.sandbox_id)
        targets, key = front.targets, id(route)  # the route's target, as GrpcFront.target found it before
        known = targets[key] if key in targets else None  # (`in` and [] are C slots; .get, a method call)
        self.target = known[1] if known is not None and known[0] is route else front.target(route)

    async def _forward(self, out: Sequence[tuple[bytes, bytes]]) -> None:
        """Resolve the route (the sandbox may be created or woken), connect to it, send the request."""
        if self.route is None:
            if self.trace is None:
                self._routed(await self.front.router.resolve(self.identity))  # type: ignore[arg-type]
            else:
                with self.trace.resolving():
                    self._routed(await self.front.router.resolve(self.identity))  # type: ignore[arg-type]
        connection = await self.front.channels.connection(self.target)  # type: ignore[arg-type]
        self._send_head(connection, out)

    def _send_head(self, connection: Connection, out: Sequence[tuple[bytes, bytes]]) -> None:
        """The request head to the sandbox: the front's remembered one (its encoder knows the tuple by identity)."""
        route = self.route
        timeout = None
        if self.deadline is not None:
            timeout = timeout_left(self.timeout, self.deadline - self.down.conn.loop.time())  # type: ignore[arg-type]
        head: Any = sandbox_head(self.front.sandbox_heads, out, self.path, self.target, route.sandbox_id, timeout,
                                 timeout is None or timeout is self.timeout[0])  # type: ignore[index]
        if self.trace is not None:
            head = self.trace.grpc_head(list(head), route)  # the sandbox continues the trace (traceparent)
        self.sandbox_head = head
        self.sent_at = time.perf_counter()
        held = self._hold_alone(connection)  # _alone, inline
        try:
            self._open_up(connection, head)
        finally:
            if held:
                connection.flush()

    async def _relay_back(self) -> None:
        """The sandbox's answer to the client, as it comes."""
        response = await self._response_head()
        self.upstream = time.perf_counter() - self.sent_at
        down = self.down
        sandbox_id = self.route.sandbox_id
        status = self._alone(down.conn, self._answer_now, response, sandbox_id)
        if status is None:  # the rest of the answer is still to come (a stream, typically): relayed as it comes
            self.to_client = await relay(self.up, down)  # type: ignore[arg-type]
            status = self._alone(down.conn, self._send_trailers, sandbox_id)
        self._settled(status)

    def _open_up(self, connection: Connection, head: Headers) -> None:
        """The sandbox's stream, with the request sent at once where it fits (else by a task of its own)."""
        up = self.up = connection.open_stream(head, _Side(self, "sandbox"))
        if self.fast:
            up.on_head = self._head_in
        if self._request_fits(up):
            self.request = self.down.buffer.peek()  # kept until the sandbox answers: see _response_head, _head_in
            self._send_request_now(up)  # nothing in it can wait: no task needed (a unary call, typically)
        else:
            self.pump = self.down.conn.loop.create_task(self._send_request(up))

    def _answer_now(self, response: Headers, sandbox_id: str) -> int | None:
        """What of the sandbox's answer (``response`` is its head) can be sent the client now: a trailers-only
        answer, or the head and, when the whole answer is here (a unary one, typically), its message and its
        trailers. Returns the call's gRPC status once the client has all of it, else None."""
        status = status_of(response)
        down = self.down
        if status is not None:  # trailers-only: the whole answer is this one HEADERS frame
            down.send_headers(forwardable(response, head=True), end_stream=True)
            return status
        code = http_status(response)
        if code != b"200":
            raise UpstreamError(f"the sandbox answered HTTP {header_text(code) or '?'} without a gRPC status",
                                sandbox_id=sandbox_id)
        down.send_headers(forwardable(response, head=True))
        self.head_sent = True
        relayed = relay_now(self.up, down)  # type: ignore[arg-type]
        if relayed is None:
            return None
        self.to_client = relayed
        return self._send_trailers(sandbox_id)

    def _send_trailers(self, sandbox_id: str) -> int:
        trailers = self.up.trailers  # type: ignore[union-attr]
        if trailers is None:
            raise UpstreamError("the sandbox ended its response without a gRPC status", sandbox_id=sandbox_id)
        self.down.send_headers(forwardable(trailers, head=False), end_stream=True)
        return status_of(trailers) or 0

    def _alone(self, conn: Connection, write: Callable[..., Any], *args: Any) -> Any:
        """``write(*args)``; when this is the front's only call, what it writes to ``conn`` goes out at once, in one
        ``send()`` (``Connection.hold``, ``flush``): nothing else this loop step does could join it, and no flush
        is left queued to cost the loop a turn. With other calls running, a step's writes go out together at its
        end (flushing per call split those batches: 1.1-1.5 sends per call instead of 0.3-0.7 at 10 and 50)."""
        held = self._hold_alone(conn)
        try:
            return write(*args)
        finally:
            if held:
                conn.flush()

    def _hold_alone(self, conn: Connection) -> bool:
        """``conn.hold()`` when this is the front's only call (:meth:`_alone`), and whether it did. The callbacks'
        two writes (:meth:`_send_head`, :meth:`_head_in`) use it inline: no bound method and argument tuple a call."""
        if len(self.front.calls) != 1:
            return False
        conn.hold()
        return True

    async def _response_head(self) -> Headers:
        """The sandbox's response head. A request it ended unprocessed (REFUSED_STREAM, or a GOAWAY below
        the stream: it is restarting or shedding load) is sent once more, on a connection that takes it,
        when the gateway has the whole of it (RFC 9113 8.7); the client never learns of the first try."""
        up: Stream = self.up  # type: ignore[assignment]
        try:
            response = await up.recv_headers()
        except StreamClosed:
            if not self.may_resend(up):
                raise
            self.resent = True
            up.release()
            connection = await self.front.channels.connection(self.target)  # type: ignore[arg-type]
            up = self.up = connection.open_stream(self.sandbox_head, _Side(self, "sandbox"))  # type: ignore[arg-type]
            await up.send_data(self.request, end_stream=True)  # type: ignore[arg-type]
            response = await up.recv_headers()
        self.request = None  # answered: processed, never to be sent again
        return response

    def may_resend(self, up: Stream) -> bool:
        """``up`` was refused unprocessed, and its request can be sent again (whole, and not sent twice)."""
        return up.refused and self.request is not None and not self.resent and self.side is None

    def _request_fits(self, up: Stream) -> bool:
        """The client's whole request is here and the sandbox's stream takes it now (``relay_now``).

        Then relaying it cannot wait (not for the client, not for a window, not for the transport), so
        it is sent before the response is awaited, without a task of its own; otherwise a task sends it
        while the response is relayed (a sandbox may answer before it has read the request).
        """
        buffer = self.down.buffer
        return buffer.complete and buffer.size <= CHUNK and up.takes_now(buffer.size)

    def _send_request_now(self, up: Stream) -> None:
        try:
            self.to_sandbox = relay_now(self.down, up, end_stream=True)  # type: ignore[assignment]  # it fits
        except Truncated:
            self.terminated("client")

    async def _send_request(self, up: Stream) -> None:
        try:
            self.to_sandbox = await relay(self.down, up, end_stream=True)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            pass  # the sandbox's stream is closed already: it answered, or it is gone (the response side says which)
        except Truncated:
            self.terminated("client")

    def _settled(self, status: int) -> None:
        """The client has its final status. A client still sending is told to stop (RST_STREAM NO_ERROR)."""
        self.status = status
        self.done = True
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
            if self.down.closable:
                self.down.reset(NO_ERROR)

    def reset_up(self) -> None:
        """Close our end of the sandbox's stream: CANCEL unless the sandbox has answered (then NO_ERROR)."""
        up = self.up
        if up is not None and not up.gone and not (up.local_closed and up.remote_closed):
            up.reset(NO_ERROR if self._sandbox_answered() else CANCEL)

    def _cleanup(self) -> None:
        pump = self.pump
        if pump is not None and not pump.done():
            pump.cancel()
        self.reset_up()
        if self.up is not None:
            self.up.release()
        self.down.release()
        front = self.front
        if self.stream_key is not None:
            front.admission.stream_closed(self.stream_key)
        if self.route is not None:
            front.router.stream_closed(self.route.sandbox_id)
        if self.trace is not None:
            self.trace.finish(self.route, self.identity, ("rpc.grpc.status_code", self.status),
                              self.refused or self.code or self.error, self.upstream, self.status not in (0, 1, 3, 5))
        front.finished(self)
        # Break the call <-> stream cycles (Call -> Stream -> _Side -> Call): the call, its streams and
        # their buffers and headers are then freed as the call ends, by reference counting, rather
        # than left to the cyclic GC, whose collections cost the gateway about a tenth of its time.
        self.down.owner = None
        if self.up is not None:
            self.up.owner = None
