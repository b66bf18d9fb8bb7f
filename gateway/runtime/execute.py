"""``POST /execute``: run one shell command in the sandbox root.

The command runs as ``/bin/sh -c <command>`` in its own session (so its own
process group): a timeout or an abandoned request kills the whole group, not
just the shell. The answer comes when the shell exits: a job it left in the
background (``server &``) keeps running but does not hold the call, even while
it keeps the output pipes open.

Exit codes follow the shell's conventions: 124 for a timeout (as
``timeout(1)``), 128+N for a command killed by signal N.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .config import CONFIG
from .errors import BadRequest, TooLarge

#: Used when the request gives no ``timeout_seconds``: long enough for builds
#: and test runs, short enough that a forgotten process does not live forever.
DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 24 * 3600.0
TIMEOUT_EXIT_CODE = 124
_READ_BYTES = 64 * 1024
#: How long output is still read once the shell has exited: what it wrote is already in the pipes
#: (read at once, then EOF); only a background job that holds them open makes the call wait this long.
AFTER_EXIT_READ_SECONDS = 0.5
#: The command is one argument of ``sh -c``; the kernel refuses a longer one (MAX_ARG_STRLEN, 32
#: pages with its NUL) with E2BIG, so a longer command is refused up front with a clear error.
MAX_COMMAND_BYTES = 32 * 4096 - 1


@dataclass
class _Capture:
    """Output of one stream: the first ``limit`` bytes and how many were dropped.

    Filled in place by :func:`_drain`, so whatever arrived before a timeout
    is still here after the reader is cancelled.
    """

    limit: int
    data: bytearray = field(default_factory=bytearray)
    dropped: int = 0

    def text(self, name: str) -> str:
        out = self.data.decode("utf-8", errors="replace")
        if self.dropped:
            out += f"\n[sandbox-runtime: {name} truncated after {self.limit} bytes; {self.dropped} bytes dropped]\n"
        return out


@dataclass(frozen=True)
class ExecResult:
    """What ``/execute`` returns, already in its wire shape."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool = False  # killed for passing timeout_seconds (the agent-sandbox SDK reads it)

    def as_json(self) -> dict[str, Any]:
        return {"stdout": self.stdout, "stderr": self.stderr, "exit_code": self.exit_code,
                "timed_out": self.timed_out}


async def _drain(stream: asyncio.StreamReader, capture: _Capture) -> None:
    """Read ``stream`` to EOF, keeping at most ``capture.limit`` bytes.

    Reading continues past the limit (discarding) so a chatty command never
    blocks on a full pipe.
    """
    while chunk := await stream.read(_READ_BYTES):
        room = capture.limit - len(capture.data)
        if room > 0:
            capture.data += chunk[:room]
        capture.dropped += max(0, len(chunk) - max(room, 0))


class _ShellProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """Also says when the shell itself has exited: ``Process.wait()`` waits for the output pipes to
    close as well, and a job the command left in the background holds them open as long as it runs."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


async def spawn_shell(
    command: str, cwd: Path
) -> tuple[asyncio.SubprocessTransport, asyncio.subprocess.Process, asyncio.Event]:
    """``/bin/sh -c command`` in its own session, stdin from /dev/null, stdout and stderr piped; with
    its transport (``close()`` it once done: it releases the pipes) and an event set when the shell exits."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ShellProtocol(loop), "/bin/sh", "-c", command, cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    return transport, asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's process group; it may already be gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def run_command(command: str, *, cwd: Path, timeout: float, max_output_bytes: int) -> ExecResult:
    """Run ``command`` under ``/bin/sh -c`` and collect its output.

    On timeout the process group is killed and exit code 124 is returned
    with whatever output arrived. If the caller is cancelled (the client went
    away, the server is stopping) the group is killed before re-raising, so
    no command outlives its request.

    Output is read until both pipes close or, once the shell has exited, for
    at most ``AFTER_EXIT_READ_SECONDS`` more: a background job that keeps the
    command's stdout open (``server &``) keeps running, but what it writes
    after that is lost (and it may get SIGPIPE): redirect its output to a file.
    """
    transport, proc, exited = await spawn_shell(command, cwd)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Capture(max_output_bytes), _Capture(max_output_bytes)
    readers = [asyncio.create_task(_drain(proc.stdout, out)), asyncio.create_task(_drain(proc.stderr, err))]
    timed_out = False
    try:
        async with asyncio.timeout(timeout):
            await exited.wait()
        await asyncio.wait(readers, timeout=AFTER_EXIT_READ_SECONDS)
    except TimeoutError:
        timed_out = True
    finally:
        if not exited.is_set():
            _kill_group(proc)
        # A background job or a grandchild that left the group may still hold the pipes open;
        # we have what we need, so stop reading rather than wait for EOF.
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await exited.wait()  # the shell is reaped; prompt after SIGKILL
        transport.close()  # our ends of the pipes (the shell has exited: nothing is killed)
    stdout, stderr = out.text("stdout"), err.text("stderr")
    if timed_out:
        note = f"\n[sandbox-runtime: command timed out after {timeout:g}s and was killed]\n"
        return ExecResult(stdout, stderr + note, TIMEOUT_EXIT_CODE, timed_out=True)
    returncode = proc.returncode
    assert returncode is not None
    return ExecResult(stdout, stderr, returncode if returncode >= 0 else 128 - returncode)


def check_command_size(command: str) -> None:
    """Refuse a command the kernel would refuse as an argument (``TooLarge``, 413 / RESOURCE_EXHAUSTED)."""
    size = len(command.encode("utf-8", "surrogatepass"))
    if size > MAX_COMMAND_BYTES:
        raise TooLarge(f"'command' is {size} bytes; one command may be at most {MAX_COMMAND_BYTES} (the kernel's "
                       "limit on one argument): /upload a script and run that instead", code="command_too_large")


def parse_execute_body(raw: bytes) -> tuple[str, float]:
    """Validate an ``/execute`` body into ``(command, timeout_seconds)``."""
    try:
        body = json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise BadRequest(f"body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest('body must be a JSON object like {"command": "ls"}', code="invalid_body")
    command = body.get("command")
    if not isinstance(command, str):
        raise BadRequest("'command' is required and must be a string", code="invalid_command")
    if "\x00" in command:
        raise BadRequest("'command' must not contain NUL bytes", code="invalid_command")
    check_command_size(command)
    timeout = body.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    if timeout is None:
        timeout = DEFAULT_TIMEOUT_SECONDS
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or not 0 < timeout <= MAX_TIMEOUT_SECONDS
    ):
        raise BadRequest(
            f"'timeout_seconds' must be a number in (0, {MAX_TIMEOUT_SECONDS:g}]", code="invalid_timeout"
        )
    return command, float(timeout)


async def handle_execute(request: web.Request) -> web.Response:
    """``POST /execute`` ``{"command", "timeout_seconds"?}`` -> ``{"stdout", "stderr", "exit_code", "timed_out"}``."""
    command, timeout = parse_execute_body(await request.read())
    config = request.app[CONFIG]
    result = await run_command(command, cwd=config.root, timeout=timeout, max_output_bytes=config.max_output_bytes)
    return web.json_response(result.as_json())
