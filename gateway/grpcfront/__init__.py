"""The gRPC front: any gRPC call on :50051 forwarded to the caller's sandbox, as raw messages.

Identity, routing, limits and errors are the HTTP data plane's: identity from the
metadata ``x-org-id``, ``x-user-id``, ``x-session-id``, ``x-bot-id`` or
``authorization`` (through the same authenticator), the route from
``SessionRouter.resolve`` (creating the sandbox on first use, owner checked), the
per-org rate limit per call and ``max_streams_per_org`` counting every open call.
Refusals are gRPC statuses from ``gateway.errors`` (``grpc_status`` beside the
HTTP status), with ``retry-after`` metadata where the HTTP answer has Retry-After.

What is forwarded: every message byte for byte (the length prefix and its
compression flag included), metadata both ways except the identity keys and
every ``x-sandbox-*`` key (``x-sandbox-id`` is added; a request metadata value
that is not ASCII, as gRPC requires, is refused with INVALID_ARGUMENT), the sandbox's status,
message, details and trailers as it sent them, ``grpc-timeout`` as the time left
(the gateway enforces the deadline too), and cancellation both ways (a client's
RST_STREAM becomes one towards the sandbox and back).

Why grpclib's protocol layer, not its ``Server``/``Channel`` API: a catch-all
method is what a passthrough needs, and grpclib's ``Server`` dispatches from a
fixed ``{path: handler}`` mapping, answers any content-type but its codec's with
415, decodes every message through a codec (dropping the compression flag) and
writes its own response head and trailers. Its protocol layer
(``grpclib.protocol``: ``H2Protocol``, ``Stream``) is the part that serves: one
h2 state machine per connection, per-stream receive buffers that open the HTTP/2
window only as the application reads, ``send_data`` that waits for the peer's
window and the transport's buffer, and stream termination reported through a
per-stream hook. That gives end-to-end flow control with about 300 lines here
and no second HTTP/2 implementation; raw ``h2`` would mean rewriting exactly
that layer. The listener speaks h2c (prior knowledge), or TLS with ALPN ``h2``
when ``grpc_tls_cert_file`` and ``grpc_tls_key_file`` are set; connections to
sandboxes are h2c.

Modules: ``front`` (listener, connections, draining, access log), ``call`` (one
call: admission, endings), ``relay`` (one direction of a call: receive buffer and
forwarding), ``wire`` (batched writes under grpclib, h2's deferred frame repr),
``upstream`` (connections to sandboxes and :func:`grpc_target`, the one place
that picks a sandbox's gRPC address), ``metrics``.
"""

from gateway.grpcfront.front import GrpcFront
from gateway.grpcfront.metrics import GrpcMetrics
from gateway.grpcfront.upstream import grpc_target

__all__ = ["GrpcFront", "GrpcMetrics", "grpc_target"]
