"""The data plane: a streaming HTTP/1.1, SSE and WebSocket reverse proxy to the sandboxes.

Written directly on asyncio protocols with httptools parsers on both sides
(FACTS.md: aiohttp's per-request objects cost ~8x here), so a request is a
handful of callbacks and one small state object, not a task and a stack of
wrappers. In the compiled build the plainest reads skip llhttp: a read that is one
plain request head, or one whole plain keep-alive response, is checked in one C scan
(``_wire.plain_request``, ``_wire.plain_response``) and given to the same callbacks;
anything else, however slightly unusual, is llhttp's::

    client socket -> DownstreamConnection (HttpRequestParser) -> Exchange -> UpstreamConnection (HttpResponseParser)
                         |  admission: who, may they, which route            |
                         +<------------- response bytes, as they arrive -----+

Three rooms, each with its own modules:

- **Admission** (``_admission``): who is this (the identity from headers or a
  token, memoised per connection), may they (org rate, stream slots), which
  route (the session layer's cache, synchronously). Small and synchronous
  first, so every front door (identity headers, the gRPC front) asks the same
  questions the same way.
- **Keys** (``_keys``): requests that name their sandbox by host
  (``{port}-{sandbox_id}.{preview_domain}``) or path (``/s/{sandbox_id}/{port}/...``),
  or by the router headers with a sandbox access token (``gateway.access``): the token
  stands in for admission, the route comes by sandbox ID, path mode rewrites
  ``Location`` and ``Set-Cookie``.
- **Carrying**: the downstream side (``_downstream``: serving a client's
  requests in order, head rewrite, body streaming, pipelining, upgrades;
  ``_request``: the httptools callbacks that read them; ``_refusals``: the
  answers the gateway gives itself and the ways a stream is ended) and the upstream side
  (``_upstream``: responses, and the per-endpoint keep-alive pool that alone
  takes and releases connections; ``_framing``: how a response body reaches the
  client), with the bytes they write (``_wire``), the
  per-request state (``_exchange``) and WebSocket frame checks (``_wsframe``).
- **Wiring** (``_plane``): :class:`DataPlane` starts, drains and stops, connects
  with retries, keeps the coarse clock and the deadlines, reports each finished
  request; it takes :class:`PlaneOptions` (a few values, not the whole
  ``Settings``) and its seams as protocols with null objects for what is off
  (``_seams``: ``RouteResolver``; ``RouterHeaders``/``NoRouterHeaders``; and ``on_request``).

Flow control is the transports' own: a full write buffer on one side pauses
reading on the other, so bodies of any size stream in constant memory.
"""

from gateway.proxy._exchange import RequestLog
from gateway.proxy._keys import PreviewKeys
from gateway.proxy._plane import DataPlane, PlaneOptions
from gateway.proxy._seams import NoRouterHeaders, RouteResolver, RouterHeaders
from gateway.proxy._state import RequestHooks

__all__ = ["DataPlane", "NoRouterHeaders", "PlaneOptions", "PreviewKeys", "RequestHooks", "RequestLog",
           "RouteResolver", "RouterHeaders"]
