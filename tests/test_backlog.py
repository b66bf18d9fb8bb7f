"""A first-use burst fits: the runtime keeps the listen backlog its provider chose, and the data plane
waits out a full Unix-socket backlog (EAGAIN) inside the request's time instead of answering 502.

A Unix socket whose backlog is full fails a non-blocking connect at once with EAGAIN (TCP would
retry its SYN); the chaos run saw 22-200 of 1,000 first requests answered 502 that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp

from gateway.model import Endpoint
from gateway.runtime.config import LISTEN_BACKLOG
from tests.proxy_helpers import FakeResolver, identity_headers, read_head, start_gateway

__all__ = ["start_gateway"]  # fixtures


def _accepted_without_accept(path: str, attempts: int) -> int:
    """How many non-blocking connects to ``path`` succeed before the first EAGAIN (nobody accepts)."""
    held = []
    try:
        for _ in range(attempts):
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.setblocking(False)
            held.append(client)
            try:
                client.connect(path)
            except BlockingIOError:
                return len(held) - 1
        return len(held)
    finally:
        for client in held:
            client.close()


@contextlib.contextmanager
def _runtime_on(listener: socket.socket, root: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m gateway.runtime`` serving the inherited ``listener``, as the local provider starts it."""
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.runtime", "--listen-fd", str(listener.fileno()), "--root", str(root),
         "--sandbox-id", "ses-burst"],
        pass_fds=(listener.fileno(),), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the runtime's "I serve" line: it has listened again by now
        assert line.startswith(b"LISTENING fd"), line
        yield process
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(timeout=30)
        if process.stdout is not None:
            process.stdout.close()


async def test_the_runtime_keeps_the_listen_backlog_it_inherits(tmp_path: Path) -> None:
    """The runtime re-listens on its inherited socket (aiohttp's SockSite); with aiohttp's default the
    backlog fell to 128. Stopped (so nothing is accepted), it must queue far more than that."""
    path = str(tmp_path / "rt.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(LISTEN_BACKLOG)
    try:
        with _runtime_on(listener, tmp_path / "root") as runtime:
            runtime.send_signal(signal.SIGSTOP)
            queued = await asyncio.to_thread(_accepted_without_accept, path, 600)
    finally:
        listener.close()
    assert queued == 600, f"only {queued} connects were queued: the runtime listens with a smaller backlog"


class BusyUnixSandbox:
    """A Unix-socket sandbox whose backlog is full (listen(0), filled, nobody accepting) until
    :meth:`catch_up`, after which it answers every request 200."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(0)
        self.fillers: list[socket.socket] = []
        while True:
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            filler.setblocking(False)
            try:
                filler.connect(path)
            except BlockingIOError:
                filler.close()
                break
            self.fillers.append(filler)
        self.server: asyncio.AbstractServer | None = None

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint("ses-burst.local", 1, unix=self.path)

    async def catch_up(self) -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await read_head(reader)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                await writer.drain()
            writer.close()

        self.server = await asyncio.start_unix_server(answer, sock=self.listener)

    async def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        else:
            self.listener.close()


async def test_a_full_backlog_is_waited_out_not_answered_502(start_gateway, tmp_path: Path) -> None:
    sandbox = BusyUnixSandbox(str(tmp_path / "busy.sock"))
    try:
        gateway = await start_gateway(FakeResolver(sandbox.endpoint), upstream_connect_timeout=30.0,
                                      upstream_connect_retries=1, upstream_connect_backoff=0.01)
        async with aiohttp.ClientSession() as http:
            request = asyncio.ensure_future(http.get(f"{gateway.url}/", headers=identity_headers()))
            await asyncio.sleep(0.5)  # the length of the burst itself: the sandbox has no event to offer
            assert not request.done(), "the request was answered while the backlog was full"
            await sandbox.catch_up()
            async with await request as response:
                assert response.status == 200, await response.text()
                assert await response.text() == "ok"
    finally:
        await sandbox.close()


async def test_a_backlog_that_stays_full_is_502_once_the_request_time_is_up(start_gateway, tmp_path: Path) -> None:
    """Bounded: by the request's own limit (X-Sandbox-Timeout) where it is longer than the connect
    timeout; the error says why."""
    sandbox = BusyUnixSandbox(str(tmp_path / "busy.sock"))
    try:
        gateway = await start_gateway(FakeResolver(sandbox.endpoint), upstream_connect_timeout=0.2,
                                      upstream_connect_retries=1, upstream_connect_backoff=0.01)
        async with aiohttp.ClientSession() as http:
            started = time.monotonic()
            limited = identity_headers(**{"X-Sandbox-Timeout": "1.5"})
            async with http.get(f"{gateway.url}/", headers=limited) as response:
                elapsed = time.monotonic() - started
                assert response.status == 502
                error = (await response.json())["error"]
        assert error["code"] == "upstream_unreachable"
        assert "backlog" in error["message"]
        assert 1.4 <= elapsed < 20, elapsed
    finally:
        await sandbox.close()

