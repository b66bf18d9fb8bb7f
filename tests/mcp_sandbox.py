"""A small MCP server that plays a sandbox for the client tests (tests/test_clients_mcp.py).

Run as ``python -m tests.mcp_sandbox FD`` (the tests: a listening socket inherited as FD) or
``python -m tests.mcp_sandbox --port N`` (docs/clients.md: 127.0.0.1:N). It serves streamable HTTP
at ``/mcp``, every protocol the installed ``mcp`` speaks (2026-07-28 single exchanges,
and the handshake era with ``Mcp-Session-Id``, the GET stream and DELETE). An in-memory event
store makes streams resumable, so a tool can close its response stream mid-call and the client
resumes it with ``Last-Event-ID``, as a client behind a proxy must.
"""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.server.transport_security import TransportSecuritySettings


class MemoryEventStore(EventStore):
    """Every event kept in order, with the stream it belongs to."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []  # (event id, stream id, message)
        self.ids = itertools.count(1)

    async def store_event(self, stream_id: str, message: Any) -> str:
        event_id = str(next(self.ids))
        self.events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        stream = next((s for e, s, _ in self.events if e == last_event_id), None)
        if stream is None:
            return None
        after = False
        for event_id, stream_id, message in self.events:
            if after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream


server = MCPServer("sandbox")


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


@server.tool()
def request_headers(ctx: Context) -> dict[str, str]:
    """The HTTP headers this call arrived with (the tests check what the gateway forwarded)."""
    request = ctx.request_context.request
    return {k.lower(): v for k, v in request.headers.items()} if request is not None else {}


@server.tool()
async def interrupted(ctx: Context) -> str:
    """Closes its own response stream before answering (handshake era; a no-op at 2026-07-28): the
    client must resume it with ``GET`` and ``Last-Event-ID`` to get the answer."""
    await ctx.close_sse_stream()
    return "resumed"


class Recorder:
    """ASGI wrapper: records each request's method and resumption headers; ``GET /log`` returns them."""

    KEPT = (b"mcp-session-id", b"last-event-id", b"mcp-protocol-version", b"mcp-method")

    def __init__(self, app: Any) -> None:
        self.app = app
        self.log: list[dict[str, str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/log":
            body = json.dumps(self.log).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["type"] == "http":
            names = [k.decode() for k, _ in scope["headers"]]
            entry = {"method": scope["method"], "path": scope["path"], "query": scope["query_string"].decode()}
            entry.update({k.decode(): v.decode() for k, v in scope["headers"] if k in self.KEPT})
            entry["x-headers"] = ",".join(sorted(name for name in names if name.startswith("x-")))
            entry["credentials"] = ",".join(sorted(name for name in names if name in ("authorization", "cookie")))
            self.log.append(entry)
        await self.app(scope, receive, send)


def main() -> None:
    app = server.streamable_http_app(
        event_store=MemoryEventStore(), retry_interval=20,
        # The gateway sends Host as the sandbox's own address: the rebinding guard can stay on.
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                                     allowed_hosts=["127.0.0.1:*"]))
    where: dict[str, Any] = ({"host": "127.0.0.1", "port": int(sys.argv[2])} if sys.argv[1] == "--port"
                             else {"fd": int(sys.argv[1])})
    uvicorn.run(Recorder(app), log_level="warning", lifespan="on", **where)


if __name__ == "__main__":
    main()
