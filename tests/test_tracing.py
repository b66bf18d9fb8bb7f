"""OpenTelemetry tracing across the hop (issue #32.9).

The spans travel the real wire: the gateway's OTLP/HTTP exporter posts protobuf to an aiohttp
receiver in this process, decoded with opentelemetry-proto's ``ExportTraceServiceRequest``. Real
redis-server, real local sandboxes (bubblewrap), a real in-process gateway and data plane.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.app import Gateway, build_providers
from gateway.logs import AccessLog
from gateway.metrics import Metrics
from gateway.policy import load_policy
from gateway.providers.confine import Bubblewrap
from gateway.providers.local import LocalProvider
from gateway.proxy import RequestLog
from gateway.settings import Settings
from gateway.store.instrumented import InstrumentedStore
from gateway.store.redis import RedisStore
from gateway.tracing import Tracer
from tests.grpc_helpers import UNARY, RawCodec, echo_server, grpc_gateway, ident, static_policy
from tests.proxy_helpers import listening_socket
from tests.redis_server import RedisServer

POLICY = """
pools:
  small: {idle_timeout: 1h, on_idle: suspend, retention: 2h}
  shared: {idle_timeout: 1h, on_idle: suspend, retention: 2h}
"""
ALICE = {"X-Org-Id": "acme", "X-User-Id": "alice", "X-Session-Id": "s1"}


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf bodies, spans kept by trace ID."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.arrived = asyncio.Event()
        self.content_types: set[str] = set()

    async def traces(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {}
                    for a in span.attributes:
                        value = a.value
                        attributes[a.key] = value.int_value if value.HasField("int_value") else value.string_value
                    self.spans.append({
                        "service": service, "name": span.name, "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                        "ms": (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6,
                        "attributes": attributes, "kind": span.kind,
                    })
        self.arrived.set()
        return web.Response(content_type="application/x-protobuf", body=b"")

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        return [span for span in self.spans if span["trace_id"] == trace_id]

    async def wait_for(self, trace_id: str, count: int) -> list[dict[str, Any]]:
        async with asyncio.timeout(30):
            while len(self.trace(trace_id)) < count:
                self.arrived.clear()
                await self.arrived.wait()
        return self.trace(trace_id)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    made = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", made.traces)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = listening_socket()
    await web.SockSite(runner, sock).start()
    try:
        yield made, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def traced(tmp_path: Path, redis_server: RedisServer, receiver: tuple[Receiver, str]
                 ) -> AsyncIterator[tuple[Gateway, Receiver]]:
    spans, endpoint = receiver
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    data_dir = (tmp_path / "data").absolute()
    prefix = f"trace-{uuid.uuid4().hex[:8]}"
    settings = Settings(data_dir=data_dir, redis_url=redis_server.url, redis_prefix=prefix, local_disk_quota_bytes=0,
                        replica_id="r0", policy_file=policy_file, reap_interval=3600.0, access_log=False,
                        tracing_otlp_endpoint=endpoint)
    loaded = load_policy(settings)
    metrics = Metrics()
    store = InstrumentedStore(RedisStore(redis_server.url, prefix, "r0"), metrics)
    gateway = Gateway(settings, loaded, store, build_providers(settings, loaded), metrics)
    await gateway.start(listening_socket(), listening_socket())
    try:
        yield gateway, spans
    finally:
        await gateway.stop()
        cleanup = LocalProvider(data_dir, stop_on_close=True, confinement=Bubblewrap(data_dir))
        await cleanup.start(lambda _sandbox_id: None)
        await cleanup.close()


async def call(gateway: Gateway, path: str, headers: dict[str, str], method: str = "GET"
               ) -> tuple[int, dict[str, Any] | None]:
    assert gateway.data_address is not None
    async with aiohttp.ClientSession() as http, http.request(
            method, f"http://127.0.0.1:{gateway.data_address[1]}{path}", headers=headers) as response:
        body = await response.read()
        return response.status, json.loads(body) if response.content_type == "application/json" else None


def by_name(spans: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    named = {span["name"]: span for span in spans}
    assert len(named) == len(spans), spans  # one span of each name per request
    return named


def sent_traceparent(body: dict[str, Any] | None) -> tuple[str, str]:
    """The trace and parent span IDs of the traceparent the sandbox received."""
    assert body is not None
    headers = {name.lower(): value for name, value in body["headers"].items()}
    version, trace_id, parent, flags = headers["traceparent"].split("-")
    assert (version, flags) == ("00", "01")
    return trace_id, parent


async def test_cold_warm_wake_and_refusal_are_traced_over_otlp(traced: tuple[Gateway, Receiver],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    gateway, receiver = traced
    tracer = gateway.data_plane.tracer
    assert isinstance(tracer, Tracer)

    # Cold start, continuing the client's trace.
    client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
    status, body = await call(gateway, "/echo", {**ALICE, "traceparent": f"00-{client_trace}-{client_span}-01"})
    assert status == 200, body
    got_trace, got_parent = sent_traceparent(body)
    assert got_trace == client_trace and got_parent != client_span
    cold = by_name(await receiver.wait_for(client_trace, 4))
    assert set(cold) == {"http.request", "sandbox.resolve", "sandbox.provision", "sandbox.upstream"}
    request, resolve, provision, upstream = (cold[n] for n in ("http.request", "sandbox.resolve",
                                                                "sandbox.provision", "sandbox.upstream"))
    assert request["parent"] == client_span and request["service"] == "sandbox-gateway"
    assert resolve["parent"] == request["span_id"] and upstream["parent"] == request["span_id"]
    assert provision["parent"] == resolve["span_id"]
    assert upstream["span_id"] == got_parent  # the sandbox continues the upstream span
    sandbox_id = body["sandbox_id"]  # type: ignore[index]
    assert request["attributes"] == {
        "http.request.method": "GET", "request.id": request["attributes"]["request.id"], "sandbox.id": sandbox_id,
        "sandbox.pool": provision["attributes"]["sandbox.pool"], "org.id": "acme", "http.response.status_code": 200, "outcome": "ok"}
    assert provision["attributes"]["outcome"] == "ready" and provision["attributes"]["sandbox.id"] == sandbox_id
    assert provision["ms"] <= resolve["ms"] <= request["ms"] and upstream["ms"] <= request["ms"]
    assert "alice" not in json.dumps(cold) and "s1" not in json.dumps(cold)  # no user or session IDs
    print("cold start:", {name: f"{span['ms']:.1f} ms" for name, span in cold.items()})

    # Warm: the route cached, a pooled connection idle; a trace started by the gateway.
    status, body = await call(gateway, "/echo", ALICE)
    assert status == 200
    warm_trace, warm_parent = sent_traceparent(body)
    assert warm_trace != client_trace
    warm = by_name(await receiver.wait_for(warm_trace, 2))
    assert set(warm) == {"http.request", "sandbox.upstream"}
    assert warm["http.request"]["parent"] == "" and warm["sandbox.upstream"]["span_id"] == warm_parent

    # Not sampled (the client's flag is kept): served, the context passed on, nothing exported.
    unsampled = secrets.token_hex(16)
    status, body = await call(gateway, "/echo", {**ALICE, "traceparent": f"00-{unsampled}-{secrets.token_hex(8)}-00"})
    assert status == 200
    headers = {name.lower(): value for name, value in body["headers"].items()}  # type: ignore[index]
    assert headers["traceparent"].startswith(f"00-{unsampled}-") and headers["traceparent"].endswith("-00")

    # Wake: suspended through the control API, woken by the next request.
    assert gateway.control_address is not None
    async with aiohttp.ClientSession() as http, http.post(
            f"http://127.0.0.1:{gateway.control_address[1]}/v1/sandboxes/{sandbox_id}/suspend?force=true") as response:
        assert response.status == 200, await response.text()
    status, body = await call(gateway, "/echo", ALICE)
    assert status == 200
    wake_trace, _ = sent_traceparent(body)
    woken = by_name(await receiver.wait_for(wake_trace, 4))
    assert set(woken) == {"http.request", "sandbox.resolve", "sandbox.wake", "sandbox.upstream"}
    assert woken["sandbox.wake"]["parent"] == woken["sandbox.resolve"]["span_id"]
    assert woken["sandbox.wake"]["attributes"]["outcome"] == "ready"

    # Refusal: no identity (trusted headers: 400); the client's trace is continued, nothing reaches a sandbox.
    refused_trace = secrets.token_hex(16)
    status, _ = await call(gateway, "/echo", {"traceparent": f"00-{refused_trace}-{secrets.token_hex(8)}-01"})
    assert status == 400
    refused = by_name(await receiver.wait_for(refused_trace, 1))
    assert set(refused) == {"http.request"}
    attributes = refused["http.request"]["attributes"]
    print("refusal:", attributes)
    assert attributes["http.response.status_code"] == 400 and attributes["outcome"] == "invalid_identity"
    assert "sandbox.id" not in attributes
    assert receiver.content_types == {"application/x-protobuf"}
    assert receiver.trace(unsampled) == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_tracing_is_off_by_default_and_then_loads_nothing() -> None:
    assert Settings().tracing_otlp_endpoint is None
    assert Tracer.from_settings(Settings()) is None


def test_the_access_line_carries_the_trace_id() -> None:
    for json_lines in (False, True):
        stream = io.StringIO()
        log = AccessLog(stream, json_lines=json_lines)
        trace_id = secrets.token_hex(16)
        log.log(RequestLog("GET", "small", "sb-1", 200, 0.01, 0, 2, "http", "r-1", None, trace_id=trace_id))
        log.log(RequestLog("GET", "small", "sb-1", 200, 0.01, 0, 2, "http", "r-2", None))
        log.flush()
        traced, untraced = stream.getvalue().splitlines()
        if json_lines:
            assert json.loads(traced)["trace_id"] == trace_id and "trace_id" not in json.loads(untraced)
        else:
            assert traced.endswith(f" trace_id={trace_id}") and "trace_id" not in untraced


async def test_a_grpc_call_is_traced_and_the_sandbox_gets_its_traceparent(
        tmp_path: Path, receiver: tuple[Receiver, str]) -> None:
    spans, endpoint = receiver
    async with echo_server() as (sandbox, port), grpc_gateway(
            tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port),
            tracing_otlp_endpoint=endpoint, access_log=False) as gateway:
        assert gateway.grpc_address is not None
        channel = Channel(*gateway.grpc_address, codec=RawCodec())
        try:
            client_trace, client_span = secrets.token_hex(16), secrets.token_hex(8)
            async with channel.request("/test.Echo/Unary", UNARY, bytes, bytes, metadata=ident(
                    traceparent=f"00-{client_trace}-{client_span}-01")) as stream:
                await stream.send_message(b"hi", end=True)
                assert await stream.recv_message() == b"hi"
            # Refused: no identity (UNAUTHENTICATED), in a trace of its own.
            with pytest.raises(GRPCError) as refused:
                async with channel.request("/test.Echo/Unary", UNARY, bytes, bytes, metadata={}) as stream:
                    await stream.send_message(b"hi", end=True)
                    await stream.recv_message()
            assert refused.value.status is Status.UNAUTHENTICATED
        finally:
            channel.close()
        version, trace_id, parent, flags = sandbox.seen[-1]["traceparent"].split("-")
        assert (version, trace_id, flags) == ("00", client_trace, "01") and parent != client_span
        call = by_name(await spans.wait_for(client_trace, 4))
        assert set(call) == {"grpc.call", "sandbox.resolve", "sandbox.provision", "sandbox.upstream"}
        assert call["grpc.call"]["parent"] == client_span and call["sandbox.upstream"]["span_id"] == parent
        assert call["sandbox.resolve"]["parent"] == call["grpc.call"]["span_id"]
        assert call["sandbox.provision"]["parent"] == call["sandbox.resolve"]["span_id"]
        assert call["grpc.call"]["attributes"]["rpc.grpc.status_code"] == 0
        assert call["grpc.call"]["attributes"]["outcome"] == "ok"
        await asyncio.to_thread(gateway.data_plane.tracer.flush)
        async with asyncio.timeout(30):
            while not any(s["name"] == "grpc.call" and s["attributes"].get("rpc.grpc.status_code") == 16
                          for s in spans.spans):
                spans.arrived.clear()
                await spans.arrived.wait()
