"""A sandbox's WebSocket close reaches the client, even while the client is still sending.

The embedded runtime refuses a 5 MB message with close 1009 and drops the connection while the
client's bytes are still arriving; the gateway must deliver that close frame, not lose it in the
reset that follows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
import uvloop
from aiohttp import WSMsgType

from gateway.model import Endpoint
from tests.proxy_helpers import CachingFakeResolver, gateways, identity_headers, start_gateway  # noqa: F401 (a fixture)
from tests.test_runtime_limits import runtime as runtime_process


@pytest.fixture
async def runtime(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The embedded runtime as the local provider runs it: its own process."""
    async with runtime_process(tmp_path / "root") as (url, _):
        yield Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]))


async def _close_code(url: str, headers: dict[str, str]) -> int | None:
    """Send 5 MB in one message; the close code the peer sent, or None if none arrived."""
    async with aiohttp.ClientSession() as http, http.ws_connect(url, headers=headers, max_msg_size=0) as ws:
        try:
            await ws.send_bytes(b"x" * 5_000_000)
        except ConnectionError:
            pass  # the peer closed while the message was still going out: its close may still be read
        msg = await asyncio.wait_for(ws.receive(), 30)
        return msg.data if msg.type is WSMsgType.CLOSE else None


async def test_the_runtime_refuses_5_mb_with_1009_directly(runtime):
    for _ in range(3):
        assert await _close_code(f"ws://{runtime.host}:{runtime.port}/ws", {}) == 1009


async def test_the_sandbox_close_reaches_the_client_through_the_gateway(runtime, start_gateway):
    gw = await start_gateway(CachingFakeResolver(runtime, sandbox_id="ses-ws"))
    codes = [await _close_code(f"ws://127.0.0.1:{gw.port}/ws", identity_headers()) for _ in range(10)]
    assert codes == [1009] * 10


def test_the_sandbox_close_reaches_the_client_on_uvloop(tmp_path: Path) -> None:
    """uvloop (production's loop) ends a transport on a failed write in its own way: same outcome."""
    async def main() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with runtime_process(tmp_path / "root") as (url, _), gateways() as start:
            endpoint = Endpoint("127.0.0.1", int(url.rsplit(":", 1)[1]))
            gw = await start(CachingFakeResolver(endpoint, sandbox_id="ses-ws"))
            codes = [await _close_code(f"ws://127.0.0.1:{gw.port}/ws", identity_headers()) for _ in range(5)]
            assert codes == [1009] * 5

    uvloop.run(main())
