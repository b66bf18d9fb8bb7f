"""The gRPC front with grpcio's client (a second, independent HTTP/2 and gRPC implementation), byte for byte.

Each call runs direct to the sandbox and through the gateway and must give the
same messages, initial metadata, trailers, status code and details.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
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


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with cryptography (a PyJWT[crypto] dependency)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-gateway test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "grpc.crt", directory / "grpc.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


async def test_tls_when_a_certificate_is_configured(sandbox, tmp_path):
    _, port = sandbox
    cert, key = _self_signed(tmp_path)
    policy = static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)
    async with grpc_gateway(tmp_path, policy, grpc_tls_cert_file=cert, grpc_tls_key_file=key) as gw:
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        async with grpc.aio.secure_channel("127.0.0.1:%d" % gw.grpc_address[1], credentials) as front:
            got = await call_kind(front, "bidi", "/test.Echo/Bidi", [b"over", b"tls"])
        async with grpc.aio.insecure_channel("127.0.0.1:%d" % gw.grpc_address[1]) as plain:
            refused = await call_kind(plain, "unary", "/test.Echo/Unary", [b"x"], timeout=2)
    assert got["code"] == grpc.StatusCode.OK and got["messages"] == [b"revo", b"slt"]
    assert refused["code"] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
