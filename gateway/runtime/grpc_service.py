"""The runtime's gRPC service, ``sandbox.runtime.v1.Runtime`` (see ``runtime.proto`` beside this file).

Served by grpclib when the runtime is started with ``--grpc-port``: ``Health``,
unary ``Execute`` (the same command runner as ``POST /execute``) and
server-streaming ``ExecuteStream`` (output chunks as the command writes them,
then one message carrying the exit code). A cancelled call (the client went
away, its deadline passed) kills the command's process group.

Messages are encoded with the few protobuf wire helpers below rather than the
``protobuf`` package and generated code: four small messages of strings, bytes,
an int32 and a double do not justify a generator step and a dependency.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.server import Server, Stream

from .errors import TooLarge
from .execute import (
    AFTER_EXIT_READ_SECONDS,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_TIMEOUT_SECONDS,
    TIMEOUT_EXIT_CODE,
    _kill_group,
    check_command_size,
    run_command,
    spawn_shell,
)

SERVICE = "/sandbox.runtime.v1.Runtime/"
_READ_BYTES = 64 * 1024


# -- protobuf wire format (varint, 64-bit, length-delimited) -------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 are sent as 10-byte two's complement
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, value: Any) -> bytes:
    if isinstance(value, float):
        return _varint(number << 3 | 1) + struct.pack("<d", value)
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else bytes(value)
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def encode_fields(fields: list[tuple[int, Any]]) -> bytes:
    """Fields with proto3 defaults (0, "", b"") left out, as protobuf does; ``None`` means absent."""
    return b"".join(_field(n, v) for n, v in fields if v is not None and v != 0 and v != "" and v != b"")


def decode_fields(data: bytes) -> dict[int, Any]:
    """Field number -> last value (ints, bytes, or floats for 64-bit fields); unknown wire types refused."""
    fields: dict[int, Any] = {}
    pos, end = 0, len(data)

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= end:
                raise ValueError("truncated varint")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < end:
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            fields[number] = varint()
        elif wire == 1:
            fields[number] = struct.unpack_from("<d", data, pos)[0]
            pos += 8
        elif wire == 2:
            size = varint()
            fields[number] = data[pos:pos + size]
            pos += size
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > end:
            raise ValueError("truncated message")
    return fields


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


# -- messages -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HealthRequest:
    def encode(self) -> bytes:
        return b""

    @classmethod
    def decode(cls, data: bytes) -> HealthRequest:
        decode_fields(data)
        return cls()


@dataclass(frozen=True)
class HealthReply:
    status: str = ""
    sandbox_id: str = ""

    def encode(self) -> bytes:
        return encode_fields([(1, self.status), (2, self.sandbox_id)])

    @classmethod
    def decode(cls, data: bytes) -> HealthReply:
        f = decode_fields(data)
        return cls(f.get(1, b"").decode(), f.get(2, b"").decode())


@dataclass(frozen=True)
class ExecuteRequest:
    command: str = ""
    timeout_seconds: float = 0.0

    def encode(self) -> bytes:
        return encode_fields([(1, self.command), (2, float(self.timeout_seconds))])

    @classmethod
    def decode(cls, data: bytes) -> ExecuteRequest:
        f = decode_fields(data)
        timeout = f.get(2, 0.0)
        return cls(f.get(1, b"").decode("utf-8", errors="replace"), timeout if isinstance(timeout, float) else 0.0)


@dataclass(frozen=True)
class ExecuteReply:
    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0

    def encode(self) -> bytes:
        return encode_fields([(1, self.stdout), (2, self.stderr), (3, self.exit_code)])

    @classmethod
    def decode(cls, data: bytes) -> ExecuteReply:
        f = decode_fields(data)
        return cls(f.get(1, b"").decode(), f.get(2, b"").decode(), _int32(f.get(3, 0)))


@dataclass(frozen=True)
class Output:
    stdout: bytes = b""
    stderr: bytes = b""
    exit_code: int | None = None

    def encode(self) -> bytes:
        code = b"" if self.exit_code is None else _varint(3 << 3) + _varint(self.exit_code)  # optional: sent when set
        return encode_fields([(1, self.stdout), (2, self.stderr)]) + code

    @classmethod
    def decode(cls, data: bytes) -> Output:
        f = decode_fields(data)
        code = f.get(3)
        return cls(f.get(1, b""), f.get(2, b""), None if code is None else _int32(code))


class MessageCodec(CodecBase):
    """grpclib codec for the dataclasses above (``encode()`` / ``decode(bytes)``)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return message.encode()  # type: ignore[no-any-return]

    def decode(self, data: bytes, message_type: Any) -> Any:
        try:
            return message_type.decode(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise GRPCError(Status.INVALID_ARGUMENT, f"malformed {message_type.__name__}: {exc}") from None


# -- the service ----------------------------------------------------------------------------------
def _timeout(request: ExecuteRequest) -> float:
    timeout = request.timeout_seconds or DEFAULT_TIMEOUT_SECONDS
    if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise GRPCError(Status.INVALID_ARGUMENT, f"timeout_seconds must be in (0, {MAX_TIMEOUT_SECONDS:g}]")
    return timeout


def _command(request: ExecuteRequest) -> str:
    if not request.command or "\x00" in request.command:
        raise GRPCError(Status.INVALID_ARGUMENT, "command is required and must not contain NUL bytes")
    try:
        check_command_size(request.command)
    except TooLarge as exc:
        raise GRPCError(Status.RESOURCE_EXHAUSTED, exc.message) from None
    return request.command


class RuntimeService:
    def __init__(self, root: Path, sandbox_id: str, max_output_bytes: int) -> None:
        self.root = root
        self.sandbox_id = sandbox_id
        self.max_output_bytes = max_output_bytes

    async def health(self, stream: Stream[HealthRequest, HealthReply]) -> None:
        await stream.recv_message()
        await stream.send_message(HealthReply("ok", self.sandbox_id))

    async def execute(self, stream: Stream[ExecuteRequest, ExecuteReply]) -> None:
        request = await stream.recv_message()
        assert request is not None
        result = await run_command(_command(request), cwd=self.root, timeout=_timeout(request),
                                   max_output_bytes=self.max_output_bytes)
        await stream.send_message(ExecuteReply(result.stdout, result.stderr, result.exit_code))

    async def execute_stream(self, stream: Stream[ExecuteRequest, Output]) -> None:
        request = await stream.recv_message()
        assert request is not None
        command, timeout = _command(request), _timeout(request)
        transport, proc, exited = await spawn_shell(command, self.root)
        assert proc.stdout is not None and proc.stderr is not None
        chunks: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue(maxsize=16)  # a slow client pauses the pipes

        async def read(name: str, pipe: asyncio.StreamReader) -> None:
            while data := await pipe.read(_READ_BYTES):
                await chunks.put((name, data))
            await chunks.put((name, b""))

        async def end_after_exit() -> None:
            """The shell has exited; a background job may hold the pipes as long as it runs: end anyway."""
            await exited.wait()
            await asyncio.wait(readers, timeout=AFTER_EXIT_READ_SECONDS)
            await chunks.put(("", b""))

        readers = [asyncio.create_task(read("stdout", proc.stdout)), asyncio.create_task(read("stderr", proc.stderr))]
        stopper = asyncio.create_task(end_after_exit())
        timed_out = False
        try:
            async with asyncio.timeout(timeout):
                open_pipes = 2
                while open_pipes:
                    name, data = await chunks.get()
                    if not name:
                        break
                    if not data:
                        open_pipes -= 1
                    elif name == "stdout":
                        await stream.send_message(Output(stdout=data))
                    else:
                        await stream.send_message(Output(stderr=data))
                await exited.wait()
        except TimeoutError:
            timed_out = True
        finally:
            if not exited.is_set():
                _kill_group(proc)
            for task in (*readers, stopper):
                task.cancel()
            await asyncio.gather(*readers, stopper, return_exceptions=True)
            await exited.wait()
            transport.close()
        code = proc.returncode
        assert code is not None
        await stream.send_message(Output(exit_code=TIMEOUT_EXIT_CODE if timed_out else code if code >= 0 else 128 - code))

    def __mapping__(self) -> dict[str, Handler]:
        unary, server_stream = Cardinality.UNARY_UNARY, Cardinality.UNARY_STREAM
        return {
            SERVICE + "Health": Handler(self.health, unary, HealthRequest, HealthReply),
            SERVICE + "Execute": Handler(self.execute, unary, ExecuteRequest, ExecuteReply),
            SERVICE + "ExecuteStream": Handler(self.execute_stream, server_stream, ExecuteRequest, Output),
        }


def create_server(root: Path, sandbox_id: str, max_output_bytes: int) -> Server:
    return Server([RuntimeService(root, sandbox_id, max_output_bytes)], codec=MessageCodec())

