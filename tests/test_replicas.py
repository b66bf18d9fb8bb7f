"""Several real ``sandbox-gateway serve`` replicas on one real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml

from routing import per_session_sandbox_id
from tests.gateway_process import GatewayProcess, is_runtime_of, kill_sandbox
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow


def local_sandboxes(root: Path) -> list[tuple[str, int]]:
    """(sandbox_id, pid) of every local sandbox any replica under ``root`` started."""
    found = []
    for state in root.glob("gw*/data/sandboxes/*/state.json"):
        found.append((state.parent.name, json.loads(state.read_text())["pid"]))
    return found


def kill_sandboxes(root: Path) -> None:
    """Sandboxes outlive a Redis-backed gateway by design; the test tears them down itself."""
    for _, pid in local_sandboxes(root):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


async def start_replicas(root: Path, url: str, count: int, *args: str,
                         env: dict[str, str] | None = None) -> list[GatewayProcess]:
    env = {"PER_SESSION_SANDBOX_ORG_IDS": "iso", "SANDBOX_GATEWAY_ROUTE_CACHE_TTL": "2",
           "SANDBOX_GATEWAY_DRAIN_TIMEOUT": "5", **(env or {})}
    replicas = [GatewayProcess(root / f"gw{i}", "--redis-url", url, "--data-dir", str(root / f"gw{i}" / "data"),
                               *args, env={**env, "SANDBOX_GATEWAY_REPLICA_ID": f"replica-{i}"})
                for i in range(count)]
    await asyncio.gather(*(r.start() for r in replicas))
    return replicas


@pytest.fixture
async def replicas_factory(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    started: list[GatewayProcess] = []

    async def make(url: str, count: int = 3, *args: str, env: dict[str, str] | None = None) -> list[GatewayProcess]:
        replicas = await start_replicas(tmp_path, url, count, *args, env=env)
        started.extend(replicas)
        return replicas

    yield make
    for replica in started:
        if replica.proc is not None and replica.proc.returncode is None:
            await replica.stop()
    kill_sandboxes(tmp_path)


def who(org: str, session: str, user: str = "u") -> dict[str, str]:
    return {"X-Org-Id": org, "X-User-Id": user, "X-Session-Id": session}


async def whoami(http: aiohttp.ClientSession, replica: GatewayProcess, hdrs: dict[str, str]) -> tuple[int, str | None]:
    """(status, the answering sandbox's ID), or (status, the error message)."""
    async with http.get(f"{replica.data_url}/", headers=hdrs) as response:
        body = await response.json(content_type=None)
        return response.status, body.get("sandbox_id") or body.get("error", {}).get("message")


@pytest.mark.parametrize(("org", "expected"), [
    pytest.param("iso", 50, id="per-session org: 50 sandboxes"),
    pytest.param("team", 1, id="shared org: 1 sandbox"),
])
async def test_thousand_first_requests_over_three_replicas(replicas_factory, redis_server: RedisServer, tmp_path,
                                                           org, expected):
    replicas = await replicas_factory(redis_server.url)
    sessions = [f"{org}-s{i}" for i in range(50)]
    requests = [(random.Random(i).choice(replicas), sessions[i % 50]) for i in range(1000)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        results = await asyncio.gather(*(whoami(http, r, who(org, s)) for r, s in requests))
        assert all(status == 200 for status, _ in results), {r for r in results if r[0] != 200}
        by_session: dict[str, set[str | None]] = {}
        for (_, session), (_, sandbox) in zip(requests, results, strict=True):
            by_session.setdefault(session, set()).add(sandbox)
        assert all(len(sandboxes) == 1 for sandboxes in by_session.values()), "a session saw two sandboxes"
        listing = await (await http.get(f"{replicas[0].control_url}/v1/sandboxes")).json()
    bound = sum(s["sessions"] for s in listing["sandboxes"])
    assert bound == 50 and len(listing["sandboxes"]) == expected
    created = local_sandboxes(tmp_path)  # counted at the provider, across every replica's data dir
    assert len(created) == expected and len({sid for sid, _ in created}) == expected


async def test_kill_9_one_replica_under_load(replicas_factory, redis_server: RedisServer):
    replicas = await replicas_factory(redis_server.url)
    sessions = [f"k{i}" for i in range(10)]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        before = {s: (await whoami(http, replicas[i % 3], who("team", s, user=s)))[1] for i, s in enumerate(sessions)}
        load = asyncio.gather(*(
            whoami(http, replicas[i % 2], who("team", s, user=s)) for i in range(200) for s in sessions[:2]))
        replicas[2].proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        await replicas[2].proc.wait()  # type: ignore[union-attr]
        assert all(status == 200 for status, _ in await load)
        after = {s: (await whoami(http, replicas[i % 2], who("team", s, user=s)))[1] for i, s in enumerate(sessions)}
    assert after == before  # every session, also those first bound through the dead replica, kept its sandbox


async def test_redis_restart_and_outage(replicas_factory, redis_server_factory):
    server: RedisServer = redis_server_factory(appendonly=True)
    replicas = await replicas_factory(server.url, 1, env={"SANDBOX_GATEWAY_ROUTE_CACHE_TTL": "0.5"})
    gateway = replicas[0]
    async with aiohttp.ClientSession() as http:
        status, sandbox = await whoami(http, gateway, who("team", "r1"))
        assert status == 200
        server.restart()  # persistence on: the binding survives
        binding = await http.get(f"{gateway.control_url}/v1/sessions/r1")
        assert binding.status == 200 and (await binding.json())["sandbox_id"] == sandbox

        server.stop()
        status, again = await whoami(http, gateway, who("team", "r1"))
        assert (status, again) == (200, sandbox)  # a known route keeps flowing from the cache
        async with http.get(f"{gateway.data_url}/", headers=who("team", "new-session", user="other")) as response:
            assert response.status == 503 and response.headers["Retry-After"]
            assert (await response.json())["error"]["code"] == "store_unavailable"
        async with http.get(f"{gateway.control_url}/readyz") as response:
            assert response.status == 503 and "store" in (await response.json())["problems"][0]

        server.start()
        async with asyncio.timeout(30):
            while (await http.get(f"{gateway.control_url}/readyz")).status != 200:
                await asyncio.sleep(0.2)  # polling the endpoint under test: there is no event to await
        status, _ = await whoami(http, gateway, who("team", "new-session", user="other"))
        assert status == 200


async def test_creating_replica_killed_mid_create(make_fake_kube, redis_server: RedisServer, tmp_path, aiohttp_server):
    from gateway.runtime import create_app
    from tests.test_kubernetes import POD_TEMPLATE

    pod = await aiohttp_server(create_app(tmp_path / "pod", "pod"))
    kube = await make_fake_kube("head")
    kube.controller.pause()
    pool = {"provider": "kubernetes", "kubernetes": {"namespace": "default", "api_version": "v1beta1",
                                                     "mode": "sandbox", "port": pod.port, "pod_template": POD_TEMPLATE}}
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"pools": {"small": pool, "shared": pool}, "routing": {"per_session_orgs": ["iso"]}}))
    env = {"SANDBOX_GATEWAY_KUBECONFIG": str(kube.kubeconfig_path), "SANDBOX_GATEWAY_INSTALLATION": "crash",
           "SANDBOX_GATEWAY_CREATION_LEASE": "2"}
    first, second = await start_replicas(tmp_path, redis_server.url, 2, "--policy", str(policy), env=env)
    try:
        async with aiohttp.ClientSession() as http:
            doomed = asyncio.create_task(whoami(http, first, who("iso", "crash-1")))
            sandbox = await kube.server.wait_for_object("sandboxes", "default", per_session_sandbox_id("crash-1"))
            first.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]  # mid-create: not Ready yet
            await first.proc.wait()  # type: ignore[union-attr]
            with contextlib.suppress(aiohttp.ClientError):
                await doomed
            survivor = asyncio.create_task(whoami(http, second, who("iso", "crash-1")))
            kube.controller.resume()
            status, _ = await survivor
        assert status == 200
        name = sandbox["metadata"]["name"]
        assert kube.server.create_count("sandboxes", "default", name) == 1  # taken over and adopted, not re-created
        assert [o["metadata"]["name"] for o in kube.server.list_objects("sandboxes", "default")] == [name]
    finally:
        await second.stop()
        if first.proc is not None and first.proc.returncode is None:
            await first.stop()


async def test_workers_metrics_add_up_in_every_scrape(tmp_path: Path, redis_server: RedisServer):
    """--workers 2: connections land on either worker (SO_REUSEPORT), and so do scrapes; each scrape
    must report every worker's requests (prometheus-client's multiprocess mode), not its own half."""
    process = await GatewayProcess(tmp_path / "gw", "--workers", "2", "--redis-url", redis_server.url,
                                   "--data-dir", str(tmp_path / "gw" / "data"),
                                   env={"SANDBOX_GATEWAY_DRAIN_TIMEOUT": "5"}).start()
    try:
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection, so a fresh pick, per request
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(40):
                status, _ = await whoami(http, process, who("metrics-org", "m1"))
                assert status == 200
            for _ in range(3):
                text = await (await http.get(f"{process.control_url}/metrics")).text()
                assert 'sgw_requests_total{pool="shared",protocol="http",status="2xx"} 40.0' in text, text[-2000:]
    finally:
        await process.stop()
        kill_sandboxes(tmp_path)


async def test_a_dead_sandbox_is_healed_by_a_replica_that_did_not_create_it(replicas_factory,
                                                                            redis_server: RedisServer, tmp_path):
    """Its creator is down and its process died: the survivor, which never watched that process,
    finds it unreachable, asks the provider (the shared registry: the process is gone), releases the
    dead incarnation once and re-creates it once, however many requests race for it."""
    shared = tmp_path / "shared-data"  # the replicas of one host share the local registry
    creator, survivor = await replicas_factory(redis_server.url, 2, "--data-dir", str(shared))
    registry = shared / "sandboxes"
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            status, sandbox = await whoami(http, creator, who("iso", "heal-1"))
            assert status == 200 and sandbox is not None
            first_pid = json.loads((registry / sandbox / "state.json").read_text())["pid"]
            creator.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
            await creator.proc.wait()  # type: ignore[union-attr]
            kill_sandbox(sandbox, first_pid)
            results = await asyncio.gather(*(whoami(http, survivor, who("iso", "heal-1")) for _ in range(20)))
            assert results == [(200, sandbox)] * 20
            again = await whoami(http, survivor, who("iso", "heal-1"))
            assert again == (200, sandbox)
            listing = await (await http.get(f"{survivor.control_url}/v1/sandboxes")).json()
        new_pid = json.loads((registry / sandbox / "state.json").read_text())["pid"]
        assert new_pid != first_pid
        assert [d.name for d in registry.iterdir()] == [sandbox]  # exactly one sandbox, re-created in place
        assert [(s["sandbox_id"], s["state"], s["sessions"]) for s in listing["sandboxes"]] == [(sandbox, "ready", 1)]
        runtimes = [p for p in os.listdir("/proc") if p.isdigit() and is_runtime_of(int(p), sandbox)]
        # One sandbox started: every runtime process (bubblewrap, its launcher, the runtime) is of the
        # session the new pid leads (posix_spawn with setsid): the heal ran once, not once per request.
        assert str(new_pid) in runtimes and {_session_of(int(p)) for p in runtimes} == {new_pid}
    finally:
        for state in registry.glob("*/state.json"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(json.loads(state.read_text())["pid"], signal.SIGKILL)


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except ProcessLookupError:
        return None


