"""Suspend when idle, wake on traffic, retention, and activity across replicas (issue #15.2-4).

Real parts throughout: real ``redis-server``, real local sandboxes (bubblewrap), in-process
gateways with their real data planes on one Redis as replicas. Times that a test cannot wait
for (idle timeouts of an hour, retention) come from an injected clock, at the router level.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import Gateway, build_providers
from gateway.errors import Conflict, NotFound, WakeTimeout
from gateway.metrics import Metrics
from gateway.model import SandboxState
from gateway.policy import load_policy, parse_policy
from gateway.providers.base import PoolProviders
from gateway.providers.confine import Bubblewrap
from gateway.providers.local import LocalProvider
from gateway.providers.static import StaticProvider
from gateway.sessions import RouterTuning, SessionRouter
from gateway.settings import Settings
from gateway.store.instrumented import InstrumentedStore
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from routing import Identity, PolicyError
from tests.clock import FakeClock
from tests.conftest import CountingProvider
from tests.proxy_helpers import listening_socket
from tests.redis_server import RedisServer

SUSPENDING = """
pools:
  small: {idle_timeout: 1h, on_idle: suspend, retention: 2h}
  shared: {idle_timeout: 1h, on_idle: suspend, retention: 2h, wake_timeout: %s}
"""
ALICE = {"X-Org-Id": "acme", "X-User-Id": "alice", "X-Session-Id": "s1"}
BOB = {"X-Org-Id": "acme", "X-User-Id": "bob", "X-Session-Id": "s2"}


@dataclasses.dataclass
class Fleet:
    """In-process gateways (replicas) on one Redis and one data dir, and a client for them."""

    tmp_path: Path
    redis: RedisServer
    http: aiohttp.ClientSession
    prefix: str = dataclasses.field(default_factory=lambda: f"sus-{uuid.uuid4().hex[:8]}")
    gateways: list[Gateway] = dataclasses.field(default_factory=list)

    @property
    def data_dir(self) -> Path:
        return (self.tmp_path / "data").absolute()

    async def replica(self, policy: str, *, reap_interval: float = 3600.0, heartbeat: tuple[float, float] = (5.0, 15.0),
                      long_request_after: float | None = None, activity_grace: float | None = None) -> Gateway:
        policy_file = self.tmp_path / "policy.yaml"
        policy_file.write_text(policy)
        name = f"r{len(self.gateways)}"
        # local_disk_quota_bytes=0: the tests read a suspended sandbox's files on the host, which a disk image
        # (gateway/providers/disk.py) would hold out of sight
        settings = Settings(data_dir=self.data_dir, redis_url=self.redis.url, redis_prefix=self.prefix,
                            local_disk_quota_bytes=0,
                            replica_id=name, policy_file=policy_file, reap_interval=reap_interval,
                            activity_flush_interval=0.1, access_log=False)
        loaded = load_policy(settings)
        metrics = Metrics()
        interval, ttl = heartbeat
        store = InstrumentedStore(RedisStore(self.redis.url, self.prefix, name, heartbeat_interval=interval,
                                             heartbeat_ttl=ttl), metrics)
        gateway = Gateway(settings, loaded, store, build_providers(settings, loaded), metrics)
        await gateway.start(listening_socket(), listening_socket())
        self.gateways.append(gateway)
        # The activity timings scaled down together, as their relation in the code requires
        # (activity_grace > long_request_after + the data plane's tick (0.5 s) + activity_flush_interval).
        if long_request_after is not None:
            gateway.data_plane.long_request_after = long_request_after
        if activity_grace is not None:
            gateway.lifecycle.tuning = dataclasses.replace(gateway.lifecycle.tuning, activity_grace=activity_grace)
        return gateway

    async def request(self, gateway: Gateway, method: str, path: str, headers: dict[str, str] = ALICE,
                      **kwargs: Any) -> tuple[int, dict[str, str], Any]:
        assert gateway.data_address is not None
        async with self.http.request(method, f"http://127.0.0.1:{gateway.data_address[1]}{path}", headers=headers,
                                     **kwargs) as response:
            body = await response.read()
            return response.status, dict(response.headers), json.loads(body) if body else None

    async def execute(self, gateway: Gateway, command: str, headers: dict[str, str] = ALICE) -> dict[str, Any]:
        status, _, body = await self.request(gateway, "POST", "/execute", headers, json={"command": command})
        assert status == 200, body
        return body

    async def control(self, gateway: Gateway, method: str, path: str) -> tuple[int, Any]:
        assert gateway.control_address is not None
        async with self.http.request(method, f"http://127.0.0.1:{gateway.control_address[1]}{path}") as response:
            return response.status, await response.json()

    async def sandbox_of(self, session_id: str = "s1") -> str:
        status, body = await self.control(self.gateways[0], "GET", f"/v1/sessions/{session_id}")
        assert status == 200, body
        return body["sandbox_id"]

    async def state(self, sandbox_id: str) -> SandboxState | None:
        record = await self.gateways[0].store.get_sandbox(sandbox_id)
        return None if record is None else record.state

    def runtime_pid(self, sandbox_id: str) -> int:
        return json.loads((self.data_dir / "sandboxes" / sandbox_id / "state.json").read_text())["pid"]

    def total(self, name: str, labels: dict[str, str]) -> float:
        return sum(g.metrics.registry.get_sample_value(name, labels) or 0.0 for g in self.gateways)


def running(pid: int, sandbox_id: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return sandbox_id.encode() in f.read()
    except OSError:
        return False


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll a real system for a state it reaches by itself (a background reaper or wake)."""
    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {timeout:g}s") from None


@pytest.fixture
async def fleet(tmp_path: Path, redis_server: RedisServer) -> AsyncIterator[Fleet]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        made = Fleet(tmp_path, redis_server, http)
        try:
            yield made
        finally:
            for gateway in made.gateways:
                await gateway.stop()
            # Sandboxes outlive a Redis-backed gateway by design: this provider stops and removes them.
            cleanup = LocalProvider(made.data_dir, stop_on_close=True, confinement=Bubblewrap(made.data_dir))
            await cleanup.start(lambda _sandbox_id: None)
            await cleanup.close()


async def test_suspend_then_wake_keeps_a_file(fleet: Fleet) -> None:
    gateway = await fleet.replica(SUSPENDING % "60s")
    await fleet.execute(gateway, "echo kept > note.txt")
    sandbox_id = await fleet.sandbox_of()
    pid = fleet.runtime_pid(sandbox_id)

    for _ in range(2):  # idempotent
        status, body = await fleet.control(gateway, "POST", f"/v1/sandboxes/{sandbox_id}/suspend?force=true")
        assert status == 200 and body["state"] == "suspended" and body["endpoint"] is None, body
    assert not running(pid, sandbox_id)  # no compute ...
    assert (fleet.data_dir / "sandboxes" / sandbox_id / "root" / "note.txt").read_text() == "kept\n"  # ... files kept
    _, listing = await fleet.control(gateway, "GET", "/v1/sandboxes")
    assert [(s["sandbox_id"], s["state"]) for s in listing["sandboxes"]] == [(sandbox_id, "suspended")]

    seen = await fleet.execute(gateway, "cat note.txt")  # the wake, held until the sandbox answers
    assert seen["stdout"] == "kept\n"
    assert await fleet.state(sandbox_id) is SandboxState.READY and running(fleet.runtime_pid(sandbox_id), sandbox_id)
    status, body = await fleet.control(gateway, "POST", f"/v1/sandboxes/{sandbox_id}/resume")
    assert status == 200 and body["state"] == "ready"  # idempotent

    shared = {"pool": "shared"}
    assert fleet.total("sgw_suspends_total", {**shared, "outcome": "suspended"}) == 1
    assert fleet.total("sgw_resumes_total", {**shared, "outcome": "ready"}) == 1
    assert fleet.total("sgw_wake_seconds_count", shared) == 1
    assert fleet.total("sgw_wake_waiting", shared) == 0


async def test_two_hundred_requests_over_three_replicas_wake_it_once(fleet: Fleet) -> None:
    replicas = [await fleet.replica(SUSPENDING % "60s") for _ in range(3)]
    for replica in replicas:  # each replica has the route cached: each must drop it at the suspend
        await fleet.execute(replica, "true")
    sandbox_id = await fleet.sandbox_of()
    status, _ = await fleet.control(replicas[1], "POST", f"/v1/sandboxes/{sandbox_id}/suspend?force=true")
    assert status == 200

    results = await asyncio.gather(*(fleet.request(replicas[i % 3], "GET", "/") for i in range(200)))
    assert [status for status, _, _ in results] == [200] * 200
    assert fleet.total("sgw_resumes_total", {"pool": "shared", "outcome": "ready"}) == 1
    assert sum(fleet.total("sgw_resumes_total", {"pool": "shared", "outcome": o})
               for o in ("provision_failed", "provision_timeout", "error", "removed", "cancelled")) == 0
    assert fleet.total("sgw_wake_waiting", {"pool": "shared"}) == 0
    assert fleet.total("sgw_wake_seconds_count", {"pool": "shared"}) >= 1
    assert await fleet.state(sandbox_id) is SandboxState.READY


async def test_a_wake_past_its_budget_gets_503_and_a_later_request_succeeds(fleet: Fleet) -> None:
    gateway = await fleet.replica(SUSPENDING % "1ms")
    await fleet.execute(gateway, "echo kept > note.txt")
    sandbox_id = await fleet.sandbox_of()
    await fleet.control(gateway, "POST", f"/v1/sandboxes/{sandbox_id}/suspend?force=true")

    status, headers, body = await fleet.request(gateway, "POST", "/execute", json={"command": "cat note.txt"})
    assert status == 503 and int(headers["Retry-After"]) >= 1, body
    assert body["error"]["code"] == "wake_timeout" and "pools.shared.wake_timeout" in body["error"]["message"]

    async def answered() -> bool:
        status, _, body = await fleet.request(gateway, "POST", "/execute", json={"command": "cat note.txt"})
        return status == 200 and body["stdout"] == "kept\n"

    await eventually(answered, what="a request after the wake went on")  # the wake went on: no stuck state
    assert fleet.total("sgw_resumes_total", {"pool": "shared", "outcome": "ready"}) == 1


async def test_an_open_exchange_on_one_replica_keeps_the_reaper_on_another_away(fleet: Fleet) -> None:
    # The case: an idle_timeout shorter than the age at which an exchange counts as a stream.
    deleting = "pools:\n  small: {idle_timeout: 100ms}\n  shared: {idle_timeout: 100ms}\n"
    timings = {"long_request_after": 0.3, "activity_grace": 2.0}
    serving = await fleet.replica(deleting, heartbeat=(0.2, 1.5), **timings)  # type: ignore[arg-type]
    reaping = await fleet.replica(deleting, reap_interval=0.1, **timings)  # type: ignore[arg-type]
    # A replica that stops heartbeating (as a dead one does) after its stream was counted.
    silent = await fleet.replica(deleting, heartbeat=(3600.0, 0.5), **timings)  # type: ignore[arg-type]

    # A plain request, in flight four times the idle timeout on `serving` while `reaping` reaps.
    seen = await fleet.execute(serving, "sleep 4; echo done")
    assert seen["stdout"] == "done\n"
    assert fleet.total("sgw_reaps_total", {"reason": "idle"}) == 0
    alice = await fleet.sandbox_of()
    assert await fleet.state(alice) is SandboxState.READY

    # A dead replica pins nothing: its heartbeat lapses and its streams stop counting.
    pending = asyncio.create_task(fleet.request(silent, "POST", "/execute", BOB, json={"command": "sleep 60"}))
    bob = await asyncio.wait_for(_sandbox_appears(fleet, "s2"), 30)

    async def reaped(sandbox_id: str) -> bool:
        return await fleet.state(sandbox_id) is None

    await eventually(lambda: reaped(bob), what="the silent replica's sandbox reaped")
    status, _, _ = await pending
    assert status == 502  # the exchange the dead replica held was cut with its sandbox
    await eventually(lambda: reaped(alice), what="the idle sandbox reaped")  # the reaper works at all


    async def both_counted() -> bool:  # a record can go (its creator saw the process exit) before the reap ends
        return fleet.total("sgw_reaps_total", {"reason": "idle"}) == 2

    await eventually(both_counted, what="both reaps counted")
    assert reaping.metrics.registry.get_sample_value("sgw_reaps_total", {"reason": "idle"}) == 2  # on the reaper


async def _sandbox_appears(fleet: Fleet, session_id: str) -> str:
    while True:
        status, body = await fleet.control(fleet.gateways[0], "GET", f"/v1/sessions/{session_id}")
        if status == 200 and body["state"] == "ready":
            return body["sandbox_id"]
        await asyncio.sleep(0.05)


# the reaper, on an injected clock ------------------------------------------------------
IDLE_SUSPEND = """
pools:
  small: {idle_timeout: 10m}
  shared: {idle_timeout: 10m, on_idle: suspend, retention: 1h}
"""


@pytest.fixture
async def local_router(tmp_path: Path, redis_server: RedisServer
                       ) -> AsyncIterator[tuple[SessionRouter, FakeClock, Path]]:
    clock = FakeClock()
    data_dir = (tmp_path / "data").absolute()
    store = RedisStore(redis_server.url, f"sus-{uuid.uuid4().hex[:8]}", "r1", clock=clock)
    local = LocalProvider(data_dir, stop_on_close=True, confinement=Bubblewrap(data_dir))
    provider = PoolProviders({"small": local, "shared": local})
    router = SessionRouter(store, provider, parse_policy(IDLE_SUSPEND, "test"), replica_id="r1", clock=clock,
                           events=Metrics())
    await provider.start(router.sandbox_lost)
    try:
        yield router, clock, data_dir
    finally:
        await provider.close()
        await store.close()


async def test_idle_suspends_instead_of_deleting_and_retention_deletes(local_router) -> None:
    router, clock, data_dir = local_router
    route = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="s1"))
    sandbox_id = route.sandbox_id
    metrics: Metrics = router.events  # type: ignore[assignment]
    box = data_dir / "sandboxes" / sandbox_id
    pid = json.loads((box / "state.json").read_text())["pid"]
    await router.flush_activity()

    clock.advance(599)
    assert await router.lifecycle.reap_once() == [] and running(pid, sandbox_id)  # not idle yet
    clock.advance(2)
    assert await router.lifecycle.reap_once() == []  # suspended, not deleted
    record = await router.store.get_sandbox(sandbox_id)
    assert record is not None and record.state is SandboxState.SUSPENDED
    assert not running(pid, sandbox_id) and (box / "root").is_dir()
    assert metrics.registry.get_sample_value("sgw_suspends_total", {"pool": "shared", "outcome": "suspended"}) == 1
    assert metrics.registry.get_sample_value("sgw_reaps_total", {"reason": "idle"}) == 0

    clock.advance(3599)
    assert await router.lifecycle.reap_once() == []  # kept for its retention, counted from the suspend
    clock.advance(2)
    assert await router.lifecycle.reap_once() == [sandbox_id]
    assert await router.store.get_sandbox(sandbox_id) is None and not box.exists()
    assert metrics.registry.get_sample_value("sgw_reaps_total", {"reason": "retention"}) == 1


# the router alone ---------------------------------------------------------------------
async def test_a_wake_is_held_up_to_wake_timeout_then_answered_503(counting_provider: CountingProvider) -> None:
    policy = parse_policy("pools:\n  small: {}\n  shared: {on_idle: suspend, wake_timeout: 50ms}\n", "test")
    router = SessionRouter(MemoryStore(), PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           policy, replica_id="r1", tuning=RouterTuning())
    alice = Identity.parse(org_id="acme", user_id="alice", session_id="s1")
    route = await router.resolve(alice)
    await router.suspend_sandbox(route.sandbox_id)
    counting_provider.gate = asyncio.Event()  # the provider takes its time to resume
    held = [asyncio.create_task(router.resolve(alice)) for _ in range(5)]
    for outcome in await asyncio.gather(*held, return_exceptions=True):
        assert isinstance(outcome, WakeTimeout) and outcome.status == 503 and outcome.headers()["Retry-After"]
    record = await router.store.get_sandbox(route.sandbox_id)
    assert record is not None and record.state is SandboxState.RESUMING  # the wake goes on
    counting_provider.gate.set()
    assert (await router.resolve(alice)).sandbox_id == route.sandbox_id
    assert counting_provider.resumed == [route.sandbox_id]  # once, for all six requests


async def test_a_foreign_caller_never_wakes_a_sandbox(counting_provider: CountingProvider) -> None:
    # A per-session sandbox: its ID hashes the session ID alone, so another caller's binding names it too.
    policy = parse_policy("pools:\n  small: {on_idle: suspend}\n  shared: {}\nrouting: {per_session_orgs: [acme]}\n",
                          "test")
    router = SessionRouter(MemoryStore(), PoolProviders({"small": counting_provider, "shared": counting_provider}),
                           policy, replica_id="r1")
    route = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="s1"))
    assert route.sandbox_id.startswith("ses-")
    await router.suspend_sandbox(route.sandbox_id)
    await router.store.delete_binding("s1")  # the binding was lost; someone else binds the same session
    with pytest.raises(NotFound):
        await router.resolve(Identity.parse(org_id="acme", user_id="mallory", session_id="s1"))
    assert counting_provider.resumed == []


def test_static_pools_cannot_suspend_said_at_check_policy_and_startup(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {}\n  shared: {provider: static, upstreams: ['http://10.0.0.1:80'], "
                      "on_idle: suspend}\n")
    with pytest.raises(PolicyError) as info:
        parse_policy(policy.read_text(), str(policy))
    assert any("pools.shared" in line and "on_idle: suspend" in line and "'static'" in line
               for line in info.value.errors), info.value.errors
    for command in (["check-policy", str(policy)],
                    ["serve", "--policy", str(policy), "--data-port", "0", "--control-port", "0", "--grpc-port", "0",
                     "--data-dir", str(tmp_path / "data")]):
        done = subprocess.run([sys.executable, "-m", "gateway.cli", *command], capture_output=True, text=True,
                              timeout=60, check=False)
        assert done.returncode in (1, 2) and "pools.shared" in done.stderr and "on_idle" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


async def test_a_static_sandbox_cannot_be_suspended_by_the_api() -> None:
    policy = parse_policy("pools:\n  small: {}\n  shared: {provider: static, upstreams: ['http://127.0.0.1:9']}\n",
                          "test")
    static = StaticProvider({"shared": ["http://127.0.0.1:9"]})
    router = SessionRouter(MemoryStore(), PoolProviders({"small": static, "shared": static}), policy, replica_id="r1")
    route = await router.resolve(Identity.parse(org_id="acme", user_id="alice", session_id="s1"))
    with pytest.raises(Conflict) as info:
        await router.suspend_sandbox(route.sandbox_id)
    assert info.value.status == 409 and "'shared'" in info.value.message
