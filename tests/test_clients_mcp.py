"""The official MCP Python SDK (``mcp``) through the gateway to an MCP server that runs as the sandbox.

The server (tests/mcp_sandbox.py) is a real process on its own port, the upstream of a static pool.
``mcp`` 2.3 speaks both protocols: 2026-07-28 (stateless single exchanges: no ``Mcp-Session-Id``,
``MCP-Protocol-Version``/``Mcp-Method``/``Mcp-Name`` on every POST) and the handshake era
(2025-11-25: ``Mcp-Session-Id``, the GET stream, a response stream resumed with ``Last-Event-ID``,
DELETE at the end). The server records what reached it, so each test checks what the gateway
forwarded as well as what the client got. kagent's ``mcp_url`` is used as an agent given only that
URL would.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.client_gateway import ClientGateway, client_gateway
from tests.conftest import ROOT

MODERN, LEGACY = "2026-07-28", "2025-11-25"
IDENTITY = {"X-User-Id": "alice", "X-Session-Id": "mcp-1"}


@pytest.fixture
async def mcp_server() -> AsyncIterator[int]:
    """The MCP server process on a listening socket it inherits (it accepts as soon as it runs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "tests.mcp_sandbox", str(sock.fileno())],
                               pass_fds=[sock.fileno()], cwd=ROOT)
    sock.close()
    try:
        yield port
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)


@pytest.fixture
async def gw(tmp_path, mcp_server) -> AsyncIterator[ClientGateway]:
    upstream = f"http://127.0.0.1:{mcp_server}"
    policy = (f"pools:\n  small: {{provider: static, upstreams: ['{upstream}']}}\n"
              f"  shared: {{provider: static, upstreams: ['{upstream}']}}\n")
    async with client_gateway(tmp_path, policy=policy) as gateway:
        gateway.mcp_port = mcp_server  # type: ignore[attr-defined]
        yield gateway


async def server_log(gw: ClientGateway) -> list[dict[str, str]]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{gw.mcp_port}/log") as response:  # type: ignore[attr-defined]
        return await response.json()  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def connect(url: str, headers: dict[str, str], mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client on its own transport, whose HTTP client sends ``headers`` on every request."""
    # The SDK's own timeouts (30 s, 300 s between bytes of a stream): httpx2's default 5 s read timeout
    # would cut the legacy protocol's idle GET stream under a loaded CI machine.
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http, \
            Client(streamable_http_client(url, http_client=http), mode=mode) as client:
        yield client


async def test_stateless_2026_07_28_through_identity_headers(gw):
    async with connect(f"{gw.data_url}/mcp", IDENTITY) as client:
        assert client.protocol_version == MODERN
        assert (await client.call_tool("add", {"a": 2, "b": 3})).structured_content == {"result": 5}
        seen = (await client.call_tool("request_headers", {})).structured_content
    assert (seen["mcp-protocol-version"], seen["mcp-method"], seen["mcp-name"]) == (MODERN, "tools/call",
                                                                                 "request_headers")
    assert "mcp-session-id" not in seen
    assert "x-user-id" not in seen and "x-session-id" not in seen  # identity stays with the gateway
    assert seen["x-sandbox-id"].startswith("usr-")
    log = await server_log(gw)
    assert {entry["method"] for entry in log} == {"POST"} and all("mcp-session-id" not in e for e in log)


async def test_legacy_session_resumed_stream_and_delete(gw):
    async with connect(f"{gw.data_url}/mcp", IDENTITY, mode="legacy") as client:
        assert client.protocol_version == LEGACY
        assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content == {"result": 2}
        # the server ends this call's response stream before the answer: the client resumes it with
        # GET and Last-Event-ID through the gateway, and the answer comes from the resumed stream
        assert (await client.call_tool("interrupted", {})).structured_content == {"result": "resumed"}
    log = await server_log(gw)
    session = log[0].get("mcp-session-id") or log[1]["mcp-session-id"]
    resumed = [e for e in log if e["method"] == "GET" and "last-event-id" in e]
    assert resumed and all(e["mcp-session-id"] == session for e in resumed)
    assert log[-1]["method"] == "DELETE" and log[-1]["mcp-session-id"] == session
    assert all("x-user-id" not in e["x-headers"] and "x-session-id" not in e["x-headers"] for e in log)


@pytest.mark.parametrize("mode", [MODERN, "legacy"])
async def test_kagent_mcp_url_alone_reaches_the_sessions_sandbox(gw, mode):
    headers = gw.owner("alice")
    sandbox = await gw.control("POST", "/api/sessions/agent-7/sandbox", headers=headers)
    assert sandbox["ready"] and sandbox["protocol"] == "streamable-http"
    # an agent given nothing but the URL: the token in it is swapped for a cookie by a redirect
    async with Client(sandbox["mcp_url"], mode=mode) as client:
        assert (await client.call_tool("add", {"a": 20, "b": 22})).structured_content == {"result": 42}
        seen = (await client.call_tool("request_headers", {})).structured_content
    assert seen["x-sandbox-id"] == sandbox["sandbox_id"]
    assert "authorization" not in seen and "sgw_access" not in seen.get("cookie", "")
    # a client that passes the response's headers as well
    async with connect(sandbox["mcp_url"], sandbox["headers"], mode=mode) as client:
        assert (await client.call_tool("add", {"a": 1, "b": 2})).structured_content == {"result": 3}
    for entry in await server_log(gw):
        assert "access_token" not in entry["query"] and entry["credentials"] in ("", "cookie")
