"""The gRPC front: any gRPC call on :50051 forwarded to the caller's sandbox, as raw messages.

Identity, routing, limits and errors are the HTTP data plane's: identity from the
metadata ``x-org-id``, ``x-user-id``, ``x-session-id``, ``x-bot-id`` or
``authorization`` (through the same authenticator), the route from
``SessionRouter.resolve`` (creating the sandbox on first use, owner checked), the
per-org rate limit per call and ``max_streams_per_org`` counting every open call.
Refusals are gRPC statuses from ``gateway.errors`` (``grpc_status`` beside the
HTTP status), with ``retry-after`` metadata where the HTTP answer has Retry-After.

What is forwarded: every message byte for byte (the length prefix and its
compression flag included), request metadata as the data plane's header rules
say (``gateway.proxy._admission``: never identity, credentials, ``x-sandbox-*``,
``x-forwarded-*`` or the access-token cookie; ``x-sandbox-id`` is added; a value
that is not ASCII, as gRPC requires, is refused with INVALID_ARGUMENT), after the
head passed RFC 9113 8.2-8.3 (``headers.request_problem``: else RST_STREAM
PROTOCOL_ERROR), the sandbox's status, message, details and trailers as it sent
them, ``grpc-timeout`` as sent (the time left instead if the gateway spent a
millisecond or more of it; the gateway enforces the deadline too), and
cancellation both ways (a client's RST_STREAM becomes one towards the sandbox and
back).

Why its own HTTP/2 layer (``connection``, ``stream``, ``frames``), not grpclib's
``Server``/``Channel`` or its protocol over ``h2``: a catch-all method is what a
passthrough needs, and grpclib's ``Server`` dispatches from a fixed ``{path:
handler}`` mapping, decodes every message through a codec (dropping the
compression flag) and writes its own response head and trailers. Its protocol
layer served first, but h2's general state machine, hyperframe's frame
objects and grpclib's events under it were about 90 of the 216 us the gateway
spent per relayed unary call, and kept it under half the rate of a direct call.
A relay uses a small part of HTTP/2 (streams, header blocks, DATA, windows,
resets), which the frame layer implements to RFC 9113, strictly towards a
hostile peer; HPACK stays the ``hpack`` library's. The listener speaks h2c
(prior knowledge), or TLS with ALPN ``h2`` when ``grpc_tls_cert_file`` and
``grpc_tls_key_file`` are set; connections to sandboxes are h2c.

Modules: ``front`` (listener, connections, draining, access log), ``call`` (one
call: admission, relay; served by callbacks where its route is cached and its
sandbox's connection ready, a unary call's usual case, else by a task),
``ending`` (what a call the sandbox did not answer to its end is answered), ``head``
(what a request head reads as; what of an answer's head and trailers a client
may get), ``relay`` (one direction of a call: receive buffer and
forwarding), ``connection`` and ``stream`` (one HTTP/2 connection, either end, and
its streams with flow control), ``inbound`` (the connection's reading half: the
frame parser and what a hostile peer gets), ``frames`` (the wire layout),
``headers`` (HPACK, its repeated blocks remembered; what a request head may be),
``keeper`` (a client connection's deadlines), ``upstream``
(connections to sandboxes and :func:`grpc_target`, the one place that picks a
sandbox's gRPC address), ``metrics``.
"""

from gateway.grpcfront.front import GrpcFront
from gateway.grpcfront.metrics import GrpcMetrics
from gateway.grpcfront.upstream import grpc_target

__all__ = ["GrpcFront", "GrpcMetrics", "grpc_target"]
