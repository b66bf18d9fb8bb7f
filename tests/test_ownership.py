"""A sandbox never changes owner when its binding is lost (issue #13, item 1).

Both triggers of the adoption hole, against a real redis-server: Redis restarted
without persistence (every binding and record gone, the sandboxes still running)
and a ``session_ttl`` that lets a binding expire while its sandbox lives. In each,
another tenant who sends the same session ID is refused exactly as for a foreign
session (404, the same body, the denial counted), and the owner binding again
gets the very same sandbox back (same object or process, files intact). Run on
local pools (real runtime processes) and fake-Kubernetes pools (the fake
apiserver through the real kubernetes_asyncio client).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.api import create_control_app
from gateway.errors import NotFound
from gateway.metrics import Metrics
from gateway.model import Owner, SandboxRequest, may_claim
from gateway.providers.base import ForeignSandbox, PoolProviders, SandboxProvider
from gateway.providers.kubernetes import KubernetesProvider
from gateway.providers.local import LocalProvider
from gateway.runtime import create_app
from gateway.sessions import RouterTuning, SessionRouter
from gateway.store.redis import RedisStore
from routing import Isolation, parse_policy, per_session_sandbox_id, shared_sandbox_id
from gateway.providers.kubernetes_options import KubernetesPoolOptions
from routing.policy import PolicyError
from tests.redis_server import RedisServer
from tests.clock import T0, FakeClock
from tests.proxy_helpers import sandbox_http

POLICY_TEXT = """
pools:
  small: {idle_timeout: 1h}
  shared: {idle_timeout: 1h}
routing: {per_session_orgs: [iso, other-org]}
"""
ALICE = {"org_id": "iso", "user_id": "alice", "session_id": "S"}
EVE = {"org_id": "other-org", "user_id": "eve", "session_id": "S"}
FOREIGN_BODY = {"error": {"code": "not_found", "message": "no such session for this identity"}}
DENIED = "sandbox_owner_mismatch"


@dataclass
class Stack:
    api: Any
    router: SessionRouter
    metrics: Metrics
    clock: FakeClock
    same_sandbox: Callable[[str], Any]  # sandbox ID -> what proves it is the same one (pid, object uid)

    def denials(self, reason: str) -> float:
        return self.metrics.registry.get_sample_value("sgw_security_denials_total", {"reason": reason}) or 0.0

    async def bind(self, identity: dict[str, str]) -> tuple[int, dict[str, Any]]:
        response = await self.api.post("/v1/sessions", json=identity)
        return response.status, await response.json()


@pytest.fixture
async def runtime_port(aiohttp_server, tmp_path: Path) -> int:
    """The runtime the fake pods' IP and port reach (one, in-process)."""
    server = await aiohttp_server(create_app(tmp_path / "pod", "k8s-pod"))
    return server.port


@pytest.fixture(params=["local", "kubernetes"])
async def provider_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def redis(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory(appendonly=False)  # like the chart's embedded Redis before this fix


@pytest.fixture
async def stack(provider_kind: str, redis: RedisServer, tmp_path: Path, aiohttp_client, make_fake_kube,
                runtime_port: int) -> AsyncIterator[Stack]:
    clock = FakeClock(T0)
    store = RedisStore(redis.url, "own", "replica-a", clock=clock)
    provider: SandboxProvider
    if provider_kind == "local":
        local = LocalProvider(tmp_path / "data", stop_on_close=True)
        provider = PoolProviders({"small": local, "shared": local})

        def same_sandbox(sandbox_id: str) -> Any:
            return json.loads((tmp_path / "data" / "sandboxes" / sandbox_id / "state.json").read_text())["pid"]
    else:
        kube = await make_fake_kube()
        options = KubernetesPoolOptions(namespace="default", api_version="v1beta1", mode="sandbox",
                                        port=runtime_port,
                                        pod_template={"spec": {"containers": [{"name": "r", "image": "r"}]}})
        k8s = KubernetesProvider({"small": options, "shared": options}, "test", api_client=await kube.api_client())
        provider = PoolProviders({"small": k8s, "shared": k8s})

        def same_sandbox(sandbox_id: str) -> Any:
            obj = kube.server.get_object("sandboxes", "default", sandbox_id)
            return obj["metadata"]["uid"], obj["metadata"]["creationTimestamp"]
    metrics = Metrics()
    router = SessionRouter(store, provider, parse_policy(POLICY_TEXT, "t"), replica_id="r1", clock=clock,
                           tuning=RouterTuning(session_ttl=60.0), events=metrics)
    await provider.start(router.sandbox_lost)

    async def ready() -> list[str]:
        return []

    api = await aiohttp_client(create_control_app(router, ready, metrics))
    try:
        yield Stack(api, router, metrics, clock, same_sandbox)
    finally:
        await provider.close()
        await store.close()


async def execute(endpoint: str, command: str) -> str:
    async with sandbox_http(endpoint) as (http, base), http.post(f"{base}/execute", json={"command": command}) as r:
        assert r.status == 200
        return (await r.json())["stdout"]


async def lose_binding_by_restart(stack: Stack, redis: RedisServer) -> None:
    redis.restart()  # no AOF, no RDB: every binding and record is gone; the sandbox runs on
    with pytest.raises(NotFound):
        await stack.router.lookup("S")


async def lose_binding_by_deletion(stack: Stack, redis: RedisServer) -> None:
    """The binding goes while its sandbox lives: an earlier version's session_ttl shorter than the pool's
    idle timeout did this; today a session's binding to its own sandbox lives as long as the sandbox
    (test_a_per_session_binding_outlives_session_ttl_while_its_sandbox_lives), so it is deleted directly."""
    await stack.router.store.delete_binding("S")
    with pytest.raises(NotFound):
        await stack.router.lookup("S")
    assert (await stack.router.sandboxes()).records  # the sandbox record lives on


@pytest.mark.parametrize("lose_binding", [
    pytest.param(lose_binding_by_restart, id="redis restarted without persistence"),
    pytest.param(lose_binding_by_deletion, id="binding deleted before its sandbox"),
])
async def test_a_lost_binding_never_hands_the_sandbox_to_another_tenant(stack: Stack, redis: RedisServer,
                                                                        lose_binding: Any) -> None:
    status, alice = await stack.bind(ALICE)
    assert status == 200 and alice["sandbox_id"] == per_session_sandbox_id("S")
    await execute(alice["endpoint"], "echo alice-secret > note.txt")
    before = stack.same_sandbox(alice["sandbox_id"])
    status, body = await stack.bind(EVE)  # while alice's binding stands: the foreign-session answer
    assert (status, body) == (404, FOREIGN_BODY)

    await lose_binding(stack, redis)

    status, body = await stack.bind(EVE)
    assert (status, body) == (404, FOREIGN_BODY)  # the same answer, no hint
    assert stack.denials(DENIED) == 1
    status, again = await stack.bind(ALICE)  # eve's refused bind left no binding behind
    assert status == 200
    assert (again["sandbox_id"], again["endpoint"]) == (alice["sandbox_id"], alice["endpoint"])
    assert stack.same_sandbox(alice["sandbox_id"]) == before  # the same process / object, not a new one
    assert await execute(again["endpoint"], "cat note.txt") == "alice-secret\n"
    status, _ = await stack.bind(EVE)
    assert status == 404 and stack.denials(DENIED) == 1  # bound again: refused at the binding, as before


async def test_a_per_session_binding_outlives_session_ttl_while_its_sandbox_lives(stack: Stack) -> None:
    status, alice = await stack.bind(ALICE)
    assert status == 200
    stack.clock.advance(120)  # past session_ttl (60 s), well inside the pool's idle_timeout (1 h)
    await stack.router.lifecycle.reap_once()
    assert (await stack.router.lookup("S")).sandbox_id == alice["sandbox_id"]


# what an ownerless sandbox (made by an older version) may be claimed by -------------------
ALICE_OWNER, EVE_OWNER = Owner("iso", "alice", None), Owner("other-org", "eve", None)
SES = per_session_sandbox_id("S")
SHARED = shared_sandbox_id("iso", "alice", None)


@pytest.mark.parametrize(("sandbox_id", "recorded", "claimant", "bound_at", "allowed"), [
    pytest.param(SES, ALICE_OWNER, ALICE_OWNER, T0 + 99, True, id="recorded owner claims, however late bound"),
    pytest.param(SES, ALICE_OWNER, EVE_OWNER, T0 - 1, False, id="another identity never claims"),
    pytest.param(SES, ALICE_OWNER, Owner("iso", "alice", "bot"), T0, False, id="same user, another bot: refused"),
    pytest.param(SES, None, ALICE_OWNER, T0 - 1, True, id="ownerless: the binding predates it"),
    pytest.param(SES, None, EVE_OWNER, T0 + 1, False, id="ownerless: a later binding proves nothing"),
    pytest.param(SHARED, None, ALICE_OWNER, T0 + 1, True, id="ownerless shared: the ID proves its owner"),
    pytest.param(SHARED, None, EVE_OWNER, T0 + 1, False, id="ownerless shared: another identity's ID"),
])
def test_may_claim(sandbox_id: str, recorded: Owner | None, claimant: Owner, bound_at: float, allowed: bool) -> None:
    assert may_claim(sandbox_id, recorded, T0, claimant, bound_at) is allowed


def _request(owner: Owner, bound_at: float = float("inf")) -> SandboxRequest:
    return SandboxRequest(SES, "small", Isolation.PER_SESSION, owner, "S", 30.0, bound_at=bound_at)


async def test_local_registry_entries_keep_their_owner(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path, stop_on_close=True)
    await provider.start(lambda _sandbox_id: None)
    try:
        endpoint = await provider.ensure(_request(ALICE_OWNER))
        state_file = tmp_path / "sandboxes" / SES / "state.json"
        state = json.loads(state_file.read_text())
        assert state["owner"] == ["iso", "alice", None]
        with pytest.raises(ForeignSandbox):
            await provider.ensure(_request(EVE_OWNER))
        assert await provider.ensure(_request(ALICE_OWNER)) == endpoint
        del state["owner"]  # as an older version wrote it
        state_file.write_text(json.dumps(state))
        with pytest.raises(ForeignSandbox):  # a binding made after it proves nothing
            await provider.ensure(_request(ALICE_OWNER, bound_at=state["created_at"] + 1))
        assert await provider.ensure(_request(ALICE_OWNER, bound_at=state["created_at"] - 1)) == endpoint
        assert json.loads(state_file.read_text())["pid"] == state["pid"]  # adopted, never restarted
    finally:
        await provider.close()


async def test_kubernetes_adopts_only_its_owners_object(make_fake_kube, runtime_port: int) -> None:
    kube = await make_fake_kube()
    options = KubernetesPoolOptions(namespace="default", api_version="v1beta1", mode="sandbox", port=runtime_port,
                                    pod_template={"spec": {"containers": [{"name": "r", "image": "r"}]}})
    provider = KubernetesProvider({"small": options}, "test", api_client=await kube.api_client())
    await provider.start(lambda _sandbox_id: None)
    try:
        endpoint = await provider.ensure(_request(ALICE_OWNER))
        annotations = kube.server.get_object("sandboxes", "default", SES)["metadata"]["annotations"]
        assert (annotations["sandbox-gateway.io/org-id"], annotations["sandbox-gateway.io/user-id"]) == ("iso", "alice")
        with pytest.raises(ForeignSandbox):
            await provider.ensure(_request(EVE_OWNER))
        assert await provider.ensure(_request(ALICE_OWNER)) == endpoint
        assert kube.server.get_object("sandboxes", "default", SES) is not None  # refusing deletes nothing
    finally:
        await provider.close()


# settings that let bindings expire before their sandboxes ---------------------------------
@pytest.mark.parametrize(("session_ttl", "refused"), [
    pytest.param(5.0, ["pools.small.idle_timeout", "pools.shared.idle_timeout"], id="both pools outlive it"),
    pytest.param(1800.0, ["pools.small.idle_timeout"], id="one pool outlives it"),
    pytest.param(3600.0, [], id="equal is enough"),
])
def test_session_ttl_must_outlive_idle_sandboxes(session_ttl: float, refused: list[str]) -> None:
    policy = parse_policy("pools:\n  small: {idle_timeout: 1h}\n  shared: {idle_timeout: 30m}\n", "p.yaml")
    if not refused:
        policy.check_session_ttl(session_ttl, "session_ttl")
        return
    with pytest.raises(PolicyError) as raised:
        policy.check_session_ttl(session_ttl, "session_ttl")
    assert [e.split(": ")[1] for e in raised.value.errors] == refused
    assert all(e.startswith("p.yaml: ") and "session_ttl" in e for e in raised.value.errors)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_check_policy_and_serve_refuse_a_session_ttl_below_idle_timeout(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("pools:\n  small: {idle_timeout: 1h}\n  shared: {idle_timeout: 10m}\n")
    short = {"SANDBOX_GATEWAY_SESSION_TTL": "1200"}
    checked = _cli("check-policy", str(policy), env=short)
    assert checked.returncode == 1
    assert checked.stderr.splitlines()[0].startswith(f"{policy}: pools.small.idle_timeout: 3600s is longer than "
                                                     "session_ttl (SANDBOX_GATEWAY_SESSION_TTL) (1200s)")
    assert "pools.shared" not in checked.stderr
    assert _cli("check-policy", "--session-ttl", "1h", str(policy), env=short).returncode == 0
    served = _cli("serve", "--policy", str(policy), "--data-port", "0", "--control-port", "0", "--grpc-port", "0",
                  "--data-dir", str(tmp_path / "data"), env=short)
    assert served.returncode == 2 and "pools.small.idle_timeout" in served.stderr and "Traceback" not in served.stderr
