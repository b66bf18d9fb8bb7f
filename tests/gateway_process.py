"""Run ``sandbox-gateway serve`` as a real subprocess and learn its ports from its log."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import sys
from pathlib import Path

_SERVING = re.compile(r"serving \(worker \d+, pid \d+\): data plane (http://\S+), control API (http://\S+)")
_GRPC = re.compile(r"gRPC front \(worker \d+\): (?:h2c|https)://(\S+)")


class GatewayProcess:
    def __init__(self, workdir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.args = ["serve", "--data-port", "0", "--control-port", "0", "--grpc-port", "0", "--log-format", "text", *args]
        self.env = {**os.environ, **(env or {})}
        self.proc: asyncio.subprocess.Process | None = None
        self.data_url = ""
        self.control_url = ""
        self.grpc_address = ""  # host:port of the gRPC front
        self.log: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self, timeout: float = 30.0) -> GatewayProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", *self.args, cwd=self.workdir, env=self.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        serving = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(serving))
        self.data_url, self.control_url = await asyncio.wait_for(serving, timeout)
        return self

    async def _read(self, serving: asyncio.Future[tuple[str, str]]) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.log.append(text)
            grpc = _GRPC.search(text)
            if grpc and not self.grpc_address:
                self.grpc_address = grpc.group(1)
            match = _SERVING.search(text)
            if match and not serving.done():
                serving.set_result((match.group(1), match.group(2)))
        if not serving.done():
            serving.set_exception(RuntimeError("gateway exited before serving:\n" + "\n".join(self.log[-30:])))

    async def exit_status(self, timeout: float = 30.0) -> int:
        """Run a gateway that is expected to refuse to start, to its exit; its exit status as its
        own parent saw it. The gateway runs under ``sh``, which reports the status on stderr:
        this test process can lose a child's status to whatever else reaps children in it
        (asyncio then reports 255, "Unknown child process"), a shell parent cannot."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", '"$@"; echo "exit status $?" >&2', "sh", sys.executable, "-m", "gateway.cli",
            *self.args, cwd=self.workdir, env=self.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        stderr = (await asyncio.wait_for(proc.communicate(), timeout))[1]
        *self.log, last = stderr.decode(errors="replace").rstrip().splitlines()
        assert last.startswith("exit status "), last
        assert _SERVING.search("\n".join(self.log)) is None, "the gateway served"
        return int(last.removeprefix("exit status "))

    async def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
        try:
            code = await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            tail = "\n".join(self.log[-20:])
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"the gateway did not exit within {timeout:g}s of signal {sig}; its log ends:\n{tail}") from None
        if self._reader is not None:
            await self._reader
        return code


def kill_sandbox(sandbox_id: str, leader: int, timeout: float = 10.0) -> None:
    """SIGKILL the sandbox's process group and wait until every process of it has exited (their
    pidfds turn readable), the runtime inside bubblewrap's PID namespace included: the leader (outer
    bubblewrap) can be gone while the runtime is still dying with its listening socket open, and
    a request then would be accepted and dropped instead of finding the sandbox unreachable."""
    pidfds = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and is_runtime_of(int(entry), sandbox_id):
            with contextlib.suppress(ProcessLookupError):  # gone already
                pidfds.append(os.pidfd_open(int(entry)))
    assert pidfds, f"no process of sandbox {sandbox_id}"
    try:
        os.killpg(leader, signal.SIGKILL)
        for fd in pidfds:
            assert select.select([fd], [], [], timeout)[0], f"a process of sandbox {sandbox_id} did not exit"
    finally:
        for fd in pidfds:
            os.close(fd)


def is_runtime_of(pid: int, sandbox_id: str) -> bool:
    """Process ``pid`` is part of sandbox ``sandbox_id`` (bubblewrap or the runtime it runs)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    return b"gateway.runtime" in argv and sandbox_id.encode() in argv
