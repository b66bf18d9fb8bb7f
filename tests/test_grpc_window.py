"""What one client connection to the gRPC front may have buffered, all its streams together, is its connection
window (``grpc_connection_window``): the window reopens as the relay hands bytes on, not as they arrive.
Before, it reopened on arrival, and a client could park 256 streams x 1 MiB (its streams' windows) while the
calls waited for a sandbox that did not read.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest
from hyperframe.frame import DataFrame

from tests.grpc_helpers import grpc_gateway, static_policy
from tests.test_grpc_hostile import DEFAULT_MAX_FRAME, RawConnection, grpc_message

WINDOW = 2 * 1024 * 1024
STREAMS = 8
PER_STREAM = WINDOW // STREAMS  # within each stream's 1 MiB window; together the connection's whole window


@pytest.fixture
def stuck_sandbox() -> Iterator[int]:
    """A sandbox port that completes TCP connects (the backlog) and never answers: calls wait for it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


def available(conn: RawConnection, sent: int) -> int:
    """The connection's send window as the front has opened it (RFC 9113 6.9: 65,535 to begin with)."""
    return 65_535 + conn.opened.get(0, 0) - sent


async def test_a_connection_buffers_no_more_than_its_window_while_its_calls_wait(stuck_sandbox, tmp_path):
    policy = static_policy(tmp_path / "policy.yaml", ["127.0.0.1"], stuck_sandbox)
    async with grpc_gateway(tmp_path, policy, grpc_connection_window=WINDOW, upstream_connect_timeout=1.5) as gateway:
        conn = await RawConnection.open(gateway.grpc_address)
        try:
            assert available(conn, 0) == WINDOW
            message = grpc_message(b"x" * (PER_STREAM - 5))
            streams = [conn.next_stream() for _ in range(STREAMS)]
            for stream in streams:  # each call waits for the sandbox: its bytes wait in the gateway
                frames = [DataFrame(stream, message[i:i + DEFAULT_MAX_FRAME])
                          for i in range(0, len(message), DEFAULT_MAX_FRAME)]
                await conn.send(conn.head(stream), *frames)
            sent = STREAMS * PER_STREAM
            await conn.ping(b"buffered")  # every frame sent before it has been handled
            # Credited on arrival, the whole window would be open again (and 256 streams could each fill
            # their 1 MiB): held, it stays shut until the calls hand the bytes on or end.
            assert available(conn, sent) < WINDOW // 4, (available(conn, sent), conn.opened)

            async with asyncio.timeout(15):  # the calls fail (the sandbox never answers): the bytes are let go
                while available(conn, sent) < WINDOW - WINDOW // 4:
                    await conn.ping(b"reopened")
                    await asyncio.sleep(0.1)
            assert all(conn.heads.get(stream) for stream in streams)  # each call was answered (UNAVAILABLE)
        finally:
            conn.close()
