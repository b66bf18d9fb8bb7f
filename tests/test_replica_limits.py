"""Org limits through three real gateway replicas on one Redis: the installation's, not each replica's."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.redis_server import RedisServer
from tests.test_replicas import replicas_factory, who  # noqa: F401  (fixture)

pytestmark = pytest.mark.slow


async def test_rate_and_streams_hold_across_three_replicas(replicas_factory, redis_server: RedisServer):
    replicas = await replicas_factory(redis_server.url, 3, env={
        "SANDBOX_GATEWAY_ORG_RATE_LIMIT": "100", "SANDBOX_GATEWAY_ORG_RATE_BURST": "50",
        "SANDBOX_GATEWAY_MAX_STREAMS_PER_ORG": "20"})
    hdrs = who("limited", "s1")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        async with http.get(f"{replicas[0].data_url}/", headers=hdrs) as response:
            assert response.status == 200  # the sandbox exists before the clock starts
        await asyncio.sleep(0.5)  # the burst refills (50 tokens at 100/s)

        sent: list[tuple[float, int]] = []
        start = time.monotonic()

        async def load(worker: int) -> None:
            n = worker
            while (now := time.monotonic()) - start < 4.0:
                async with http.get(f"{replicas[n % 3].data_url}/", headers=hdrs) as response:
                    await response.read()
                    sent.append((now - start, response.status))
                n += 1

        await asyncio.gather(*(load(i) for i in range(24)))
        assert {status for _, status in sent} == {200, 429}
        window = [status for t, status in sent if t >= 1.0]  # past the burst
        offered = len(window) / 3.0
        admitted = window.count(200) / 3.0
        assert offered > 130, offered  # over the limit (three replicas alone would admit 300/s)
        assert 90 <= admitted <= 110, (admitted, offered)

        sockets = []
        refused = 0
        try:
            for i in range(40):
                await asyncio.sleep(0.02)  # under the rate limit: only the stream cap refuses
                try:
                    sockets.append(await http.ws_connect(f"{replicas[i % 3].data_url}/ws", headers=hdrs))
                except aiohttp.WSServerHandshakeError as exc:
                    assert exc.status == 429
                    refused += 1
            assert 18 <= len(sockets) <= 22, len(sockets)  # 20 +-10% for the installation, not 60
        finally:
            for ws in sockets:
                await ws.close()
    print(f"\nlimits over 3 replicas: offered {offered:.0f}/s, admitted {admitted:.1f}/s (limit 100/s); "
          f"streams admitted {len(sockets)} of 40 (max 20), {refused} refused")
