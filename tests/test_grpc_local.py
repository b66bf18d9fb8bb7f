"""Local sandboxes answer gRPC: the runtime's service on a second Unix socket the gateway binds and
the sandbox inherits (``--grpc-fd``), reached through the gRPC front like any other sandbox."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from grpclib.client import Channel

from gateway.app import Gateway
from gateway.runtime.grpc_service import SERVICE, ExecuteReply, ExecuteRequest, HealthReply, HealthRequest, MessageCodec
from gateway.settings import Settings
from tests.grpc_helpers import UNARY, ident
from tests.proxy_helpers import listening_socket
from tests.test_grpc_runtime import assert_output_as_it_comes


@asynccontextmanager
async def local_gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    """A whole Gateway on its embedded default: local pools, confined sandboxes, a memory store."""
    # local_disk_quota_bytes=0: a test writes into a sandbox's directory from the host, which a disk image
    # (gateway/providers/disk.py) would hold out of sight
    gateway = Gateway.create(Settings(data_dir=tmp_path / "data", drain_timeout=1.0, access_log=False,
                                      local_disk_quota_bytes=0))
    await gateway.start(listening_socket(), listening_socket(), listening_socket())
    try:
        yield gateway
    finally:
        await gateway.stop()


async def _health(channel: Channel, session: str, user: str = "u1") -> HealthReply:
    async with channel.request(SERVICE + "Health", UNARY, HealthRequest, HealthReply,
                               metadata=ident(session, user)) as stream:
        await stream.send_message(HealthRequest(), end=True)
        reply = await stream.recv_message()
    assert reply is not None
    return reply


async def _execute(channel: Channel, session: str, command: str, user: str = "u1") -> ExecuteReply:
    async with channel.request(SERVICE + "Execute", UNARY, ExecuteRequest, ExecuteReply,
                               metadata=ident(session, user)) as stream:
        await stream.send_message(ExecuteRequest(command), end=True)
        reply = await stream.recv_message()
    assert reply is not None
    return reply


async def test_a_local_sandbox_answers_grpc_as_it_answers_http(tmp_path):
    async with local_gateway(tmp_path) as gw:
        assert gw.grpc_address is not None
        channel = Channel(*gw.grpc_address, codec=MessageCodec())
        try:
            mine = await _health(channel, "s1")
            assert mine.status == "ok" and mine.sandbox_id.startswith(("ses-", "usr-"))
            assert await _execute(channel, "s1", "echo mine > note.txt; pwd") == ExecuteReply("/home/sandbox\n", "", 0)

            await assert_output_as_it_comes(channel, tmp_path / "data" / "sandboxes" / mine.sandbox_id / "root",
                                            ident("s1"))

            # Suspended, then woken by a gRPC call: the same sandbox, its files kept.
            await gw.router.suspend_sandbox(mine.sandbox_id)
            assert (await _execute(channel, "s1", "cat note.txt")).stdout == "mine\n"

            # Another tenant's session has its own sandbox and never sees the first one's files.
            other = await _health(channel, "s2", user="u2")
            assert other.sandbox_id != mine.sandbox_id
            assert (await _execute(channel, "s2", "cat note.txt", user="u2")).exit_code != 0
        finally:
            channel.close()
