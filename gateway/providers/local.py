"""One OS process per sandbox, running the reference runtime, confined (gateway/providers/confine.py).

State lives on disk under ``<data_dir>/sandboxes/<sandbox_id>/`` (``root/`` is
the sandbox's working directory, ``state.json`` its pid, socket and owner), guarded by
an ``flock`` per sandbox. That makes the provider idempotent across processes:
any gateway worker or replica on this host can find, reach and delete a
sandbox that another one started, and a sandbox outlives the worker that
started it (it runs in its own session, so a worker's death does not take its
sandboxes with it).

The gateway reaches a runtime over a Unix socket in ``<data_dir>/run/`` (or
under ``/run`` when that path is too long for a socket; a directory only the
gateway's user can enter): the gateway binds and listens on
it, and the runtime inherits the listening descriptor. A confined sandbox has
its own network namespace, so the socket is the only way in, and only the
gateway can use it; the sandbox never sees its path.

A pool with ``network: outbound`` gets a slirp4netns helper per sandbox (gateway/providers/
outbound.py), attached before the runtime starts and recorded in ``state.json``; it exits
with its sandbox, and a delete waits for it.

Suspend stops a sandbox's process (and its network helper) and keeps its
directory and registry; resume is ``ensure``, which starts a registry entry whose
process is gone again, in the same ``root/``: files survive, the socket is new.

Deaths are noticed without polling: each sandbox process is watched through a
pidfd, which becomes readable when the process exits, whoever started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from gateway.errors import CapacityExceeded, InsufficientStorage, ProvisionFailed, ProvisionTimeout
from gateway.model import Endpoint, ManagedSandbox, Owner, SandboxRequest
from gateway.providers import outbound
from gateway.providers._exits import exit_or_kill
from gateway.providers._locks import FileLock
from gateway.providers._pipes import read_until
from gateway.providers._spawn import spawn
from gateway.providers.base import ForeignSandbox, LostHandler, ManagedPage, Probe
from gateway.providers.confine import GRPC_FD, LISTEN_FD, Bubblewrap, Launch
from gateway.runtime.config import LISTEN_BACKLOG

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 5.0
#: How long a running runtime that does not answer its health check is waited for before it is replaced.
SLOW_START_GRACE = 10.0
#: sun_path holds 108 bytes with its NUL.
MAX_SOCKET_PATH = 107


class Confinement(Protocol):
    """How a sandbox is launched: bubblewrap (confine.Bubblewrap), or not at all (confine.Unconfined)."""

    confined: bool

    def check(self) -> None:
        """Raise ``RuntimeError`` saying why sandboxes cannot be confined here."""
    def check_outbound(self) -> None:
        """Raise ``RuntimeError`` saying why sandboxes cannot have outbound network here."""
    def prepare(self, box: Path, sandbox_id: str, network: str = "none") -> Launch: ...
    def release(self, cgroups: list[str]) -> None: ...
    def describe(self) -> str: ...


def _alive(pid: int, sandbox_id: str) -> bool:
    """True when ``pid`` runs and is this sandbox's runtime (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return sandbox_id.encode() in f.read()
    except OSError:
        return False


def _pidfd(pid: int, sandbox_id: str) -> int | None:
    """A pidfd for this sandbox's runtime, or None when ``pid`` is not (or no longer) it.

    Opened first, checked second: a check before the open could pass for the runtime and the
    open then name whatever process took its PID meanwhile (which ``_reap`` would then reap).
    With the pidfd open, the PID cannot be reused, so the check is about the process it names."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    if _alive(pid, sandbox_id):
        return fd
    os.close(fd)
    return None


class LocalProvider:
    def __init__(self, data_dir: Path, *, stop_on_close: bool, confinement: Confinement | None = None,
                 networks: Mapping[str, str] | None = None, policy_source: str = "the policy",
                 max_sandboxes: int | None = None, min_free_bytes: int = 0) -> None:
        """``networks``: each pool's ``network`` (``none`` when absent), read once like every pool's provider options.
        ``max_sandboxes``: how many may run at once on this host (None: no cap); ``min_free_bytes``: the free
        space the data dir's filesystem keeps, below which no new sandbox starts."""
        data_dir = data_dir.absolute()
        self._dir = data_dir / "sandboxes"
        self._run = _socket_dir(data_dir)  # where the gateway binds each runtime's socket
        self._confinement = confinement if confinement is not None else Bubblewrap(data_dir)
        self._stop_on_close = stop_on_close
        self._networks = dict(networks or {})
        self._policy_source = policy_source
        self._on_lost: LostHandler = lambda _sandbox_id: None
        self._watched: dict[str, tuple[int, int]] = {}  # sandbox_id -> (pidfd, pid)
        self._deleting: set[str] = set()
        self._max_sandboxes = max_sandboxes
        self._min_free = min_free_bytes
        self._starting: set[str] = set()  # sandboxes being started by this process (not yet in the registry)

    @property
    def confined(self) -> bool:
        return self._confinement.confined

    async def start(self, on_lost: LostHandler) -> None:
        """Refuses (``RuntimeError``) when sandboxes cannot be confined or their sockets cannot be named."""
        await asyncio.to_thread(self._confinement.check)
        check_networks(self._confinement, self._networks, self._policy_source)
        if self._run is None:
            raise RuntimeError(f"the data dir {self._dir.parent} is too long for Unix socket paths "
                               f"({MAX_SOCKET_PATH} bytes) and there is no /run to use instead: "
                               "choose a shorter --data-dir")
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        self._run.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self._run.stat().st_uid != os.geteuid():
            raise RuntimeError(f"{self._run} belongs to another user: the gateway's sockets must be its own")
        self._run.chmod(0o700)
        self._on_lost = on_lost
        for sandbox_id, state in self._states():
            if _alive(state["pid"], sandbox_id):
                self._watch(sandbox_id, state["pid"])

    async def ensure(self, request: SandboxRequest) -> Endpoint:
        try:
            return await asyncio.wait_for(self._ensure(request), request.timeout)
        except TimeoutError:
            raise ProvisionTimeout(
                f"local sandbox {request.sandbox_id} was not ready within {request.timeout:g}s",
                sandbox_id=request.sandbox_id,
            ) from None

    async def _ensure(self, request: SandboxRequest) -> Endpoint:
        box = self._dir / request.sandbox_id
        async with FileLock(box / "lock"):
            state = _read_state(box)
            _check_owner(request, state)
            if state is not None and await self._running(state, request.sandbox_id):
                self._watch(request.sandbox_id, state["pid"])
                return _endpoint(request.sandbox_id, state["socket"])
            if state is not None:
                await self._replace(state, request.sandbox_id)
            self._check_room(request.sandbox_id, new=state is None)
            self._starting.add(request.sandbox_id)  # counted from here: concurrent starts cannot all pass the cap
            try:
                network = self._networks.get(request.pool, "none")
                try:
                    launch = await asyncio.to_thread(self._confinement.prepare, box, request.sandbox_id, network)
                except OSError as exc:
                    if exc.errno == errno.ENOSPC:
                        raise self._no_space(request.sandbox_id, "the disk is full") from None
                    raise ProvisionFailed(f"local sandbox {request.sandbox_id} could not be prepared: {exc}",
                                          sandbox_id=request.sandbox_id) from None
                except RuntimeError as exc:
                    raise ProvisionFailed(f"local sandbox {request.sandbox_id} could not be prepared: {exc}",
                                          sandbox_id=request.sandbox_id) from None
                pid, path, helper = await self._spawn(request, box, launch)
                # A restart (a resume, a re-creation) keeps the sandbox's creation time: the orphan sweep's grace.
                created_at = float(state.get("created_at", time.time())) if state is not None else time.time()
                _write_state(box, {"pid": pid, "socket": path, "cgroups": launch.cgroups, "pool": request.pool,
                                   "created_at": created_at, "owner": request.owner.compact(), "helper": helper})
            finally:
                self._starting.discard(request.sandbox_id)
        if not await self._answers(path, pid, request.sandbox_id):
            raise ProvisionFailed(f"local sandbox {request.sandbox_id} exited before answering its health check "
                                  f"(see {box / 'runtime.log'})", sandbox_id=request.sandbox_id)
        self._watch(request.sandbox_id, pid, spawned=True)
        return _endpoint(request.sandbox_id, path)

    async def _running(self, state: dict[str, Any], sandbox_id: str) -> bool:
        """True when the registry's runtime answers, given ``SLOW_START_GRACE`` while it runs: one that
        does not answer at once is most often one another replica just started (a wake it lost the
        lease of) on a host too busy to answer in time. One sandbox, one runtime: never replaced then."""
        if not _alive(state["pid"], sandbox_id):
            return False
        if await self._healthy(state["socket"]):
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SLOW_START_GRACE):
                return await self._answers(state["socket"], state["pid"], sandbox_id)
        return False

    async def _replace(self, state: dict[str, Any], sandbox_id: str) -> None:
        """Stop the registry's runtime (dead, or not answering) until it exits, before another starts
        (never two of one sandbox); a deliberate stop, not a death to report."""
        self._deleting.add(sandbox_id)
        try:
            await self._stop(state, sandbox_id)
        finally:
            self._unwatch(sandbox_id)
            self._deleting.discard(sandbox_id)

    def _check_room(self, sandbox_id: str, *, new: bool) -> None:
        """A sandbox that starts (created, woken or restarted) needs a place under the host's cap (suspended
        ones, which run nothing, take none), and a new one the disk's floor free: refused with the setting to
        change, never as a failed provisioning. Starts under way in this process count (``_starting``);
        another worker's count once its registry entry is written."""
        if new:
            free = shutil.disk_usage(self._dir).free
            if free < self._min_free:
                raise self._no_space(sandbox_id, f"{free // 1024**2} MiB free")
        if self._max_sandboxes is not None:
            live = {other for other, state in self._states() if _alive(state["pid"], other)}
            running = len((live | self._starting) - {sandbox_id})
            if running >= self._max_sandboxes:
                raise CapacityExceeded(
                    f"this host runs {running} local sandboxes, its cap (local_max_sandboxes, "
                    f"SANDBOX_GATEWAY_LOCAL_MAX_SANDBOXES: {self._max_sandboxes}); retry when one ends",
                    scope="local_sandboxes")

    def _no_space(self, sandbox_id: str, what: str) -> InsufficientStorage:
        return InsufficientStorage(
            f"no new local sandbox: the data dir {self._dir.parent} is below its free-space floor ({what}; "
            f"local_min_free_bytes, SANDBOX_GATEWAY_LOCAL_MIN_FREE_BYTES: {self._min_free}); free space or "
            "delete sandboxes", sandbox_id=sandbox_id)

    async def _answers(self, path: str, pid: int, sandbox_id: str) -> bool:
        """Health-check a runtime that just said LISTENING until it answers (True) or exits (False).

        Retried: fifty runtimes starting at once on two cores can take longer than one check's
        timeout to answer. ``ensure``'s provisioning timeout bounds the whole wait.
        """
        delay = 0.05
        while not await self._healthy(path):
            if not _alive(pid, sandbox_id):
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
        return True

    async def _spawn(self, request: SandboxRequest, box: Path, launch: Launch) -> tuple[int, str, list[int] | None]:
        """Bind the sandbox's socket, start the runtime on it in its own session, attach its
        outbound network when it has one, wait for its LISTENING line. Returns the pid, the
        socket and the network helper's identity (``outbound.identify``).

        ``posix_spawn`` rather than ``asyncio.create_subprocess_exec``: an asyncio
        transport kills its child when closed, and these children must outlive us.
        A fresh socket name per start: an endpoint that changed tells the data plane
        the sandbox was re-created (as a new port did).
        """
        assert self._run is not None  # start() refused otherwise
        path = str(self._run / f"{secrets.token_hex(8)}.sock")
        grpc_path = _endpoint(request.sandbox_id, path).grpc_unix
        assert grpc_path is not None
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        grpc_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        read_fd, write_fd = os.pipe()
        network = outbound.Attachment() if launch.outbound else None
        helper = None
        try:
            listener.bind(path)
            listener.listen(LISTEN_BACKLOG)
            grpc_listener.bind(grpc_path)
            grpc_listener.listen(LISTEN_BACKLOG)
            pid = await _spawned(launch.argv, [
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, write_fd, 1),
                (os.POSIX_SPAWN_OPEN, 2, str(box / "runtime.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                (os.POSIX_SPAWN_DUP2, listener.fileno(), LISTEN_FD),
                (os.POSIX_SPAWN_DUP2, grpc_listener.fileno(), GRPC_FD),
                *((os.POSIX_SPAWN_OPEN, fd, name, os.O_RDONLY, 0) for fd, name in launch.files),
                *(network.file_actions() if network is not None else ()),
            ])
        except OSError as exc:
            os.close(read_fd)
            _unlink(path)
            if network is not None:
                network.close()
            raise ProvisionFailed(f"local sandbox {request.sandbox_id} could not be started: {exc}",
                                  sandbox_id=request.sandbox_id) from None
        finally:
            os.close(write_fd)
            listener.close()  # the runtime holds it now: when it exits, connects are refused
            grpc_listener.close()
        failure = "failed to start"
        if network is not None:
            network.spawned()
            try:
                helper = await network.connect(box / "network.log")
            except RuntimeError as exc:
                failure = f"got no outbound network ({exc})"
            finally:
                network.close()  # a sandbox still blocked reads EOF: without tap0 its first step exits (125)
        line, _, _ = (await read_until(read_fd, lambda data: b"\n" in data)).partition(b"\n")
        parts = line.decode(errors="replace").split()
        if len(parts) != 3 or parts[0] != "LISTENING":
            await _stop(pid, request.sandbox_id)
            await asyncio.to_thread(self._confinement.release, launch.cgroups)
            _unlink(path)
            await _stop_helper({"helper": helper})
            raise ProvisionFailed(f"local sandbox {request.sandbox_id} {failure} (see {box / 'runtime.log'})",
                                  sandbox_id=request.sandbox_id)
        return pid, path, helper

    async def _healthy(self, path: str) -> bool:
        try:
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path),
                                             timeout=aiohttp.ClientTimeout(total=2.0)) as http, \
                    http.get("http://sandbox/") as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def delete(self, sandbox_id: str, pool: str) -> None:
        box = self._dir / sandbox_id
        if not box.exists():
            return
        self._deleting.add(sandbox_id)
        try:
            async with FileLock(box / "lock"):
                state = _read_state(box)
                if state is not None:
                    await self._stop(state, sandbox_id)
                await asyncio.to_thread(shutil.rmtree, box, True)
        finally:
            self._unwatch(sandbox_id)
            self._deleting.discard(sandbox_id)

    async def suspend(self, sandbox_id: str, pool: str) -> None:
        """Stop the sandbox's process and network helper; its directory and registry entry stay."""
        box = self._dir / sandbox_id
        if not box.exists():
            return
        self._deleting.add(sandbox_id)  # a deliberate stop: not a death to report
        try:
            async with FileLock(box / "lock"):
                state = _read_state(box)
                if state is not None:
                    await self._stop(state, sandbox_id)
        finally:
            self._unwatch(sandbox_id)
            self._deleting.discard(sandbox_id)

    async def resume(self, request: SandboxRequest) -> Endpoint:
        return await self.ensure(request)  # starts the stopped runtime again in its own directory

    def can_suspend(self, pool: str) -> bool:
        return True

    async def list_managed(self) -> list[ManagedSandbox]:
        return [ManagedSandbox(sid, s.get("pool", ""), float(s.get("created_at", 0.0))) for sid, s in self._states()]

    async def managed_page(self, cursor: str | None, limit: int) -> ManagedPage:
        """Sandbox directories in name order after ``cursor``; only the page's registries are read."""
        try:
            names = sorted(n for n in os.listdir(self._dir) if cursor is None or n > cursor)
        except FileNotFoundError:
            names = []
        items = []
        for name in names[:limit]:
            state = _read_state(self._dir / name)
            if state is not None:
                items.append(ManagedSandbox(name, state.get("pool", ""), float(state.get("created_at", 0.0))))
        return ManagedPage(items, names[limit - 1] if len(names) > limit else None)

    async def probe(self, sandbox_id: str, pool: str) -> Probe:
        """GONE when the registry has no live runtime for the sandbox (whoever started it), ALIVE
        when it answers its health check, UNKNOWN when it runs but does not answer (busy, starting)."""
        state = _read_state(self._dir / sandbox_id)
        if state is None or not _alive(state["pid"], sandbox_id):
            return Probe.GONE
        return Probe.ALIVE if await self._healthy(state["socket"]) else Probe.UNKNOWN

    async def close(self) -> None:
        if self._stop_on_close:
            # A memory store forgets every binding at exit; sandboxes nobody can reach again are stopped.
            for sandbox_id, state in self._states():
                self._deleting.add(sandbox_id)
                await self._stop(state, sandbox_id)
                await asyncio.to_thread(shutil.rmtree, self._dir / sandbox_id, True)
        for sandbox_id in list(self._watched):
            self._unwatch(sandbox_id)

    def describe(self) -> str:
        return f"local processes under {self._dir}, {self._confinement.describe()}"

    async def _stop(self, state: dict[str, Any], sandbox_id: str) -> None:
        await _stop(state["pid"], sandbox_id)
        await asyncio.to_thread(self._confinement.release, state.get("cgroups", []))
        _unlink(state["socket"])
        await _stop_helper(state)

    # death notification ----------------------------------------------------
    def _watch(self, sandbox_id: str, pid: int, *, spawned: bool = False) -> None:
        """Watch the runtime's exit. ``spawned``: this process just started it, so it is our child that
        nobody has reaped and its PID cannot have been reused (even if it already exited: the watch
        then fires at once and reaps it); any other PID comes from the registry and is checked."""
        if sandbox_id in self._watched:
            return
        if spawned:
            fd: int | None = os.pidfd_open(pid)
        else:
            fd = _pidfd(pid, sandbox_id)
        if fd is None:
            self._on_lost(sandbox_id)
            return
        self._watched[sandbox_id] = (fd, pid)
        asyncio.get_running_loop().add_reader(fd, self._exited, sandbox_id)

    def _unwatch(self, sandbox_id: str) -> None:
        watched = self._watched.pop(sandbox_id, None)
        if watched is not None:
            fd, pid = watched
            asyncio.get_running_loop().remove_reader(fd)
            _reap(fd)
            os.close(fd)

    def _exited(self, sandbox_id: str) -> None:
        pid = self._watched[sandbox_id][1]
        self._unwatch(sandbox_id)
        if sandbox_id in self._deleting:
            return
        state = _read_state(self._dir / sandbox_id)
        if state is not None and state["pid"] != pid:
            # Another replica stopped this runtime (a suspend) and has started the sandbox again
            # since: the event arrived late, and reporting it would release the new runtime.
            return
        log.warning("local sandbox %s exited; it will be re-created on its next request", sandbox_id)
        self._on_lost(sandbox_id)

    def _states(self) -> list[tuple[str, dict[str, Any]]]:
        found = []
        if self._dir.exists():
            for box in sorted(self._dir.iterdir()):
                state = _read_state(box)
                if state is not None:
                    found.append((box.name, state))
        return found


def check_networks(confinement: Confinement, networks: Mapping[str, str], policy_source: str) -> None:
    """Refuse (``RuntimeError`` naming the pool, the field and the file) a pool that asks for
    outbound network where ``confinement`` cannot give it."""
    online = sorted(pool for pool, network in networks.items() if network == "outbound")
    if not online:
        return
    try:
        confinement.check_outbound()
    except RuntimeError as exc:
        raise RuntimeError(f"{policy_source}: pools.{online[0]}.local.network: 'outbound' cannot be given here: "
                           f"{exc}; set network: none or fix the host") from None


# ownership ------------------------------------------------------------------
def _check_owner(request: SandboxRequest, state: dict[str, Any] | None) -> None:
    """Refuse another identity's registry entry, live or not: its ``root/`` holds that owner's files.

    Entries of versions that kept no owner are claimed only on evidence (``SandboxRequest.may_claim``).
    """
    if state is None:
        return
    recorded = Owner.from_compact(state.get("owner"))
    if not request.may_claim(recorded, float(state.get("created_at", 0.0))):
        raise ForeignSandbox(request.sandbox_id)


def _read_state(box: Path) -> dict[str, Any] | None:
    try:
        state = json.loads((box / "state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and "pid" in state and "socket" in state else None


def _write_state(box: Path, state: dict[str, Any]) -> None:
    tmp = box / "state.json.tmp"
    tmp.write_text(json.dumps(state))
    tmp.replace(box / "state.json")  # atomic: readers never see half a file


# The runtime's environment: nothing of the gateway's (REDIS_URL and the like may carry secrets).
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


async def _spawned(argv: list[str], file_actions: list[tuple[Any, ...]]) -> int:
    """The runtime started in its own session, off the loop (``_spawn``); a caller cancelled meanwhile
    waits for the spawn (its thread still uses the descriptors the caller closes) and stops the child."""
    spawning = asyncio.ensure_future(spawn(argv[0], argv, _ENV, file_actions))
    try:
        return await asyncio.shield(spawning)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):
            pid = await spawning
            _killpg(pid)  # its whole session: what it started in the meantime too
            await asyncio.to_thread(os.waitpid, pid, 0)
        raise


def _socket_dir(data_dir: Path) -> Path | None:
    """Where runtimes' sockets go: ``<data_dir>/run``, or, when that path is too long for a
    socket's name (108 bytes), a directory named after the data dir in the user's runtime
    directory (``/run`` for root, else ``/run/user/<uid>``). None when neither fits."""
    name_length = len("/0123456789abcdef.sock")
    own = data_dir / "run"
    if len(str(own).encode()) + name_length <= MAX_SOCKET_PATH:
        return own
    uid = os.geteuid()
    base = Path("/run") if uid == 0 else Path(f"/run/user/{uid}")
    short = base / "sandbox-gateway" / hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    if base.is_dir() and len(str(short).encode()) + name_length <= MAX_SOCKET_PATH:
        return short
    return None


def _endpoint(sandbox_id: str, path: str) -> Endpoint:
    # host names the sandbox (the data plane pools connections per host and port), port 80 for the Host header.
    return Endpoint(sandbox_id, 80, unix=path)


def _unlink(path: str) -> None:
    """Remove a runtime's socket and the gRPC socket beside it."""
    for name in (path, _endpoint("", path).grpc_unix):
        with contextlib.suppress(OSError):
            os.unlink(name)  # type: ignore[arg-type]


def _reap(pidfd: int) -> None:
    """Collect the exit status of our own exited child (no-op for another process's, or one
    still running). Through its pidfd, never its PID: the PID may already be reaped and
    recycled (pid_max is 32768 in many containers), and ``waitpid`` on it would steal the
    exit status of an unrelated child, such as one asyncio is waiting for."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitid(os.P_PIDFD, pidfd, os.WEXITED | os.WNOHANG)


async def _stop_helper(state: dict[str, Any]) -> None:
    """The sandbox's network helper, if it had one: gone once this returns (it exits with its sandbox)."""
    helper = state.get("helper")
    if isinstance(helper, list) and len(helper) == 2 and all(isinstance(n, int) for n in helper):
        await outbound.stop_helper(helper)


async def _stop(pid: int, sandbox_id: str) -> None:
    """SIGTERM the sandbox's process group, SIGKILL it after a grace period; wait on a pidfd."""
    fd = _pidfd(pid, sandbox_id)
    if fd is None:
        return
    try:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        await exit_or_kill(fd, STOP_GRACE_SECONDS, lambda: _killpg(pid))
    finally:
        _reap(fd)
        os.close(fd)


def _killpg(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
