"""The reference runtime's gRPC service (gateway/runtime/grpc_service.py), as a real process, direct and through the gateway."""

from __future__ import annotations

import asyncio
import struct
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from gateway.runtime.grpc_service import (SERVICE, ExecuteReply, ExecuteRequest, HealthReply, HealthRequest,
                                          MessageCodec, Output)
from tests.grpc_helpers import SERVER_STREAM, UNARY, grpc_gateway, ident, static_policy


@asynccontextmanager
async def runtime(root: Path) -> AsyncIterator[int]:
    """``python -m gateway.runtime --grpc-port 0``; yields its gRPC port."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.runtime", "--port", "0", "--grpc-port", "0", "--root", str(root),
        "--sandbox-id", "ses-runtime", stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        first = (await asyncio.wait_for(proc.stdout.readline(), 30)).split()
        second = (await asyncio.wait_for(proc.stdout.readline(), 30)).split()
        assert first[0] == b"LISTENING" and second[0] == b"GRPC_LISTENING", (first, second)
        yield int(second[2])
    finally:
        proc.terminate()
        await proc.wait()


@pytest.mark.parametrize("message", [
    pytest.param(ExecuteRequest("ls -l", 1.5), id="string and double"),
    pytest.param(ExecuteReply("out\n", "é", -3), id="negative int32"),
    pytest.param(Output(stdout=b"\x00\xff"), id="bytes"),
    pytest.param(Output(exit_code=0), id="optional zero is sent"),
    pytest.param(HealthReply("ok", "ses-x"), id="health"),
])
def test_messages_round_trip(message):
    assert type(message).decode(message.encode()) == message


def test_the_wire_bytes_are_protobuf():
    # protoc's encoding of ExecuteRequest{command: "ls", timeout_seconds: 1.5}
    assert ExecuteRequest("ls", 1.5).encode() == b"\x0a\x02ls\x11" + struct.pack("<d", 1.5)
    assert ExecuteReply(exit_code=-1).encode() == b"\x18" + b"\xff" * 9 + b"\x01"
    assert Output(exit_code=0).encode() == b"\x18\x00"


async def _execute(channel: Channel, command: str, **metadata: str) -> ExecuteReply:
    async with channel.request(SERVICE + "Execute", UNARY, ExecuteRequest, ExecuteReply,
                               metadata=metadata or None) as stream:
        await stream.send_message(ExecuteRequest(command), end=True)
        reply = await stream.recv_message()
        await stream.recv_trailing_metadata()
    assert reply is not None
    return reply


async def assert_output_as_it_comes(channel: Channel, root: Path, metadata: dict[str, str] | None = None) -> None:
    """ExecuteStream sends output as it comes: the second line waits for a file this creates (in the
    sandbox's ``root``) only after reading the first."""
    async with channel.request(SERVICE + "ExecuteStream", SERVER_STREAM, ExecuteRequest, Output,
                               metadata=metadata) as stream:
        await stream.send_message(ExecuteRequest(
            "echo first; while [ ! -f go ]; do sleep 0.02; done; echo second"), end=True)
        assert await stream.recv_message() == Output(stdout=b"first\n")
        (root / "go").touch()
        assert await stream.recv_message() == Output(stdout=b"second\n")
        assert await stream.recv_message() == Output(exit_code=0)


async def test_health_execute_and_streamed_output_as_it_comes(tmp_path):
    root = tmp_path / "root"
    async with runtime(root) as port:
        channel = Channel("127.0.0.1", port, codec=MessageCodec())
        try:
            async with channel.request(SERVICE + "Health", UNARY, HealthRequest, HealthReply) as stream:
                await stream.send_message(HealthRequest(), end=True)
                assert await stream.recv_message() == HealthReply("ok", "ses-runtime")
            reply = await _execute(channel, "echo hi; echo err >&2; exit 3")
            assert reply == ExecuteReply("hi\n", "err\n", 3)
            await assert_output_as_it_comes(channel, root)
            with pytest.raises(GRPCError) as refused:
                await _execute(channel, "")
            assert refused.value.status is Status.INVALID_ARGUMENT
        finally:
            channel.close()


async def test_the_runtime_through_the_gateway(tmp_path):
    async with runtime(tmp_path / "root") as port:
        async with grpc_gateway(tmp_path, static_policy(tmp_path / "p.yaml", ["127.0.0.1"], port)) as gw:
            channel = Channel(*gw.grpc_address, codec=MessageCodec())
            try:
                reply = await _execute(channel, "printf %s \"$PWD\" | tail -c 4", **ident())
            finally:
                channel.close()
    assert reply == ExecuteReply("root", "", 0)
