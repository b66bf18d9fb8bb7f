"""Streaming endpoints: ``GET /events`` (SSE) and ``GET /ws`` (WebSocket echo).

They exist so the gateway's proxy can be tested end to end against a real
sandbox: SSE events are written and flushed one at a time (a proxy that
buffers shows up as the first event arriving late), and the WebSocket lets
the sandbox pick its close code (a proxy that swallows it shows up too).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import WSCloseCode, WSMsgType, web

from .config import CONFIG
from .errors import BadRequest

MAX_EVENTS = 10_000
MAX_INTERVAL_MS = 60_000

#: Open WebSockets, closed with 1001 on shutdown instead of being cut off.
WEBSOCKETS: web.AppKey[set[web.WebSocketResponse]] = web.AppKey("runtime_websockets")

# Close codes an endpoint must never send in a close frame (RFC 6455 7.4.1).
_RESERVED_CLOSE_CODES = frozenset({1004, 1005, 1006, 1015})


def _int_query(request: web.Request, name: str, default: int, maximum: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= maximum:
        raise BadRequest(f"query '{name}' must be an integer in [0, {maximum}]", code=f"invalid_{name}")
    return value


async def handle_events(request: web.Request) -> web.StreamResponse:
    """``GET /events?count=N&interval_ms=M``: ``tick`` events numbered from 1.

    ``count=0`` streams until the client disconnects or the server stops.
    The ``id`` field and ``data.n`` carry the same number.
    """
    count = _int_query(request, "count", 10, MAX_EVENTS)
    interval = _int_query(request, "interval_ms", 100, MAX_INTERVAL_MS) / 1000
    config = request.app[CONFIG]
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    n = 0
    try:
        while count == 0 or n < count:
            if n:
                # Waking on ``stopping`` ends endless streams at shutdown.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(config.stopping.wait(), interval)
                if config.stopping.is_set():
                    break
            n += 1
            data = json.dumps({"n": n, "sandbox_id": config.sandbox_id})
            await response.write(f"id: {n}\nevent: tick\ndata: {data}\n\n".encode())
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left; nothing to tell it
    return response


async def handle_ws(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws``: echo text and binary frames unchanged.

    A text frame ``close:<code>:<reason>`` makes the server close with that
    code and reason instead; a malformed or reserved code is echoed as
    ordinary text. A close from the client is answered and the handler ends.
    """
    ws = web.WebSocketResponse(autoping=True)
    await ws.prepare(request)
    sockets = request.app[WEBSOCKETS]
    sockets.add(ws)
    try:
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                if (close := _parse_close(msg.data)) is not None:
                    await ws.close(code=close[0], message=close[1].encode())
                    break
                await ws.send_str(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await ws.send_bytes(msg.data)
    finally:
        sockets.discard(ws)
    return ws


def _parse_close(text: str) -> tuple[int, str] | None:
    """``close:4001:bye`` -> ``(4001, "bye")``; anything else -> None."""
    prefix, sep, rest = text.partition(":")
    if prefix != "close" or not sep:
        return None
    code_text, _, reason = rest.partition(":")
    if not code_text.isdigit():
        return None
    code = int(code_text)
    if not 1000 <= code <= 4999 or code in _RESERVED_CLOSE_CODES or len(reason.encode()) > 123:
        return None
    return code, reason


async def close_websockets(app: web.Application) -> None:
    """on_shutdown: tell every open WebSocket client we are going away."""
    for ws in list(app[WEBSOCKETS]):
        await ws.close(code=WSCloseCode.GOING_AWAY, message=b"sandbox runtime shutting down")
