"""The gRPC front with grpcio's client (a second, independent HTTP/2 and gRPC implementation), byte for byte.

Each call runs direct to the sandbox and through the gateway and must give the
same messages, initial metadata, trailers, status code and details.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
import pytest

from tests.grpc_helpers import echo_server, grpc_gateway, ident, static_policy

OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024), ("grpc.max_send_message_length", 64 * 1024 * 1024)]


@pytest.fixture
async def sandbox():
    async with echo_server() as (service, port):
        yield service, port


@pytest.fixture
async def channels(sandbox, tmp_path):
    _, port = sandbox
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], port)) as gw:
        host, gport = gw.grpc_address
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as direct, \
                grpc.aio.insecure_channel(f"{host}:{gport}", options=OPTIONS) as front:
            yield direct, front


def _md(metadata: Any) -> list[tuple[str, Any]]:
    return sorted((k, v) for k, v in (metadata or ()) if k not in ("date", "user-agent"))


async def observe(call: Any, messages: list[bytes] | None = None) -> dict[str, Any]:
    received: list[bytes] = []
    try:
        if hasattr(call, "__aiter__"):
            async for message in call:
                received.append(message)
        else:
            received.append(await call)
    except grpc.aio.AioRpcError:
        pass
    return {"messages": received, "code": await call.code(), "details": await call.details(),
            "initial": _md(await call.initial_metadata()), "trailing": _md(await call.trailing_metadata())}


async def call_kind(channel: grpc.aio.Channel, kind: str, path: str, messages: list[bytes],
                    metadata: list[tuple[str, Any]] | None = None, timeout: float | None = None) -> dict[str, Any]:
    md = metadata if metadata is not None else list(ident().items())
    if kind == "unary":
        return await observe(channel.unary_unary(path)(messages[0], metadata=md, timeout=timeout))
    if kind == "client":
        async def source():
            for m in messages:
                yield m
        return await observe(channel.stream_unary(path)(source(), metadata=md, timeout=timeout))
    if kind == "server":
        return await observe(channel.unary_stream(path)(messages[0], metadata=md, timeout=timeout))

    async def source():
        for m in messages:
            yield m
    return await observe(channel.stream_stream(path)(source(), metadata=md, timeout=timeout))


CASES = [
    pytest.param("unary", "/test.Echo/Unary", [b"\x00hello\xff"], id="unary"),
    pytest.param("client", "/test.Echo/ClientStream", [b"a", b"", b"c" * 70_000], id="client streaming"),
    pytest.param("server", "/test.Echo/ServerStream", [b"300:512"], id="server streaming"),
    pytest.param("bidi", "/test.Echo/Bidi", [b"one", b"two", bytes(range(256)) * 400], id="bidi"),
    pytest.param("unary", "/test.Echo/Fail", [b"x"], id="sandbox error status"),
    pytest.param("unary", "/test.Echo/Nope", [b"x"], id="unimplemented method"),
    pytest.param("unary", "/test.Echo/Meta", [json.dumps({"status": 9, "message": "precondition: é"}).encode()],
                 id="metadata, trailers and a status message"),
]


@pytest.mark.parametrize(("kind", "path", "messages"), CASES)
async def test_byte_exact_against_direct(channels, kind, path, messages):
    direct, front = channels
    expected = await call_kind(direct, kind, path, messages)
    got = await call_kind(front, kind, path, messages)
    if path == "/test.Echo/Meta":  # the body echoes the request metadata, which differs by design
        expected.pop("messages"), got.pop("messages")
        assert ("x-trailer", "two") in got["trailing"] and ("x-blob-bin", b"\x00\xffinit") in got["initial"]
    assert got == expected


async def test_server_stream_of_10000_messages(channels):
    direct, front = channels
    got = await call_kind(front, "server", "/test.Echo/ServerStream", [b"10000:64"])
    assert len(got["messages"]) == 10_000 and got == await call_kind(direct, "server", "/test.Echo/ServerStream",
                                                                     [b"10000:64"])


async def test_a_16_mb_message(channels):
    direct, front = channels
    big = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    got = await call_kind(front, "unary", "/test.Echo/Unary", [big])
    assert got["code"] == grpc.StatusCode.OK and got["messages"] == [big]


async def test_a_100ms_deadline_is_deadline_exceeded_and_cancels_the_sandbox(channels, sandbox):
    service, _ = sandbox
    _, front = channels
    got = await call_kind(front, "unary", "/test.Echo/Slow", [b"x"], timeout=0.1)
    assert got["code"] == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(service.cancelled.wait(), 10)


async def test_client_cancellation_reaches_the_sandbox(channels, sandbox):
    service, _ = sandbox
    _, front = channels
    call = front.unary_unary("/test.Echo/Slow")(b"x", metadata=list(ident().items()))
    await asyncio.wait_for(service.slow_started.wait(), 10)
    call.cancel()
    await asyncio.wait_for(service.cancelled.wait(), 10)


async def test_no_identity_is_unauthenticated(channels):
    _, front = channels
    got = await call_kind(front, "unary", "/test.Echo/Unary", [b"x"], metadata=[])
    assert got["code"] == grpc.StatusCode.UNAUTHENTICATED


async def test_sandbox_down_is_unavailable(tmp_path):
    async with echo_server() as (_, port):
        pass
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)) as gw:
        async with grpc.aio.insecure_channel("%s:%d" % gw.grpc_address) as front:
            got = await call_kind(front, "unary", "/test.Echo/Unary", [b"x"])
    assert got["code"] == grpc.StatusCode.UNAVAILABLE and "upstream_unreachable" in got["details"]
