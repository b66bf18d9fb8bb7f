"""Every Prometheus metric the gateway exports, in one place.

Labels are bounded by construction: pools come from the policy, protocols and
reasons from enums or fixed strings, status as a class (``2xx``). No sandbox or
session ID is ever a label. Per-org series exist only when enabled, and fold
orgs beyond ``org_label_limit`` into ``other`` so a tenant flood cannot blow up
the series count.

Each gateway owns a ``CollectorRegistry`` (tests build several in one process).
With ``--workers N`` the workers share a multiprocess directory and the
exposition aggregates them (prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_PROVISION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
_WAKE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)
_STORE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)
_STATUS_CLASS = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}
# The reasons SessionRouter reports, exported at zero from the start: a labelled counter has no
# series until first used, so a dashboard panel said "No data" (not 0) until the first reap or sweep.
REAP_REASONS = ("idle", "session_deleted", "gone", "retention", "requested")  # gone: found unreachable and gone at its provider;
# retention: suspended for longer than its pool's retention; requested: an operator's DELETE /v1/sandboxes/{id}
ORPHAN_SWEEP_REASONS = ("no_store_record",)


def status_class(status: int) -> str:
    return _STATUS_CLASS.get(status // 100, "other")


DENIAL_CODES = frozenset({"cross_site_request", "host_not_allowed"})
"""The data plane's own refusals that ``sgw_security_denials_total`` counts by code, beside the owner
checks: a sibling sandbox's page riding on a preview cookie, a Host the gateway does not serve."""


def labelled(cache: dict[tuple[Any, ...], Any], metric: Any, *labels: str) -> Any:
    """``metric.labels(*labels)``, looked up once per label values: for what is counted thousands of times a
    second under a connection flood (refusals, sheds, closes), where ``labels`` cost more than the rest of the
    count. ``cache`` is the caller's, keyed by metric and values."""
    key = (metric, *labels)
    child = cache.get(key)
    if child is None:
        child = cache[key] = metric.labels(*labels)
    return child


class Metrics:
    def __init__(self, *, per_org: bool = False, org_label_limit: int = 100,
                 multiprocess_dir: str | None = None) -> None:
        self._multiprocess_dir = multiprocess_dir  # Settings.prometheus_multiproc_dir: aggregate the workers
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("sgw_requests_total", "Data-plane requests by pool, protocol and status class",
                                ["pool", "protocol", "status"], registry=r)
        self.request_duration = Histogram("sgw_request_duration_seconds", "Data-plane request duration",
                                          ["pool", "protocol"], buckets=_LATENCY_BUCKETS, registry=r)
        self.upstream_errors = Counter("sgw_upstream_errors_total", "Upstream failures by reason", ["reason"], registry=r)
        self.provision_duration = Histogram("sgw_provision_duration_seconds", "Time to create a sandbox until ready",
                                            ["pool"], buckets=_PROVISION_BUCKETS, registry=r)
        self.provisions = Counter("sgw_provisions_total", "Sandbox creations by pool and outcome",
                                  ["pool", "outcome"], registry=r)
        self.sessions = Gauge("sgw_sessions", "Bound sessions by pool", ["pool"], registry=r,
                              multiprocess_mode="max")
        self.sandboxes = Gauge("sgw_sandboxes", "Sandboxes by pool and state", ["pool", "state"], registry=r,
                               multiprocess_mode="max")
        # Suspend and wake (gateway/lifecycle.py). Outcomes: suspended | ready, else an error code.
        self.suspends = Counter("sgw_suspends_total", "Sandbox suspends by pool and outcome", ["pool", "outcome"],
                                registry=r)
        self.resumes = Counter("sgw_resumes_total", "Sandbox resumes (wakes) by pool and outcome", ["pool", "outcome"],
                               registry=r)
        self.wake_seconds = Histogram(
            "sgw_wake_seconds", "Time a request was held for its suspended sandbox, from its arrival to the "
            "resumed sandbox being ready", ["pool"], buckets=_WAKE_BUCKETS, registry=r)
        self.wake_held = Gauge("sgw_wake_waiting", "Requests held while their sandbox wakes", ["pool"], registry=r,
                                  multiprocess_mode="livesum")
        self.capacity_rejections = Counter(
            "sgw_capacity_rejections_total",
            "Requests refused at a cap or a tenant limit (org_rate, org_streams, max_body, ws_message)", ["scope"],
            registry=r)
        self.connections_refused = Counter(
            "sgw_connections_refused_total", "Connections refused at a listener's bound (gateway/gate.py), by "
            "listener (data, grpc) and bound (max_connections, max_connections_per_client)", ["listener", "bound"],
            registry=r)
        self.connections_shed = Counter(
            "sgw_connections_shed_total", "Idle connections closed at a full listener to admit a connection from an "
            "address holding fewer (gateway/gate.py), by listener (data, grpc)", ["listener"], registry=r)
        self.head_timeouts = Counter(
            "sgw_head_timeouts_total", "Data-plane client connections closed for no complete request head within "
            "header_read_timeout (a slowloris, or a connection that never sent one)", registry=r)
        self.reaps = Counter("sgw_reaps_total", "Sandboxes destroyed by reason", ["reason"], registry=r)
        self.sweeps = Counter("sgw_orphan_sweeps_total", "Orphaned provider objects deleted", ["reason"], registry=r)
        self.reap_rate = Gauge("sgw_reap_rate", "Sandboxes the last reaper pass that found work acted on (destroyed or "
                               "suspended) per second", registry=r, multiprocess_mode="max")
        self.route_cache_lookups = Counter("sgw_route_cache_total", "Route cache lookups", ["result"], registry=r)
        self.store_errors = Counter("sgw_store_errors_total", "Session store failures", ["op"], registry=r)
        self.store_latency = Histogram("sgw_store_latency_seconds", "Session store call latency", ["op"],
                                       buckets=_STORE_BUCKETS, registry=r)
        self.in_flight = Gauge("sgw_in_flight_requests", "Data-plane requests in progress", registry=r,
                               multiprocess_mode="livesum")
        self.open_streams = Gauge("sgw_open_streams", "Open WebSocket and SSE streams", registry=r,
                                  multiprocess_mode="livesum")
        self.security_denials = Counter("sgw_security_denials_total", "Requests denied for isolation or auth",
                                        ["reason"], registry=r)
        # Kubernetes API calls (gateway/providers/kubernetes_calls.py): code is the HTTP status or "error".
        self.kube_requests = Counter("sgw_kube_requests_total", "Kubernetes API calls by verb, resource and code",
                                     ["verb", "resource", "code"], registry=r)
        self.kube_latency = Histogram("sgw_kube_request_duration_seconds", "Kubernetes API call latency",
                                      ["verb", "resource"], buckets=_STORE_BUCKETS[4:] + (2.5, 5, 10, 30), registry=r)
        self.kube_watch_restarts = Counter("sgw_kube_watch_restarts_total",
                                           "Shared Kubernetes watches restarted, by reason (closed, expired, dropped, "
                                           "error)", ["reason"], registry=r)
        for reason in REAP_REASONS:
            self.reaps.labels(reason)
        for reason in ORPHAN_SWEEP_REASONS:
            self.sweeps.labels(reason)
        # Resolved once; the route cache is consulted on every data-plane request, so its
        # counts are kept as plain ints and folded in per loop iteration (see fold_soon).
        self._cache_hit = self.route_cache_lookups.labels("hit")
        self._cache_miss = self.route_cache_lookups.labels("miss")
        self._lookups = CacheLookups(self)
        # RouterEvents.route_cache: the counter's own method, so that a hit (every request routed from the
        # cache) is a call into compiled code that adds to a C integer, not a method of this class.
        self.route_cache: Callable[[bool], None] = self._lookups.count
        self._children: dict[tuple[Any, ...], Any] = {}  # see labelled()
        self._folds: list[Callable[[], None]] = [self._fold_cache]
        self._fold_pending = False
        self.per_org = per_org
        self._org_limit = org_label_limit
        self._orgs: set[str] = set()
        self.org_requests = Counter("sgw_org_requests_total", "Data-plane requests per org (when enabled)",
                                    ["org", "status"], registry=r)

    def org_label(self, org_id: str | None) -> str:
        """The org as a label value, folding orgs past the limit into ``other``."""
        org = org_id if org_id is not None else "personal"
        if org in self._orgs:
            return org
        if len(self._orgs) < self._org_limit:
            self._orgs.add(org)
            return org
        return "other"

    # batching -------------------------------------------------------------
    def add_fold(self, fold: Callable[[], None]) -> None:
        """Register a batch's ``fold`` (it adds what it collected to the series) with ``fold_soon``."""
        self._folds.append(fold)

    def fold_soon(self) -> None:
        """With workers (multiprocess mode), fold every batch once this event-loop iteration's callbacks
        have run: a scrape answered by another worker reads this one's values from the shared files.
        One process alone folds at its scrape (``exposition``) and nothing else reads its series."""
        if self._fold_pending or not self._multiprocess_dir:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._fold_pending = True
        loop.call_soon(self.fold)

    def fold(self) -> None:
        self._fold_pending = False
        for fold in self._folds:
            fold()

    def _fold_cache(self) -> None:
        lookups = self._lookups
        if lookups.hits:
            self._cache_hit.inc(lookups.hits)
            lookups.hits = 0
        if lookups.misses:
            self._cache_miss.inc(lookups.misses)
            lookups.misses = 0

    def provisioned(self, pool: str, seconds: float, outcome: str) -> None:
        self.provisions.labels(pool, outcome).inc()
        if outcome == "ready":
            self.provision_duration.labels(pool).observe(seconds)

    def capacity_rejected(self, scope: str) -> None:
        self.capacity_rejections.labels(scope).inc()

    def connection_refused(self, listener: str, bound: str) -> None:
        labelled(self._children, self.connections_refused, listener, bound).inc()

    def connection_shed(self, listener: str) -> None:
        labelled(self._children, self.connections_shed, listener).inc()

    def heads_overdue(self, count: int) -> None:
        self.head_timeouts.inc(count)

    def reaped(self, reason: str) -> None:
        if reason == "orphan":
            self.sweeps.labels("no_store_record").inc()
        else:
            self.reaps.labels(reason).inc()

    def denied(self, reason: str) -> None:
        self.security_denials.labels(reason).inc()

    def suspended(self, pool: str, outcome: str) -> None:
        self.suspends.labels(pool, outcome).inc()

    def resumed(self, pool: str, outcome: str) -> None:
        self.resumes.labels(pool, outcome).inc()

    def wake_waiting(self, pool: str, delta: int) -> None:
        self.wake_held.labels(pool).inc(delta)

    def woken(self, pool: str, seconds: float) -> None:
        self.wake_seconds.labels(pool).observe(seconds)

    def kube_request(self, verb: str, resource: str, code: str, seconds: float) -> None:
        self.kube_requests.labels(verb, resource, code).inc()
        self.kube_latency.labels(verb, resource).observe(seconds)

    def store_call(self, op: str) -> tuple[Callable[[float], None], Callable[[], None]]:
        """What a store call ``op`` reports into (``gateway.store.instrumented``): its latency, its failures."""
        return self.store_latency.labels(op).observe, self.store_errors.labels(op).inc

    def kube_watch_restart(self, reason: str) -> None:
        self.kube_watch_restarts.labels(reason).inc()

    def reap_pass(self, acted: int, seconds: float) -> None:
        self.reap_rate.set(acted / seconds if seconds > 0 else acted)

    def exposition(self) -> tuple[bytes, str]:
        self.fold()
        if self._multiprocess_dir:  # unset or empty: this process alone
            aggregate = CollectorRegistry()
            multiprocess.MultiProcessCollector(aggregate, path=self._multiprocess_dir)
            return generate_latest(aggregate), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class CacheLookups:
    """The route cache's hits and misses since the last fold (``Metrics.route_cache`` is :meth:`count`),
    added to ``sgw_route_cache_total`` by ``Metrics``' fold. Compiled, counting is a C call and a C
    integer: it runs for every request the route cache answers."""

    __slots__ = ("hits", "misses", "metrics", "multiprocess")

    def __init__(self, metrics: Metrics) -> None:
        self.hits = 0
        self.misses = 0
        self.metrics = metrics
        self.multiprocess = bool(metrics._multiprocess_dir)  # fixed when Metrics is made

    def count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1
        if self.multiprocess and not self.metrics._fold_pending:  # (fold_soon's own test, without a call per request)
            self.metrics.fold_soon()


class Batch:
    """One series' requests since the last fold: how many, their summed duration, and how many fell in each
    histogram bucket (an extension type in the compiled build: the count and the sum are C numbers, added
    to without a Python object made per request)."""

    __slots__ = ("count", "total", "buckets")

    def __init__(self, size: int) -> None:
        self.count = 0
        self.total = 0.0
        self.buckets = [0] * size


class RequestMetrics:
    """Counts each finished data-plane request: the data plane's ``on_request`` callback.

    Called once per request on the hot path, so a request is only added to a batch (a count, a
    duration sum and a histogram bucket count per (pool, protocol, status)), and the batch is
    folded into the Prometheus series as one ``inc(n)`` per series instead of locked increments
    per request. How scrapes stay exact: one process folds when it is scraped
    (``Metrics.exposition`` folds first), so every request finished before the scrape is in it.
    With ``--workers N`` the scrape reads every worker's values from prometheus-client's
    multiprocess files, so each worker folds at the end of the loop iteration in which a batch
    opened (``Metrics.fold_soon``, a call_soon): a request another worker finished shows once that
    worker's current callbacks have run, one loop iteration after its response was written.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._bounds = tuple(_LATENCY_BUCKETS) + (float("inf"),)
        self._series: dict[tuple[str | None, str, int], tuple[Any, Any]] = {}
        self._batch: dict[tuple[str | None, str, int], Batch] = {}
        self._per_org = metrics.per_org  # fixed when Metrics is made: read once, not per request
        metrics.add_fold(self.fold)

    def record(self, entry: Any) -> None:
        """``entry`` is a ``gateway.proxy.RequestLog``."""
        key = (entry.pool, entry.protocol, entry.status)
        duration = entry.duration
        batch = self._batch.get(key)
        if batch is None:
            batch = self._batch[key] = Batch(len(self._bounds))
            self._metrics.fold_soon()
        batch.count += 1
        batch.total += duration
        buckets = batch.buckets
        buckets[_bucket(self._bounds, duration)] += 1
        code = entry.code
        if entry.error or entry.refused or (code is not None and code in DENIAL_CODES) or self._per_org:
            self._rare(entry)

    def _rare(self, entry: Any) -> None:
        m = self._metrics
        if entry.error:
            m.upstream_errors.labels(entry.error).inc()
        if entry.refused:
            m.capacity_rejected(entry.refused)
        if entry.code in DENIAL_CODES:
            m.denied(entry.code)
        if m.per_org:
            m.org_requests.labels(m.org_label(entry.org_id), status_class(entry.status)).inc()

    def fold(self) -> None:
        """Add the batch to the series (each label child resolved once, then kept)."""
        batches, self._batch = self._batch, {}
        m = self._metrics
        for key, batch in batches.items():
            children = self._series.get(key)
            if children is None:
                pool, protocol, status = key
                pool = pool or "none"
                children = self._series[key] = (m.requests.labels(pool, protocol, status_class(status)),
                                                m.request_duration.labels(pool, protocol))
            children[0].inc(batch.count)
            observe_many(children[1], self._bounds, batch.count, batch.total, batch.buckets)


def _bucket(bounds: tuple[float, ...], value: float) -> int:
    """Histogram.observe's bucket for ``value``: the index of the first of ``bounds`` >= it (``bisect_left``;
    the last bound is +Inf). A scan from the first: a request's duration is in the first few (compiled, a C
    loop instead of a call)."""
    last = len(bounds) - 1
    i = 0
    while i < last:
        bound = bounds[i]
        if value <= bound:
            break
        i += 1
    return i


def observe_many(histogram: Any, bounds: tuple[float, ...], count: int, total: float, buckets: list[int]) -> None:
    """Add ``count`` observations to a histogram child at once: their ``total``, and how many fell in each of
    ``bounds`` (``buckets[i]``: those whose first bound >= them is ``bounds[i]``, as ``observe`` places them;
    ``bisect_left(bounds, value)``)."""
    if hasattr(histogram, "_buckets") and hasattr(histogram, "_sum"):
        # prometheus-client has no bulk observe: add to the child's bucket and sum values as
        # observe() does, n at a time (in multiprocess mode these are the mmapped values).
        histogram._sum.inc(total)
        for index, n in enumerate(buckets):
            if n:
                histogram._buckets[index].inc(n)
    else:  # a prometheus-client without those internals: the buckets stay exact, the sum approximate
        for bound, n in zip(bounds, buckets):
            for _ in range(n):
                histogram.observe(min(bound, total / count))
