"""How a gRPC call the sandbox did not answer to its end is answered: the client's final status from the gateway
itself (a deadline, a refusal, a lost or reset sandbox, a client that left, a gateway stopping), and the plain
HTTP answer to a request that is not gRPC.

Functions of a :class:`~gateway.grpcfront.call.Call` (its fields are public): these are its error paths, kept
apart from the relay it runs call after call, and left interpreted (a failed call is not the hot path).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from grpclib.metadata import encode_grpc_message

from gateway.errors import GatewayError, UpstreamError, error_body
from gateway.grpcfront.frames import CANCEL, ENHANCE_YOUR_CALM, ERROR_NAMES, INADEQUATE_SECURITY
from gateway.grpcfront.head import (
    CANCELLED, DEADLINE_EXCEEDED, INTERNAL, PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNAVAILABLE, UNKNOWN
)
from gateway.grpcfront.relay import Truncated
from gateway.proxy._admission import SANDBOX_ID_HEADER

if TYPE_CHECKING:
    from gateway.grpcfront.call import Call

log = logging.getLogger("gateway.grpc")

# A sandbox's RST_STREAM as the client's gRPC status (gRPC over HTTP/2, "Errors"): CANCEL is passed on as
# CANCEL, REFUSED_STREAM is retried or answered UNAVAILABLE (ended_early); every other code is INTERNAL.
_RESET_STATUS = {ENHANCE_YOUR_CALM: RESOURCE_EXHAUSTED, INADEQUATE_SECURITY: PERMISSION_DENIED}


def failed(call: Call, exc: Exception) -> None:
    """What ended the call, as the client's answer (the task's and the callbacks' one mapping); the sandbox's
    stream, if open, is reset."""
    call.reset_up()
    if isinstance(exc, TimeoutError):
        call.code = "deadline_exceeded"
        answer(call, DEADLINE_EXCEEDED, "deadline exceeded (grpc-timeout) at the gateway")
    elif isinstance(exc, GatewayError):
        call.refused = getattr(exc, "scope", None)
        call.code = exc.code
        if isinstance(exc, UpstreamError):
            call.error = exc.code
        refuse(call, exc)
    elif isinstance(exc, Truncated):
        call.error = "upstream_protocol_error"
        answer(call, INTERNAL, "the sandbox's stream ended in the middle of a message")
    elif isinstance(exc, ConnectionError):
        log.info("gRPC call %s: %s", call.path, exc)
        call.error = "upstream_closed"
        answer(call, UNAVAILABLE, "the connection to the sandbox failed")
    else:
        log.error("gRPC call %s failed", call.path, exc_info=exc)
        answer(call, INTERNAL, "internal error in the gateway")


def ended_early(call: Call) -> None:
    side = call.side
    if side == "client":
        call.status = CANCELLED
        call.done = True
        call.reset_up()
    elif side == "sandbox" and call.up is not None and call.up.refused:
        answer(call, UNAVAILABLE, "the sandbox refused the call unprocessed (restarting or overloaded); retry")
    elif side == "sandbox" and call.sandbox_reset:
        code = call.up.reset_code if call.up is not None else None
        call.error = "upstream_reset"
        if code == CANCEL:  # the sandbox cancelled the call: so does the client
            call.status = CANCELLED
            call.done = True
            if call.down.closable:
                call.down.reset(CANCEL)
            return
        name = ERROR_NAMES.get(code, hex(code)) if code is not None else "?"
        status = _RESET_STATUS.get(code, INTERNAL) if code is not None else INTERNAL
        answer(call, status, f"the sandbox reset the call ({name})")
    elif side == "sandbox":
        call.error = "upstream_closed"
        answer(call, UNAVAILABLE, "the connection to the sandbox was lost")
    else:
        call.reset_up()
        answer(call, UNAVAILABLE, "the gateway is shutting down; retry")


def refuse(call: Call, exc: GatewayError) -> None:
    extra: list[tuple[str, str]] = []
    if exc.retry_after is not None:
        seconds = max(1, round(exc.retry_after))
        extra = [("retry-after", str(seconds)), ("grpc-retry-pushback-ms", str(seconds * 1000))]
    if exc.sandbox_id:
        extra.append((SANDBOX_ID_HEADER.decode(), exc.sandbox_id))
    answer(call, int(exc.grpc_status.value), f"{exc.code}: {exc.message}", extra)


async def answer_http(call: Call, exc: GatewayError) -> None:
    """Not a gRPC request: answered in plain HTTP (415 for a content-type that is not gRPC's, as gRPC over
    HTTP/2 says), so that an HTTP client does not take a 200 for success; the body is the JSON error."""
    call.status = UNKNOWN  # what a gRPC client makes of an HTTP status it has no mapping for
    down = call.down
    try:
        # The request is read to its end first (dropped; within a second and 1 MiB): a malformation
        # further on (a content-length its DATA does not match) is then still answered as one.
        async with asyncio.timeout(1.0):
            taken = 0
            while taken < 1 << 20 and (data := await down.buffer.take()):
                taken += len(data)
    except TimeoutError:
        pass
    except asyncio.CancelledError:  # the client reset the stream (or broke it) meanwhile: nothing to answer
        call.task.uncancel()  # type: ignore[union-attr]
        call.status = CANCELLED
        return
    if call.done or not down.closable:
        return
    call.done = True
    down.send_headers([(":status", str(exc.status)), ("content-type", "application/json")], end_stream=False)
    try:
        await down.send_data(error_body(exc), end_stream=True)
    except ConnectionError:
        pass  # reset meanwhile


def answer(call: Call, status: int, message: str, extra: list[tuple[str, str]] | None = None) -> None:
    """The call's final status from the gateway itself: trailers, or a trailers-only response."""
    call.status = status
    if call.done:
        return
    call.done = True
    down = call.down
    if not down.closable:
        return
    head = [] if call.head_sent else [(":status", "200"), ("content-type", "application/grpc")]
    head += [("grpc-status", str(status)), ("grpc-message", encode_grpc_message(message))]
    if extra:
        head += extra
    down.send_headers(head, end_stream=True)  # a client still sending is told to stop when it is released
