"""OpenTelemetry tracing across the hop: off by default, and free when off.

Everything tracing touches lives here. The data plane holds ``tracer`` (None when off: one attribute
check per request, no import of the SDK at all); when on, each request gets a :class:`RequestTrace` on
``Exchange.trace`` that owns its spans:

- ``http.request`` (SERVER): the whole request, continuing the client's W3C ``traceparent`` (else a
  new trace), with the sandbox ID, pool, org and status as attributes (no tokens, no user IDs: the
  metrics' labels, no more);
- ``sandbox.resolve``: only on the slow path (a route cache miss, or no idle pooled connection), and
  under it ``sandbox.provision`` or ``sandbox.wake`` when this request started a creation or wake;
- ``sandbox.upstream`` (CLIENT): from the request head leaving to the sandbox's response head; its
  context is what the sandbox receives as ``traceparent``.

Spans are exported over OTLP/HTTP (protobuf) by the official SDK's batch processor, off the event loop.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.grpcfront.call import Call
    from gateway.model import Route
    from gateway.proxy._exchange import Exchange
    from routing import Identity
    from gateway.settings import Settings

# The trace of the request this task resolves for (set only inside a traced resolution): lets the
# session layer add its provision/wake span without being handed a tracer.
_RESOLVING: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("gateway_tracing", default=None)

_TRACE_HEADERS = (b"traceparent", b"tracestate")


@contextlib.contextmanager
def phase(name: str, sandbox_id: str, pool: str) -> Iterator[None]:
    """A child span of the traced resolution this task runs for (``sandbox.provision``, ``sandbox.wake``);
    nothing (one context variable read) when the request is not traced or tracing is off."""
    trace = _RESOLVING.get()
    if trace is None:
        yield
        return
    with trace.tracer.tracer.start_as_current_span(
            name, context=trace.resolve_context, record_exception=False, set_status_on_exception=False,
            attributes={"sandbox.id": sandbox_id, "sandbox.pool": pool}) as span:
        try:
            yield
        except BaseException as exc:
            span.set_attribute("outcome", type(exc).__name__)
            raise
        span.set_attribute("outcome", "ready")


class RequestTrace:
    """The spans of one data-plane request (``Exchange.trace``)."""

    __slots__ = ("tracer", "span", "upstream_span", "resolve_context", "trace_id")

    def __init__(self, tracer: Tracer, span: Any) -> None:
        self.tracer = tracer
        self.span = span
        self.upstream_span: Any = None
        self.resolve_context: Any = None
        context = span.get_span_context()
        self.trace_id = format(context.trace_id, "032x") if context.trace_flags.sampled else None

    @contextlib.contextmanager
    def resolving(self) -> Iterator[None]:
        """The ``sandbox.resolve`` span around the slow path's resolve and connect."""
        otel = self.tracer.otel
        with self.tracer.tracer.start_as_current_span(
                "sandbox.resolve", context=otel.set_span_in_context(self.span),
                record_exception=False, set_status_on_exception=False) as span:
            self.resolve_context = otel.set_span_in_context(span)
            token = _RESOLVING.set(self)
            try:
                yield
            finally:
                _RESOLVING.reset(token)

    def upstream(self, ex: Exchange) -> tuple[bytes, ...]:
        """The header line that passes the trace on to the sandbox (HTTP/1.1), ``sandbox.upstream`` started."""
        value = self.traceparent(ex.route)
        return (b"traceparent: " + value + b"\r\n",) if value else ()

    def traceparent(self, route: Route | None) -> bytes:
        """Start ``sandbox.upstream`` (again, on a retry); its W3C ``traceparent`` (empty if invalid)."""
        otel = self.tracer.otel
        if self.upstream_span is not None:
            self.upstream_span.set_attribute("outcome", "retried")
            self.upstream_span.end()
        span = self.upstream_span = self.tracer.tracer.start_span(
            "sandbox.upstream", context=otel.set_span_in_context(self.span), kind=otel.SpanKind.CLIENT,
            attributes={"sandbox.id": route.sandbox_id, "sandbox.pool": route.pool} if route is not None else None)
        context = span.get_span_context()
        if not context.is_valid:
            return b""
        return b"00-%032x-%016x-%s" % (context.trace_id, context.span_id, b"01" if context.trace_flags.sampled else b"00")

    def grpc_head(self, head: list[tuple[bytes, bytes]], route: Route) -> list[tuple[bytes, bytes]]:
        """A gRPC call's head for the sandbox: the client's trace metadata replaced by the upstream span's."""
        head = [(name, value) for name, value in head if name not in _TRACE_HEADERS]
        value = self.traceparent(route)
        if value:
            head.append((b"traceparent", value))
        return head

    def end(self, ex: Exchange) -> None:
        """The HTTP request is over."""
        self.finish(ex.route, ex.identity, ("http.response.status_code", ex.status),
                    ex.refused or ex.code or ex.error, ex.upstream_time, ex.status >= 500 or ex.status == 0)

    def finish(self, route: Route | None, identity: Identity | None, status: tuple[str, int], outcome: str | None,
               upstream_time: float | None, failed: bool) -> None:
        """The request (or gRPC call) is over: its attributes and outcome, then the spans ended."""
        span = self.span
        up = self.upstream_span
        if up is not None:
            self.upstream_span = None
            if not up.is_recording():  # not sampled
                up.end()
            elif upstream_time is not None:
                up.set_attribute(*status)
                up.end(end_time=up.start_time + int(upstream_time * 1e9))
            else:
                up.set_attribute("outcome", outcome or "no_response")
                up.end()
        if span.is_recording():
            if route is not None:
                span.set_attribute("sandbox.id", route.sandbox_id)
                span.set_attribute("sandbox.pool", route.pool)
            if identity is not None and identity.org_id is not None:
                span.set_attribute("org.id", identity.org_id)
            span.set_attribute(*status)
            span.set_attribute("outcome", outcome or "ok")
            if failed:
                otel = self.tracer.otel
                span.set_status(otel.Status(otel.StatusCode.ERROR, outcome or ""))
        span.end()


class Tracer:
    """The SDK's tracer provider, sampler and OTLP/HTTP exporter, and the hooks the data plane calls."""

    def __init__(self, endpoint: str, sample_ratio: float = 1.0) -> None:
        from opentelemetry import trace as otel
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.otel = otel
        self.propagator = TraceContextTextMapPropagator()
        # Not the global provider: a process may hold several gateways (tests), each with its own export.
        self.provider = TracerProvider(resource=Resource.create({"service.name": "sandbox-gateway"}),
                                       sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
        self.provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces"), schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("gateway")

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracer | None:
        """None (no tracing, nothing imported) unless ``tracing_otlp_endpoint`` is set."""
        if settings.tracing_otlp_endpoint is None:
            return None
        return cls(settings.tracing_otlp_endpoint, settings.tracing_sample_ratio)

    def begin(self, ex: Exchange) -> None:
        """The HTTP request's span, continuing the client's ``traceparent``; the inbound trace headers
        are not forwarded (the sandbox gets the upstream span's context instead)."""
        carrier: dict[str, str] = {}
        headers = ex.headers
        kept: list[bytes] | None = None
        for i in range(0, len(headers), 4):
            name = headers[i].lower()
            if name in _TRACE_HEADERS:
                carrier[name.decode("latin-1")] = headers[i + 2].decode("latin-1")
                if kept is None:
                    kept = headers[:i]
            elif kept is not None:
                kept += headers[i:i + 4]
        if kept is not None:
            ex.headers = kept
        ex.trace = self._start("http.request", carrier, {
            "http.request.method": ex.method.decode("latin-1"), "request.id": (ex.request_id or b"").decode("latin-1")})

    def begin_call(self, call: Call) -> RequestTrace:
        """A gRPC call's span (``grpc.call``), continuing the client's ``traceparent`` metadata."""
        carrier = {name.decode("latin-1"): value.decode("latin-1")
                   for name, value in call.headers if name in _TRACE_HEADERS}
        return self._start("grpc.call", carrier, {"rpc.system": "grpc"})

    def _start(self, name: str, carrier: dict[str, str], attributes: dict[str, Any]) -> RequestTrace:
        context = self.propagator.extract(carrier) if carrier else None
        return RequestTrace(self, self.tracer.start_span(name, context=context, kind=self.otel.SpanKind.SERVER,
                                                         attributes=attributes))

    def flush(self, timeout: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout * 1000))

    def shutdown(self) -> None:
        """Export what is left, then stop the exporter's thread (blocking: called once, at stop)."""
        self.provider.shutdown()
