"""A test gRPC sandbox (raw bytes, no protos) and a gateway with its gRPC front, for tests and benchmarks."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from gateway.app import Gateway
from gateway.settings import Settings

UNARY, CLIENT_STREAM = Cardinality.UNARY_UNARY, Cardinality.STREAM_UNARY
SERVER_STREAM, BIDI = Cardinality.UNARY_STREAM, Cardinality.STREAM_STREAM
MAX_MESSAGE = 32 * 1024 * 1024
STRIPPED = {"x-org-id", "x-user-id", "x-session-id", "x-bot-id", "authorization"}


class RawCodec(CodecBase):
    """Messages are the bytes on the wire: what a passthrough must not change."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        return bytes(data)


class EchoSandbox:
    """``/test.Echo/*``: every call kind, metadata and trailers, a slow method that notes its cancellation."""

    def __init__(self, name: str = "sandbox") -> None:
        self.name = name
        self.cancelled = asyncio.Event()   # Slow was cancelled (the client left, a deadline, a reset)
        self.slow_started = asyncio.Event()  # set by every Slow call as it starts
        self.slow_running = 0                # Slow calls started and not yet ended
        self.seen: list[dict[str, str]] = []  # request metadata of every call, in order
        self.flooded = 0                      # messages Flood has handed to grpclib so far
        self.sink_open = asyncio.Event()      # Sink reads nothing until this is set
        self.sunk = 0                         # bytes Sink has read so far

    def _note(self, stream: Stream[Any, Any]) -> dict[str, str]:
        metadata = {k: v for k, v in (stream.metadata or {}).items() if isinstance(v, str)}
        self.seen.append(metadata)
        return metadata

    async def unary(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        message = await stream.recv_message()
        await stream.send_message(message)

    async def client_stream(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        parts = [m async for m in stream]
        await stream.send_message(b"|".join(parts))

    async def server_stream(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        request = await stream.recv_message()
        count, size = map(int, request.split(b":"))
        for i in range(count):
            await stream.send_message(i.to_bytes(4, "big") * (size // 4))

    async def bidi(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        async for message in stream:
            await stream.send_message(message[::-1])

    async def slow(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        try:  # cancelled while its message is still awaited too: a 100 ms deadline can end the call that early
            await stream.recv_message()
            self.slow_running += 1
            self.slow_started.set()
            try:
                await asyncio.sleep(60)
            finally:
                self.slow_running -= 1
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def flood(self, stream: Stream[bytes, bytes]) -> None:
        """Up to 2,000 messages of 64 KiB (128 MiB), as fast as the client lets it."""
        self._note(stream)
        await stream.recv_message()
        chunk = b"f" * 65536
        for _ in range(2000):
            await stream.send_message(chunk)
            self.flooded += 1

    async def early(self, stream: Stream[bytes, bytes]) -> None:
        """Answers with a status before reading any of the request."""
        self._note(stream)
        raise GRPCError(Status.FAILED_PRECONDITION, "answered before reading")

    async def sink(self, stream: Stream[bytes, bytes]) -> None:
        """Reads the client's messages only once ``sink_open`` is set, then answers with their total size."""
        self._note(stream)
        await self.sink_open.wait()
        async for message in stream:
            self.sunk += len(message)
        await stream.send_message(str(self.sunk).encode())

    async def meta(self, stream: Stream[bytes, bytes]) -> None:
        """Answers with what it received; initial metadata, trailers and the status the request asks for."""
        metadata = self._note(stream)
        request = json.loads(await stream.recv_message())
        await stream.send_initial_metadata(metadata={"x-initial": "one", "x-blob-bin": b"\x00\xffinit"})
        await stream.send_message(json.dumps({"metadata": metadata, "sandbox": self.name,
                                              "deadline": stream.deadline is not None}).encode())
        await stream.send_trailing_metadata(status=Status(request.get("status", 0)),
                                            status_message=request.get("message"),
                                            metadata={"x-trailer": "two", "x-trail-bin": b"\x01\x02"})

    async def fail(self, stream: Stream[bytes, bytes]) -> None:
        self._note(stream)
        await stream.recv_message()
        raise GRPCError(Status.FAILED_PRECONDITION, "sandbox says no")

    def __mapping__(self) -> dict[str, Handler]:
        return {
            "/test.Echo/Unary": Handler(self.unary, UNARY, bytes, bytes),
            "/test.Echo/ClientStream": Handler(self.client_stream, CLIENT_STREAM, bytes, bytes),
            "/test.Echo/ServerStream": Handler(self.server_stream, SERVER_STREAM, bytes, bytes),
            "/test.Echo/Bidi": Handler(self.bidi, BIDI, bytes, bytes),
            "/test.Echo/Slow": Handler(self.slow, UNARY, bytes, bytes),
            "/test.Echo/Meta": Handler(self.meta, UNARY, bytes, bytes),
            "/test.Echo/Fail": Handler(self.fail, UNARY, bytes, bytes),
            "/test.Echo/Flood": Handler(self.flood, SERVER_STREAM, bytes, bytes),
            "/test.Echo/Early": Handler(self.early, CLIENT_STREAM, bytes, bytes),
            "/test.Echo/Sink": Handler(self.sink, CLIENT_STREAM, bytes, bytes),
        }


class _ClosingServer(Server):
    """grpclib's Server leaves accepted connections to their peers to close; a test ends them itself,
    so that a client that closes lazily (grpcio closes from its own thread) leaves no transport behind."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.protocols: list[Any] = []

    def _protocol_factory(self) -> Any:
        protocol = super()._protocol_factory()
        self.protocols.append(protocol)
        return protocol

    def close(self) -> None:
        super().close()
        for protocol in self.protocols:
            if hasattr(protocol, "connection"):
                protocol.connection.close()


@asynccontextmanager
async def echo_server(host: str = "127.0.0.1", port: int = 0, name: str = "sandbox"
                      ) -> AsyncIterator[tuple[EchoSandbox, int]]:
    service = EchoSandbox(name)
    server = _ClosingServer([service], codec=RawCodec())
    await server.start(host, port)
    try:
        yield service, server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    finally:
        server.close()
        await server.wait_closed()


def static_policy(path: Path, upstream_hosts: list[str], grpc_port: int) -> Path:
    upstreams = ", ".join(f'"http://{h}:9"' for h in upstream_hosts)
    path.write_text(
        "pools:\n"
        f"  small: {{provider: static, upstreams: [{upstreams}], grpc_port: {grpc_port}}}\n"
        f"  shared: {{provider: static, upstreams: [{upstreams}], grpc_port: {grpc_port}}}\n"
        "routing:\n  per_session_orgs: ['*']\n", encoding="utf-8")
    return path


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@asynccontextmanager
async def grpc_gateway(tmp_path: Path, policy: Path, **settings: Any) -> AsyncIterator[Gateway]:
    """A whole Gateway (app.py's wiring) with its data plane, control API and gRPC front on free ports."""
    config = Settings(policy_file=policy, data_dir=tmp_path / "data",
                      **{"upstream_connect_timeout": 2.0, "drain_timeout": 1.0, **settings})
    gateway = Gateway.create(config)
    await gateway.start(_listen(), _listen(), _listen())
    try:
        yield gateway
    finally:
        await gateway.stop()


def ident(session: str = "s1", user: str = "u1", **extra: str) -> dict[str, str]:
    return {"x-user-id": user, "x-session-id": session, **extra}
