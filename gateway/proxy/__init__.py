"""The data plane: a streaming HTTP/1.1, SSE and WebSocket reverse proxy to the sandboxes.

Written directly on asyncio protocols with httptools parsers on both sides
(FACTS.md: aiohttp's per-request objects cost ~8x here), so a request is a
handful of callbacks and one small state object, not a task and a stack of
wrappers::

    client socket -> ClientConnection (HttpRequestParser) -> Exchange -> UpstreamConnection (HttpResponseParser)
                                 ^                                                   |
                                 +---------------- response bytes, as they arrive ---+

- ``_client``    requests: identity, routing, head rewrite, body streaming, pipelining, upgrades
- ``_upstream``  responses and the per-endpoint keep-alive pool
- ``_plane``     :class:`DataPlane` (start/stop/drain, connect with retries, the coarse clock)
- ``_wire``      header tables and byte builders
- ``_exchange``  per-request state and :class:`RequestLog`

Flow control is the transports' own: a full write buffer on one side pauses
reading on the other, so bodies of any size stream in constant memory.
"""

from gateway.proxy._exchange import RequestLog
from gateway.proxy._plane import DataPlane, RouteResolver

__all__ = ["DataPlane", "RequestLog", "RouteResolver"]
