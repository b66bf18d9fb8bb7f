"""The reference runtime, as a real process, fails clearly: every refusal is the documented JSON
error or gRPC status, never aiohttp's plain text, a 500 or UNKNOWN; and a command's background job
does not hold the answer."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from gateway.runtime.execute import MAX_COMMAND_BYTES
from gateway.runtime.grpc_service import SERVICE, ExecuteReply, ExecuteRequest, MessageCodec
from tests.grpc_helpers import UNARY


@asynccontextmanager
async def runtime(root: Path) -> AsyncIterator[tuple[str, int]]:
    """``python -m gateway.runtime --port 0 --grpc-port 0``; yields its HTTP URL and gRPC port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.runtime", "--port", "0", "--grpc-port", "0", "--root", str(root),
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        http = (await asyncio.wait_for(proc.stdout.readline(), 30)).split()
        grpc = (await asyncio.wait_for(proc.stdout.readline(), 30)).split()
        yield f"http://127.0.0.1:{int(http[2])}", int(grpc[2])
    finally:
        proc.terminate()
        await proc.wait()


@pytest.fixture
async def rt(tmp_path: Path) -> AsyncIterator[tuple[str, int]]:
    async with runtime(tmp_path / "root") as where:
        yield where


async def _error(response: aiohttp.ClientResponse) -> dict[str, str]:
    assert response.content_type == "application/json", await response.text()
    return (await response.json())["error"]  # type: ignore[no-any-return]


async def test_a_20_kb_url_is_414_json(rt):
    url, _ = rt
    async with aiohttp.ClientSession() as http, http.get(f"{url}/echo/{'a' * 20_000}") as response:
        assert response.status == 414
        error = await _error(response)
    assert error["code"] == "uri_too_long" and "8190" in error["message"]


async def test_a_command_past_the_kernels_argument_limit_is_413_json(rt):
    url, _ = rt
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/execute", json={"command": "echo " + "x" * 200_000}) as response:
            assert response.status == 413
            error = await _error(response)
        assert error["code"] == "command_too_large" and str(MAX_COMMAND_BYTES) in error["message"]
        fits = "echo " + "x" * (MAX_COMMAND_BYTES - 5)  # exactly the limit: served
        async with http.post(f"{url}/execute", json={"command": fits}) as response:
            assert response.status == 200 and len((await response.json())["stdout"]) == MAX_COMMAND_BYTES - 4


async def test_an_8_mb_grpc_execute_is_resource_exhausted(rt):
    _, port = rt
    async with Channel("127.0.0.1", port, codec=MessageCodec()) as channel:
        with pytest.raises(GRPCError) as refused:
            async with channel.request(SERVICE + "Execute", UNARY, ExecuteRequest, ExecuteReply) as stream:
                await stream.send_message(ExecuteRequest("echo " + "x" * 8_000_000), end=True)
                await stream.recv_message()
    assert refused.value.status is Status.RESOURCE_EXHAUSTED and str(MAX_COMMAND_BYTES) in str(refused.value.message)


async def test_a_background_job_does_not_hold_the_answer(rt):
    """``cmd &`` keeps the output pipes open as long as it runs; the answer comes when the shell exits."""
    url, _ = rt
    started = time.monotonic()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/execute", json={"command": "sleep 300 & echo $!"}) as response:
            result = await response.json()
    elapsed = time.monotonic() - started
    pid = int(result["stdout"])
    try:
        assert result["exit_code"] == 0 and not result["timed_out"] and elapsed < 30
        os.kill(pid, 0)  # the job itself goes on running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
