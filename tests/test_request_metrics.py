"""RequestMetrics folds requests into the Prometheus series in batches: the exposition must read exactly
as if each request had been observed on its own."""

from __future__ import annotations

import asyncio
import re

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import _LATENCY_BUCKETS, Metrics, RequestMetrics
from gateway.proxy import RequestLog

DURATIONS = [0.0001, 0.0005, 0.00050001, 0.001, 0.003, 0.7, 2.5, 31.0, 0.0, 10]  # bounds, between, past the last


def record(pool: str | None, status: int, duration: float) -> RequestLog:
    return RequestLog("GET", pool, "ses-x", status, duration, 0, 0, "http", "r", None)


def samples(text: str, prefix: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line.startswith(prefix) and not line.startswith(prefix + "_created")}


def direct_exposition(entries: list[RequestLog]) -> str:
    """The same requests, observed one by one the plain prometheus-client way."""
    r = CollectorRegistry()
    requests = Counter("sgw_requests_total", "", ["pool", "protocol", "status"], registry=r)
    duration = Histogram("sgw_request_duration_seconds", "", ["pool", "protocol"], buckets=_LATENCY_BUCKETS,
                         registry=r)
    for e in entries:
        requests.labels(e.pool or "none", e.protocol, f"{e.status // 100}xx").inc()
        duration.labels(e.pool or "none", e.protocol).observe(e.duration)
    return generate_latest(r).decode()


async def test_batched_series_equal_one_by_one_observation(tmp_path):
    metrics = Metrics(multiprocess_dir=str(tmp_path))  # workers: batches fold per loop iteration
    batcher = RequestMetrics(metrics)
    entries = [record(pool, status, d) for pool in ("small", None) for status in (200, 404) for d in DURATIONS]
    for e in entries[:7]:
        batcher.record(e)
    small_2xx = {"pool": "small", "protocol": "http", "status": "2xx"}
    assert metrics.registry.get_sample_value("sgw_requests_total", small_2xx) is None
    await asyncio.sleep(0)  # one loop iteration: the batch is folded without a scrape
    assert metrics.registry.get_sample_value("sgw_requests_total", small_2xx) == 7.0
    metrics._multiprocess_dir = None  # the rest as one process: folded at the scrape
    for e in entries[7:]:
        batcher.record(e)
    got = metrics.exposition()[0].decode()  # folds what is pending first: a scrape is exact
    want = direct_exposition(entries)
    for prefix in ("sgw_requests_total", "sgw_request_duration_seconds"):
        got_samples, want_samples = samples(got, prefix), samples(want, prefix)
        assert got_samples.keys() == want_samples.keys()
        for key, value in want_samples.items():  # counts exact; a sum only up to the order of float additions
            assert got_samples[key] == (pytest.approx(value, rel=1e-12) if "_sum{" in key else value), key
    assert re.search(r'sgw_request_duration_seconds_count\{pool="none",protocol="http"\} 20\.0', got)


async def test_route_cache_counts_fold_per_iteration_with_workers(tmp_path):
    metrics = Metrics(multiprocess_dir=str(tmp_path))
    for hit in (True, True, False):
        metrics.route_cache(hit)
    assert metrics.registry.get_sample_value("sgw_route_cache_total", {"result": "hit"}) == 0.0
    await asyncio.sleep(0)
    assert metrics.registry.get_sample_value("sgw_route_cache_total", {"result": "hit"}) == 2.0
    assert metrics.registry.get_sample_value("sgw_route_cache_total", {"result": "miss"}) == 1.0


async def test_one_process_folds_at_the_scrape():
    metrics = Metrics()
    metrics.route_cache(True)
    await asyncio.sleep(0)
    assert 'sgw_route_cache_total{result="hit"} 1.0' in metrics.exposition()[0].decode()


async def test_grpc_calls_batched_equal_one_by_one_observation(tmp_path):
    """The gRPC front's calls are batched as the data plane's requests are: per loop iteration with workers,
    at the scrape alone; the open-calls gauge follows the calls begun and ended."""
    from gateway.grpcfront.metrics import GrpcMetrics

    metrics = Metrics(multiprocess_dir=str(tmp_path))
    grpc = GrpcMetrics(metrics.registry, batching=metrics)
    calls = [("/a.B/C", code, d) for code in (0, 5) for d in DURATIONS]
    for _ in calls:
        grpc.started()
    for path, code, seconds in calls[:3]:
        grpc.observe(path, code, seconds, 1, 2)
    ok = {"method": "/a.B/C", "code": "OK"}
    assert metrics.registry.get_sample_value("sgw_grpc_calls_total", ok) is None
    await asyncio.sleep(0)  # one loop iteration: folded without a scrape
    assert metrics.registry.get_sample_value("sgw_grpc_calls_total", ok) == 3.0
    assert metrics.registry.get_sample_value("sgw_grpc_open_calls") == len(calls) - 3
    metrics._multiprocess_dir = None  # the rest as one process: folded at the scrape
    for path, code, seconds in calls[3:]:
        grpc.observe(path, code, seconds, 1, 2)
    got = metrics.exposition()[0].decode()
    r = CollectorRegistry()
    direct = GrpcMetrics(r)  # no batching: each call folded as it ends
    for path, code, seconds in calls:
        direct.started()
        direct.observe(path, code, seconds, 1, 2)
    want = generate_latest(r).decode()
    for prefix in ("sgw_grpc_calls_total", "sgw_grpc_call_duration_seconds", "sgw_grpc_messages_total",
                   "sgw_grpc_open_calls"):
        got_samples, want_samples = samples(got, prefix), samples(want, prefix)
        assert got_samples.keys() == want_samples.keys() and want_samples, prefix
        for key, value in want_samples.items():
            assert got_samples[key] == (pytest.approx(value, rel=1e-12) if "_sum{" in key else value), key
    assert 'sgw_grpc_messages_total{direction="to_client"} 40.0' in got and "sgw_grpc_open_calls 0.0" in got
