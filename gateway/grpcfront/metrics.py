"""Prometheus series of the gRPC front, registered once on the gateway's registry.

The method label is the call's ``:path``, which the caller chooses: the first
``method_label_limit`` distinct methods get their own series, later ones are
folded into ``other`` (as per-org labels are), so a caller inventing method
names cannot blow up the series count.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 600)
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


def status_name(code: int) -> str:
    return STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"


class GrpcMetrics:
    def __init__(self, registry: CollectorRegistry, *, method_label_limit: int = 200) -> None:
        self.calls = Counter("sgw_grpc_calls_total", "gRPC calls through the front by method and status",
                             ["method", "code"], registry=registry)
        self.duration = Histogram("sgw_grpc_call_duration_seconds", "gRPC call duration by method",
                                  ["method"], buckets=_LATENCY_BUCKETS, registry=registry)
        self.messages = Counter("sgw_grpc_messages_total", "gRPC messages forwarded, by direction",
                                ["direction"], registry=registry)
        self.open_calls = Gauge("sgw_grpc_open_calls", "gRPC calls in progress", registry=registry,
                                multiprocess_mode="livesum")
        self.connection_errors = Counter(
            "sgw_grpc_connection_errors_total", "HTTP/2 connections ended for breaking the protocol, by peer "
            "(client or sandbox) and RFC 9113 error code", ["peer", "code"], registry=registry)
        self.connections_closed = Counter(
            "sgw_grpc_connections_closed_total", "client connections the front closed or refused by a bound "
            "(handshake_timeout, settings_timeout, idle, too_many_pings, max_age, max_connections, "
            "max_connections_per_client, shed: idle, closed to admit another at a full port)", ["reason"],
            registry=registry)
        self.malformed_requests = Counter(
            "sgw_grpc_malformed_requests_total", "gRPC front requests whose head broke RFC 9113 8.2-8.3 "
            "(reset PROTOCOL_ERROR before any call began)", registry=registry)
        self._sent = self.messages.labels("to_sandbox")
        self._received = self.messages.labels("to_client")
        self._limit = method_label_limit
        self._methods: set[str] = set()
        self._series: dict[tuple[str, int], tuple[object, object]] = {}

    def method_label(self, path: str) -> str:
        if path in self._methods:
            return path
        if len(self._methods) < self._limit:
            self._methods.add(path)
            return path
        return "other"

    def observe(self, path: str, code: int, seconds: float, to_sandbox: int, to_client: int) -> None:
        key = (path, code)
        series = self._series.get(key)
        if series is None:  # resolving label children costs more than the increments
            method = self.method_label(path)
            series = (self.calls.labels(method, status_name(code)), self.duration.labels(method))
            if method != "other" or len(self._series) < 4 * self._limit:
                self._series[key] = series
        series[0].inc()  # type: ignore[attr-defined]
        series[1].observe(seconds)  # type: ignore[attr-defined]
        if to_sandbox:
            self._sent.inc(to_sandbox)
        if to_client:
            self._received.inc(to_client)
