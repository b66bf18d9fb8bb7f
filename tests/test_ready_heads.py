"""ReadyHeads (gateway/proxy/_ready.py): which held slow heads have bytes waiting, on real sockets and transports."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.proxy._ready import ReadyHeads

pytestmark = pytest.mark.skipif(not hasattr(__import__("select"), "epoll"), reason="epoll is Linux's")


class Held(asyncio.Protocol):
    """A server side connection, paused as a held slow head is."""

    def __init__(self, accepted: asyncio.Queue[Held]) -> None:
        self.accepted = accepted
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.pause_reading()  # type: ignore[attr-defined]
        self.accepted.put_nowait(self)


@pytest.fixture
async def pair() -> AsyncIterator:  # type: ignore[type-arg]
    """``connect()`` -> (the client's socket, the server side Held) over loopback TCP."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Queue[Held] = asyncio.Queue()
    server = await loop.create_server(lambda: Held(accepted), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients: list[socket.socket] = []
    served: list[Held] = []

    async def connect(sock: socket.socket | None = None) -> tuple[socket.socket, Held]:
        sock = sock or socket.socket()
        sock.connect(("127.0.0.1", port))
        clients.append(sock)
        served.append(await asyncio.wait_for(accepted.get(), 5))
        return sock, served[-1]

    yield connect
    for sock in clients:
        sock.close()
    for conn in served:
        conn.transport.close()  # type: ignore[union-attr]
    server.close()
    await server.wait_closed()


async def test_only_a_socket_with_bytes_or_an_end_waiting_is_ready(pair) -> None:  # type: ignore[no-untyped-def]
    heads = ReadyHeads()
    (quiet_sock, quiet), (talker_sock, talker), (leaver_sock, leaver) = [await pair() for _ in range(3)]
    held = {quiet: None, talker: None, leaver: None}
    assert all(heads.watch(conn) for conn in held) and len(heads) == 3
    assert heads.ready(held, 10) == []
    talker_sock.send(b"X-Slow: 1\r\n")
    leaver_sock.close()
    assert await ready_soon(heads, held, lambda ready: len(ready) >= 2) == {talker, leaver}
    assert quiet in held and len(heads) == 3  # the quiet one: still watched, not ready
    heads.close()


async def test_ready_heads_are_handed_out_a_slice_at_a_time_and_all_in_turn(pair) -> None:  # type: ignore[no-untyped-def]
    """Asked for two at a time, five ready heads come two, two, then the last (and one again): the set is
    level-triggered, and the kernel hands out the ones not yet taken before those it gave already, so a
    tick's call stays small and no ready head is left behind."""
    heads = ReadyHeads()
    pairs = [await pair() for _ in range(5)]
    held = {conn: None for _, conn in pairs}
    assert all(heads.watch(conn) for conn in held)
    for sock, _ in pairs:
        sock.send(b"X-Slow: 1\r\n")
    await ready_soon(heads, held, lambda ready: len(ready) == 5)
    seen: list = []  # type: ignore[type-arg]
    for _ in range(3):
        got = heads.ready(held, 2)
        assert len(got) == 2
        seen += got
    assert len(set(seen[:5])) == 5  # each once before any twice
    heads.close()


async def test_a_ready_connection_no_longer_held_leaves_the_set(pair) -> None:  # type: ignore[no-untyped-def]
    heads = ReadyHeads()
    sock, conn = await pair()
    assert heads.watch(conn) and heads.watch(conn) and len(heads) == 1  # added once
    sock.send(b"x")
    assert await ready_soon(heads, {}, lambda ready: not heads) == set()
    heads.close()


async def test_a_descriptor_reused_by_a_new_connection_is_not_taken_for_the_old_one(pair) -> None:  # type: ignore[no-untyped-def]
    """The kernel drops a closed socket from the set; its number, reused by the next connection, must not
    make the old connection's late forget() remove the new one (its close is reported a loop turn later)."""
    heads = ReadyHeads()
    _, old = await pair()
    assert heads.watch(old)
    fd = old.transport.get_extra_info("socket").fileno()
    sock = socket.socket()  # numbered before the old one is freed: the next accept gets the old number
    old.transport.abort()
    await closed(fd)
    sock, new = await pair(sock)
    assert new.transport.get_extra_info("socket").fileno() == fd  # the lowest free number, reused
    assert heads.watch(new)
    heads.forget(old)  # the old connection's close, reported late
    sock.send(b"x")
    assert await ready_soon(heads, {new: None}, lambda ready: bool(ready)) == {new}
    heads.close()


async def ready_soon(heads: ReadyHeads, held: dict, done: Callable[[set], bool]) -> set:  # type: ignore[type-arg]
    """What ``ready`` reports once ``done`` says so (an end crosses loopback a loop turn or so after it is sent)."""
    deadline = asyncio.get_running_loop().time() + 5
    while True:
        ready = set(heads.ready(held, 10))
        if done(ready):
            return ready
        assert asyncio.get_running_loop().time() < deadline, f"ready: {ready}"
        await asyncio.sleep(0.01)


async def closed(fd: int) -> None:
    """The event loop closed ``fd`` (a transport closes its socket a loop turn after abort())."""
    for _ in range(500):
        try:
            os.fstat(fd)
        except OSError:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"descriptor {fd} still open")
