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
from gateway.runtime.grpc_service import SERVICE, ExecuteReply, ExecuteRequest, MessageCodec, Output
from tests.grpc_helpers import SERVER_STREAM, UNARY


@asynccontextmanager
async def runtime(root: Path, module: str = "gateway.runtime") -> AsyncIterator[tuple[str, int]]:
    """``python -m gateway.runtime --port 0 --grpc-port 0``; yields its HTTP URL and gRPC port."""
    command = ["runtime"] if module == "gateway.cli" else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *command, "--port", "0", "--grpc-port", "0", "--root", str(root),
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


async def _http_execute(url: str, command: str) -> tuple[str, int]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/execute", json={"command": command}) as response:
        result = await response.json()
    assert not result["timed_out"]
    return result["stdout"], result["exit_code"]


async def _grpc_execute_stream(port: int, command: str) -> tuple[str, int]:
    stdout, code = b"", None
    async with Channel("127.0.0.1", port, codec=MessageCodec()) as channel:
        async with channel.request(SERVICE + "ExecuteStream", SERVER_STREAM, ExecuteRequest, Output) as stream:
            await stream.send_message(ExecuteRequest(command), end=True)
            async for message in stream:
                stdout += message.stdout
                code = message.exit_code if message.exit_code is not None else code
    assert code is not None
    return stdout.decode(), code


@pytest.mark.parametrize("call", [_http_execute, _grpc_execute_stream], ids=["POST /execute", "gRPC ExecuteStream"])
async def test_a_background_job_does_not_hold_the_answer(rt, call):
    """``cmd &`` keeps the output pipes open as long as it runs; the answer comes when the shell exits."""
    url, port = rt
    started = time.monotonic()
    stdout, code = await asyncio.wait_for(call(url if call is _http_execute else port, "sleep 300 & echo $!"), 60)
    elapsed = time.monotonic() - started
    pid = int(stdout)
    try:
        assert code == 0 and elapsed < 30
        os.kill(pid, 0)  # the job itself goes on running
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_sandbox_gateway_runtime_serves_grpc_as_the_readme_says(tmp_path: Path) -> None:
    """README: ``sandbox-gateway runtime ... [--grpc-port P]`` (the CLI had only --host/--port/--root)."""
    async with runtime(tmp_path / "root", "gateway.cli") as (url, port):
        async with Channel("127.0.0.1", port, codec=MessageCodec()) as channel:
            async with channel.request(SERVICE + "Execute", UNARY, ExecuteRequest, ExecuteReply) as stream:
                await stream.send_message(ExecuteRequest("echo hi"), end=True)
                assert (await stream.recv_message()) == ExecuteReply("hi\n", "", 0)
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            assert (await response.json())["status"] == "ok"
