"""Lifecycle under stress on the chaos cluster (issue #27): 3 ``serve`` replicas on one Redis, local
sandboxes in one shared registry. A first-use burst and a wake storm answer every request 200; a
replica killed mid-wake costs seconds, not the whole lease; an operator's suspend lets a running
request finish.

Kept short (CI runs the suite both ways): one cluster, with the default creation lease (10 s), so
the takeover of the dead replica's wake takes about that.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.chaos.cluster import LOCAL_ISOLATED, Cluster, Replica, start_cluster
from tests.redis_server import redis_server_path

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.timeout(240)]

BURST = 1000
WAKE_SANDBOXES = 100
WAKE_REQUESTS_EACH = 10
# The default creation_lease. A hundred local runtimes starting at once on two cores starve the three
# replicas' event loops for seconds, and a lease renewed that late lapses: the wake is taken over (the
# work done twice), but the late waker's ready is refused (counted lease_lost) and each sandbox is
# resumed, and runs, once (146 resumes for 100 at a 6 s lease and 104 at 10 s before that fence).
CREATION_LEASE = 10.0


def headers(session: str, user: str = "u") -> dict[str, str]:
    return {"X-Org-Id": LOCAL_ISOLATED, "X-User-Id": user, "X-Session-Id": session}


async def _cluster(root: Path, **env: str) -> AsyncIterator[Cluster]:
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    # A hundred runtimes resumed at once on two cores may take longer than the suite's 8 s to answer
    # their first request: a slow machine, not a lifecycle error (no stalling pool is used here).
    # The wake storm runs 100 sandboxes at once: above the local cap a small host derives (memory / 256 MiB).
    cluster = await start_cluster(root, extra_env={"SANDBOX_GATEWAY_UPSTREAM_READ_TIMEOUT": "60",
                                                   "SANDBOX_GATEWAY_LOCAL_MAX_SANDBOXES": "400", **env})
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    async for made in _cluster(tmp_path_factory.mktemp("life"), SANDBOX_GATEWAY_CREATION_LEASE=str(CREATION_LEASE)):
        yield made


async def get(cluster: Cluster, replica: Replica, session: str, path: str = "/") -> tuple[int, Any]:
    assert cluster.http is not None
    async with cluster.http.get(f"{replica.process.data_url}{path}", headers=headers(session),
                                timeout=aiohttp.ClientTimeout(total=120)) as response:
        return response.status, await response.json(content_type=None)


async def control(cluster: Cluster, replica: Replica, method: str, path: str) -> tuple[int, Any]:
    assert cluster.http is not None
    async with cluster.http.request(method, f"{replica.process.control_url}{path}",
                                    timeout=aiohttp.ClientTimeout(total=120)) as response:
        return response.status, await response.json(content_type=None)


async def resumes(cluster: Cluster, outcome: str = "ready") -> float:
    """sgw_resumes_total{outcome=...} summed over the live replicas."""
    assert cluster.http is not None
    total = 0.0
    for replica in cluster.live():
        async with cluster.http.get(f"{replica.process.control_url}/metrics") as response:
            for line in (await response.text()).splitlines():
                if line.startswith("sgw_resumes_total{") and f'outcome="{outcome}"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def runtimes(sandbox_ids: set[str]) -> collections.Counter[str]:
    """How many runtimes run for each of ``sandbox_ids``: a runtime is its own session (the local
    provider starts it with setsid), whatever it runs inside, so one session per sandbox."""
    sessions: dict[str, set[int]] = collections.defaultdict(set)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            session = os.getsid(int(proc.name))
        except OSError:
            continue
        for sandbox_id in sandbox_ids:
            if sandbox_id in cmdline:
                sessions[sandbox_id].add(session)
    return collections.Counter({sandbox_id: len(found) for sandbox_id, found in sessions.items()})


def failures(results: list[tuple[int, Any]]) -> collections.Counter[str]:
    """The answers that were not 200, by status, code and message (for the assertion's report)."""
    def named(status: int, body: Any) -> str:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        return f"{status} {error.get('code')}: {str(error.get('message', body))[:160]}"

    return collections.Counter(named(status, body) for status, body in results if status != 200)


async def test_lifecycle_under_stress(cluster: Cluster) -> None:
    """In one cluster (each costs seconds to start): the burst, the storm, the operator's suspend,
    and last the replica killed mid-wake (it leaves two replicas)."""
    replicas = cluster.live()
    ring = itertools.cycle(replicas)

    # 1,000 concurrent first requests for one new session, round-robin over 3 replicas: one sandbox, no 502.
    results = await asyncio.gather(*(get(cluster, next(ring), "burst") for _ in range(BURST)))
    assert not failures(results), failures(results)
    assert len({body["sandbox_id"] for _, body in results}) == 1

    # A wake storm: 100 suspended sandboxes x 10 requests over 3 replicas: no error, exactly 100 resumes.
    sessions = [f"storm-{i}" for i in range(WAKE_SANDBOXES)]
    limit = asyncio.Semaphore(16)

    async def limited(call: Any) -> Any:
        async with limit:
            return await call

    made = await asyncio.gather(*(limited(get(cluster, next(ring), s)) for s in sessions))
    # Setting the storm up is not the case under test: a creation the local provider failed is asked
    # once more (seen once under heavy load: "could not be prepared: [Errno 9] Bad file descriptor").
    made = [(status, body) if status == 200 else await get(cluster, next(ring), s)
            for s, (status, body) in zip(sessions, made, strict=True)]
    assert not failures(made), failures(made)
    sandbox_of = {s: body["sandbox_id"] for s, (_, body) in zip(sessions, made, strict=True)}
    suspended = await asyncio.gather(*(limited(control(cluster, next(ring), "POST",
                                                       f"/v1/sandboxes/{sandbox_of[s]}/suspend?force=true"))
                                       for s in sessions))
    assert {(status, body.get("state")) for status, body in suspended} == {(200, "suspended")}, suspended
    before = await resumes(cluster)
    storm = [(s, next(ring)) for s in sessions for _ in range(WAKE_REQUESTS_EACH)]
    woken = await asyncio.gather(*(get(cluster, replica, s) for s, replica in storm))
    assert not failures(woken), failures(woken)
    assert all(body["sandbox_id"] == sandbox_of[s] for (s, _), (_, body) in zip(storm, woken, strict=True))
    lost = await resumes(cluster, "lease_lost")
    print(f"wake storm: {await resumes(cluster) - before:g} resumes ready, {lost:g} lease_lost")
    assert await resumes(cluster) - before == WAKE_SANDBOXES
    per_sandbox = runtimes(set(sandbox_of.values()))
    assert set(per_sandbox.values()) == {1} and len(per_sandbox) == WAKE_SANDBOXES, per_sandbox

    # An operator's suspend during a request: the request completes; the suspend waits (here: a grace
    # of one second) and answers 409 naming what is open, instead of cutting it.
    sandbox_id = sandbox_of[sessions[0]]
    assert cluster.http is not None
    running = asyncio.create_task(cluster.http.post(
        f"{replicas[0].process.data_url}/execute", headers=headers(sessions[0]), json={"command": "sleep 3; echo done"},
        timeout=aiohttp.ClientTimeout(total=60)))
    await asyncio.sleep(0.5)  # the command is running (it has no event to offer)
    status, body = await control(cluster, replicas[1], "POST", f"/v1/sandboxes/{sandbox_id}/suspend?grace=1")
    assert status == 409 and "open exchanges" in body["error"]["message"], body
    async with await running as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["stdout"].strip() == "done"
    status, body = await control(cluster, replicas[2], "POST", f"/v1/sandboxes/{sandbox_id}/suspend?force=true")
    assert (status, body["state"]) == (200, "suspended")

    await replica_killed_mid_wake(cluster)


async def replica_killed_mid_wake(cluster: Cluster) -> None:
    """Killed a moment into a wake, a replica held the sandbox for the whole 180 s creation lease.
    Its lease is short and renewed only while it lives: another replica takes the wake over."""
    doomed, survivor, _ = cluster.live()
    status, body = await get(cluster, survivor, "midwake")
    assert status == 200
    sandbox_id = body["sandbox_id"]
    status, _ = await control(cluster, survivor, "POST", f"/v1/sandboxes/{sandbox_id}/suspend?force=true")
    assert status == 200
    waking = asyncio.create_task(get(cluster, doomed, "midwake"))
    deadline = time.monotonic() + 30
    while True:  # until the doomed replica holds the wake (the store's state is the only signal)
        status, page = await control(cluster, survivor, "GET", "/v1/sandboxes?state=resuming&pool=small")
        if any(s["sandbox_id"] == sandbox_id for s in page["sandboxes"]):
            break
        assert time.monotonic() < deadline and not waking.done(), "the wake never began"
        await asyncio.sleep(0.01)
    await cluster.kill_replica(doomed)
    with pytest.raises(aiohttp.ClientError):
        await waking
    started = time.monotonic()
    status, body = await get(cluster, survivor, "midwake")
    elapsed = time.monotonic() - started
    assert status == 200 and body["sandbox_id"] == sandbox_id, body
    assert elapsed < CREATION_LEASE + 10, f"served {elapsed:.1f}s after the kill"
