"""Every stream counts, declared or not: an SSE response to a request that never asked for one (no
``Accept: text/event-stream``) takes a slot of ``max_streams_per_org`` and shows in ``sgw_open_streams``
from the moment its head arrives, through the whole gateway (app.py's wiring, the control API's /metrics),
and gives its slot back when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.grpc_helpers import grpc_gateway

UNDECLARED = 10
LIMIT = 5


@pytest.fixture
async def sse_sandbox() -> AsyncIterator[tuple[int, asyncio.Event]]:
    release = asyncio.Event()

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"data: hello\n\n")
        await release.wait()
        return response

    app = web.Application()
    app.router.add_get("/{tail:.*}", events)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1], release  # type: ignore[union-attr]
    finally:
        release.set()
        await runner.cleanup()


async def open_streams_metric(http: aiohttp.ClientSession, control: tuple[str, int]) -> float:
    async with http.get(f"http://{control[0]}:{control[1]}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith("sgw_open_streams "):
                return float(line.split()[1])
    raise AssertionError("no sgw_open_streams in /metrics")


async def test_undeclared_streams_take_slots_and_show_in_the_gauge_at_once(sse_sandbox, tmp_path: Path):
    port, release = sse_sandbox
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"pools:\n  small: {{provider: static, upstreams: ['http://127.0.0.1:{port}']}}\n"
                      f"  shared: {{provider: static, upstreams: ['http://127.0.0.1:{port}']}}\n", encoding="utf-8")
    async with grpc_gateway(tmp_path, policy, max_streams_per_org=LIMIT) as gateway, aiohttp.ClientSession() as http:
        host, data_port = gateway.data_address
        url = f"http://{host}:{data_port}/events"
        streams: list[Any] = []
        try:
            for i in range(UNDECLARED):  # no Accept: text/event-stream; none can be refused, each counts
                response = await http.get(url, headers={"X-Org-Id": "acme", "X-User-Id": f"u{i}",
                                                        "X-Session-Id": f"s{i}"})
                assert response.status == 200
                assert await response.content.readuntil(b"\n\n") == b"data: hello\n\n"
                streams.append(response)
            assert gateway.data_plane.limits.open_streams("acme") == UNDECLARED
            assert await open_streams_metric(http, gateway.control_address) == UNDECLARED  # no refresh lag
            async with http.get(url, headers={"X-Org-Id": "acme", "X-User-Id": "u99", "X-Session-Id": "s99",
                                              "Accept": "text/event-stream"}) as declared:
                assert declared.status == 429  # the org's slots are taken by the undeclared ones
                assert "max_streams_per_org" in (await declared.json())["error"]["message"]
        finally:
            release.set()
            for response in streams:
                await response.read()
                response.release()
        async with asyncio.timeout(10):
            while gateway.data_plane.limits.open_streams("acme") or gateway.data_plane.open_streams:
                await asyncio.sleep(0.02)
        assert await open_streams_metric(http, gateway.control_address) == 0
