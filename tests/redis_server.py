"""A real ``redis-server`` for tests and benchmarks: free port, temp dir, optional persistence.

Fixtures (import them into ``conftest.py``)::

    redis_process          session-scoped: one server for the whole run
    redis_server           function-scoped: that server, flushed before the test
    redis_server_factory   function-scoped: ``factory(appendonly=True)`` starts a private
                           server (for tests that stop or restart it), stopped after the test

All of them skip the test when ``redis-server`` is not installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import pytest
import redis

REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")


def redis_server_path() -> str | None:
    return shutil.which(REDIS_SERVER) or (REDIS_SERVER if os.path.isfile(REDIS_SERVER) else None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One ``redis-server`` process; keeps its port and data directory across restarts."""

    def __init__(self, *, appendonly: bool = False, replicaof: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        executable = redis_server_path()
        if executable is None:
            raise FileNotFoundError(f"{REDIS_SERVER} is not installed")
        self.executable = executable
        self.appendonly = appendonly
        self.replicaof = replicaof  # the port of the primary this server replicates
        self.extra = extra  # further redis-server options, as "--name", "value" pairs
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="redis-test-"))
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's process ID while it runs (a benchmark measures its CPU)."""
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    LOG = "redis.log"

    def command(self) -> list[str]:
        return [
            self.executable, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory),
            "--daemonize", "no", "--save", "", "--logfile", str(self.directory / self.LOG),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",  # a test that kills the server must still find what it wrote
            # a replica syncs at once, from memory, with no RDB file between
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
            *(("--replicaof", "127.0.0.1", str(self.replicaof)) if self.replicaof is not None else ()),
            *self.extra,
        ]

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers PING (and has loaded its data)."""
        if self.running:
            return
        self._process = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                self._process = None
                log = (self.directory / self.LOG).read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{type(self).__name__} exited during start on port {self.port}:\n{log}")
            try:
                with redis.Redis(port=self.port, socket_timeout=1.0) as client:
                    client.ping()  # raises BusyLoadingError while the AOF is being loaded
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.stop(kill=True)
                    raise RuntimeError(f"{type(self).__name__} on port {self.port} did not answer within {timeout}s"
                                       ) from None
                time.sleep(0.01)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (flushes the AOF), or SIGKILL with ``kill=True`` (a crash)."""
        process, self._process = self._process, None
        if process is None:
            return
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def pause(self) -> None:
        """SIGSTOP: the server keeps its connections but answers nothing (a hung node)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def flush(self) -> None:
        with redis.Redis(port=self.port, socket_timeout=2.0) as client:
            client.flushall()

    def info_memory(self) -> int:
        with redis.Redis(port=self.port, socket_timeout=5.0) as client:
            return int(client.info("memory")["used_memory"])

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _require_redis() -> None:
    if redis_server_path() is None:
        pytest.skip(f"{REDIS_SERVER} is not installed")


@pytest.fixture(scope="session")
def redis_process() -> Iterator[RedisServer]:
    _require_redis()
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_server(redis_process: RedisServer) -> RedisServer:
    if not redis_process.running:  # a test stopped it: bring it back for the next one
        redis_process.start()
    redis_process.flush()
    return redis_process


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    _require_redis()
    servers: list[RedisServer] = []

    def factory(*, appendonly: bool = False) -> RedisServer:
        server = RedisServer(appendonly=appendonly)
        servers.append(server)
        server.start()
        return server

    yield factory
    for server in servers:
        server.close()


class SentinelServer(RedisServer):
    """``redis-server --sentinel`` watching one primary as ``service`` (quorum 2), with timings short
    enough for a test: the primary is down after ``down_after_ms`` without an answer."""

    def __init__(self, primary_port: int, service: str = "sgw", *, down_after_ms: int = 500) -> None:
        super().__init__()
        self.primary_port = primary_port
        self.service = service
        self.down_after_ms = down_after_ms

    LOG = "sentinel.log"

    def command(self) -> list[str]:
        config = self.directory / "sentinel.conf"  # sentinel rewrites its config: a file of its own
        if not config.exists():
            config.write_text("\n".join([
                f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.directory}",
                f"logfile {self.directory / self.LOG}",
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2",
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
                f"sentinel failover-timeout {self.service} 5000",
                f"sentinel parallel-syncs {self.service} 1", ""]))
        return [self.executable, str(config), "--sentinel"]

    def primary(self) -> int | None:
        """The port of the primary this sentinel reports now (None while it knows none)."""
        with redis.Redis(port=self.port, socket_timeout=2.0, decode_responses=True) as client:
            address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return None if address is None else int(address[1])


class SentinelGroup:
    """A primary, one replica of it and three sentinels, on loopback ports from the kernel."""

    def __init__(self, service: str = "sgw", *, primary_options: tuple[str, ...] = ()) -> None:
        self.service = service
        self.primary = RedisServer(appendonly=True, extra=primary_options)
        self.primary.start()
        self.replica = RedisServer(appendonly=True, replicaof=self.primary.port)
        self.sentinels: list[SentinelServer] = []
        try:
            self.replica.start()
            self.wait_replicated(self.primary)
            self.sentinels = [SentinelServer(self.primary.port, service) for _ in range(3)]
            for sentinel in self.sentinels:
                sentinel.start()
            self.wait_sentinels_ready()
        except BaseException:
            self.close()
            raise

    def wait_sentinels_ready(self, timeout: float = 30.0) -> None:
        """Until every sentinel knows the replica (up) and the other two sentinels: before that a
        failover finds no replica to promote, or no quorum."""
        deadline = time.monotonic() + timeout
        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, socket_timeout=2.0, decode_responses=True) as client:
                while True:
                    replicas = client.sentinel_slaves(self.service)
                    peers = client.sentinel_sentinels(self.service)
                    if len(peers) >= 2 and any(not (r["is_sdown"] or r["is_disconnected"]) and
                                               r.get("master-link-status") == "ok" for r in replicas):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sentinel {sentinel.port} knows {replicas} and {len(peers)} peers")
                    time.sleep(0.05)

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/{db}"

    @staticmethod
    def wait_replicated(primary: RedisServer, replicas: int = 1, timeout: float = 20.0) -> None:
        """Wait until ``primary`` has ``replicas`` replicas online (WAIT acknowledges)."""
        deadline = time.monotonic() + timeout
        with redis.Redis(port=primary.port, socket_timeout=5.0) as client:
            while int(client.execute_command("WAIT", replicas, 200)) < replicas:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the primary on port {primary.port} has no replica after {timeout}s")

    def close(self) -> None:
        for server in [*self.sentinels, self.replica, self.primary]:
            server.close()


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    _require_redis()
    group = SentinelGroup()
    yield group
    group.close()
