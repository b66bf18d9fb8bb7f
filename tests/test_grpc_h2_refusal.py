"""An HTTP/2 prior-knowledge client on the HTTP/1.1 data plane is told, in HTTP/2, where gRPC goes."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from tests.grpc_helpers import grpc_gateway, static_policy

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + an empty SETTINGS


@pytest.fixture
async def gateway(tmp_path):
    async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], 1)) as gw:
        yield gw


async def test_the_preface_gets_goaway_http_1_1_required_with_the_json_error(gateway):
    reader, writer = await asyncio.open_connection(*gateway.data_address)
    writer.write(PREFACE)
    answer = await asyncio.wait_for(reader.read(), 10)  # until the gateway's FIN
    writer.close()
    await writer.wait_closed()
    assert answer[:9] == b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # the server preface: SETTINGS, empty
    length, kind = int.from_bytes(answer[9:12], "big"), answer[12]
    assert kind == 7 and int.from_bytes(answer[18:22], "big") == 0  # GOAWAY, last stream 0
    assert int.from_bytes(answer[22:26], "big") == 0xD  # HTTP_1_1_REQUIRED
    error = json.loads(answer[26:18 + length])["error"]
    assert error["code"] == "http2_not_supported" and f"port {gateway.grpc_address[1]}" in error["message"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_http2_prior_knowledge(gateway):
    host, port = gateway.data_address
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-v", "--http2-prior-knowledge", f"http://{host}:{port}/", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert "GOAWAY, error=13" in err.decode()  # curl names HTTP_1_1_REQUIRED's code; "Pause on PRI" is gone


async def test_http_1_1_on_the_same_port_still_works(gateway):
    reader, writer = await asyncio.open_connection(*gateway.data_address)
    writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    await writer.wait_closed()
    assert head.startswith(b"HTTP/1.1 400")  # no identity: the data plane's own JSON error, as before
