"""Prometheus series of the gRPC front, registered once on the gateway's registry.

The method label is the call's ``:path``, which the caller chooses: the first
``method_label_limit`` distinct methods get their own series, later ones are
folded into ``other`` (as per-org labels are), so a caller inventing method
names cannot blow up the series count.

A call is only counted into a batch as it ends (its count, duration bucket and
bytes, in plain ints), and the batch is folded into the series as the data
plane's are (``gateway.metrics.RequestMetrics``): at a scrape, or with workers
at the end of the loop iteration (``Metrics.fold_soon``). The open-calls gauge
is set to this process's count as it folds. The locked increments, histogram
placement and gauge moves per call cost about 5 us of the front's 70 (2-core VM).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.metrics import Batch, labelled, observe_many

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120, 600)
STATUS_NAMES = ("OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED")


def status_name(code: int) -> str:
    return STATUS_NAMES[code] if 0 <= code < len(STATUS_NAMES) else "UNKNOWN"


class Batching(Protocol):
    """``gateway.metrics.Metrics``: folds registered batches at a scrape, and with workers once per loop iteration."""

    def add_fold(self, fold: Callable[[], None]) -> None: ...
    def fold_soon(self) -> None: ...


class GrpcMetrics:
    """The front's series. With ``batching`` (the gateway's ``Metrics``, app.py) calls are batched and folded
    as it says; without, each call is folded as it ends."""

    def __init__(self, registry: CollectorRegistry, *, method_label_limit: int = 200,
                 batching: Batching | None = None) -> None:
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
        self._closed: dict[tuple[Any, ...], Any] = {}  # children of connections_closed (labelled())
        self.malformed_requests = Counter(
            "sgw_grpc_malformed_requests_total", "gRPC front requests whose head broke RFC 9113 8.2-8.3 "
            "(reset PROTOCOL_ERROR before any call began)", registry=registry)
        self._sent = self.messages.labels("to_sandbox")
        self._received = self.messages.labels("to_client")
        self._limit = method_label_limit
        self._methods: set[str] = set()
        self._series: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._bounds = tuple(float(bound) for bound in _LATENCY_BUCKETS) + (float("inf"),)
        self._batch: dict[tuple[str, int], Batch] = {}  # (path, code): calls, seconds, per bucket (the data plane's Batch)
        self._to_sandbox = 0
        self._to_client = 0
        self.open = 0    # calls in progress in this process
        self._shown = 0  # what the open-calls gauge says
        self._fold_soon = batching.fold_soon if batching is not None else None
        # The front's calls that have ended and are not observed yet (GrpcFront.account): observed first when the
        # batching folds (a scrape, or with workers every loop iteration), so that a scrape is exact
        self.unobserved: Callable[[], None] | None = None
        if batching is not None:
            batching.add_fold(self._batch_folded)

    def method_label(self, path: str) -> str:
        if path in self._methods:
            return path
        if len(self._methods) < self._limit:
            self._methods.add(path)
            return path
        return "other"

    def closed(self, reason: str) -> None:
        """A client connection closed or refused by a bound: thousands a second under a flood of idle connections,
        so each reason's child is looked up once (``labels`` cost a tenth of such a connection's CPU)."""
        labelled(self._closed, self.connections_closed, reason).inc()

    def started(self) -> None:
        """A call began."""
        self.open += 1
        if self._fold_soon is None:
            self.fold()
        else:
            self._fold_soon()

    def observe(self, path: str, code: int, seconds: float, to_sandbox: int, to_client: int) -> None:
        """A call that began ended: with its gRPC status ``code``, after ``seconds``, having relayed that many
        messages each way."""
        self.open -= 1
        key = (path, code)
        batch = self._batch.get(key)
        if batch is None:
            batch = self._batch[key] = Batch(len(self._bounds))
            if self._fold_soon is not None:
                self._fold_soon()
        batch.count += 1
        batch.total += seconds
        buckets = batch.buckets
        buckets[bisect_left(self._bounds, seconds)] += 1  # Histogram.observe's bucket: the first bound >= it
        self._to_sandbox += to_sandbox
        self._to_client += to_client
        if self._fold_soon is None:
            self.fold()

    def _batch_folded(self) -> None:
        if self.unobserved is not None:
            self.unobserved()
        self.fold()

    def fold(self) -> None:
        """Add the batch to the series (label children resolved once per (path, code), then kept)."""
        if self._shown != self.open:
            self.open_calls.set(self.open)
            self._shown = self.open
        batches, self._batch = self._batch, {}
        for key, batch in batches.items():
            series = self._series.get(key)
            if series is None:
                path, code = key
                method = self.method_label(path)
                series = (self.calls.labels(method, status_name(code)), self.duration.labels(method))
                if method != "other" or len(self._series) < 4 * self._limit:
                    self._series[key] = series
            series[0].inc(batch.count)
            observe_many(series[1], self._bounds, batch.count, batch.total, batch.buckets)
        if self._to_sandbox:
            self._sent.inc(self._to_sandbox)
            self._to_sandbox = 0
        if self._to_client:
            self._received.inc(self._to_client)
            self._to_client = 0
